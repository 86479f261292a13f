#include "Python.h"

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "ProcessGroupNeuron.h"

namespace py = pybind11;

namespace torchneuron::distributed {

void bind(py::module& m) {
  // The base class is torch's c10d Backend, so process groups accept it.
  py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(m, "_ProcessGroupNeuron")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const c10::intrusive_ptr<c10d::Backend>& gloo,
                       const c10::intrusive_ptr<c10d::Backend>& gloo_cpu) {
             return c10::make_intrusive<ProcessGroupNeuron>(store, rank, size, timeout, gloo, gloo_cpu);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("gloo"),
           py::arg("gloo_cpu"));
}

}  // namespace torchneuron::distributed
