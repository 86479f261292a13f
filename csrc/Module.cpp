// torchneuron._C: the Python face of the runtime and the glue.
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "adaptive/Python.h"
#include "aten/CompiledKernel.h"
#include "aten/HostTask.h"
#include "aten/OpTracking.h"
#include "backend/Allocator.h"
#include "backend/Current.h"
#include "backend/Generator.h"
#include "backend/SyncTrace.h"
#include "distributed/Python.h"
#include "profiler/Python.h"
#include "runtime/Runtime.h"

namespace py = pybind11;
using namespace torchneuron;

namespace {

py::dict platform_dict(const runtime::Platform& p) {
  py::dict d;
  d["target"] = p.target;
  d["core_name"] = p.core_name;
  d["cores_per_chip"] = p.cores_per_chip;
  d["hbm_per_chip_bytes"] = p.hbm_per_chip_bytes;
  d["hbm_per_core_bytes"] = p.hbm_per_core_bytes();
  d["hbm_bandwidth_tbps"] = p.hbm_bandwidth_tbps;
  d["core_bf16_tflops"] = p.core_bf16_tflops;
  d["chip_bf16_tflops"] = p.chip_bf16_tflops;
  d["chip_fp8_tflops"] = p.chip_fp8_tflops;
  d["partitions"] = p.partitions;
  d["sbuf_partition_bytes"] = p.sbuf_partition_bytes;
  d["psum_partition_bytes"] = p.psum_partition_bytes;
  d["psum_banks"] = p.psum_banks;
  d["pmax"] = p.pmax;
  d["matmul_stationary_fmax"] = p.matmul_stationary_fmax;
  d["matmul_moving_fmax"] = p.matmul_moving_fmax;
  d["psum_bank_fp32"] = p.psum_bank_fp32;
  d["vector_tflops"] = p.vector_tflops;
  d["scalar_tflops"] = p.scalar_tflops;
  d["tensor_clock_ghz"] = p.tensor_clock_ghz;
  d["vector_clock_ghz"] = p.vector_clock_ghz;
  d["scalar_clock_ghz"] = p.scalar_clock_ghz;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchneuron native extension: emulated NeuronCore runtime and PyTorch glue";

  // configuration and platform
  m.def("_config", [] {
    const auto& c = runtime::config();
    py::dict d;
    d["visible_cores"] = c.visible_cores;
    d["platform_target"] = c.platform_target;
    d["device_memory_bytes"] = c.device_memory_bytes;
    d["launch_blocking"] = c.launch_blocking;
    d["compile_strict"] = c.compile_strict;
    d["nki_batch"] = c.nki_batch;
    d["worker_threads"] = c.worker_threads;
    d["log_level"] = c.log_level;
    d["error"] = c.error;
    return d;
  });
  m.def("_platform", [] { return platform_dict(runtime::platform()); });
  m.def("_platform_by_name", [](const std::string& name) { return platform_dict(runtime::platform_by_name(name)); });

  // devices
  m.def("_device_count", [] { return int(backend::device_count()); });
  m.def("_init", [] { backend::lazy_init(); });
  m.def("_is_initialized", &backend::is_initialized);
  m.def("_is_in_bad_fork", &backend::is_in_bad_fork);
  m.def("_current_device", [] { return int(backend::current_device()); });
  m.def("_set_device", [](int d) { backend::set_current_device(c10::DeviceIndex(d)); });
  m.def("_physical_core", [](int d) {
    backend::check_device_index(c10::DeviceIndex(d));
    return runtime::physical_core(d);
  });
  m.def("_device_capacity", [](int d) {
    backend::check_device_index(c10::DeviceIndex(d));
    return runtime::device_capacity(d);
  });
  // The stream sanitizer's observer of stream orderings (None: no observer).
  m.def("_set_sync_observer", [](py::object observer) {
    static py::object* held = new py::object();  // leaked: observers may fire during interpreter exit
    backend::g_sync_observer.store(nullptr);
    *held = observer;
    if (observer.is_none()) return;
    backend::g_sync_observer.store([](backend::SyncKind kind, uintptr_t event, c10::Stream stream) {
      if (!Py_IsInitialized()) return;
      py::gil_scoped_acquire gil;
      try {
        (*held)(int(kind), event, int(stream.device_index()), int(stream.id()));
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("torchneuron stream sanitizer observer");
      }
    });
  });
  m.def("_synchronize", [](int d) {
    py::gil_scoped_release no_gil;
    backend::synchronize_device(c10::DeviceIndex(d));
  });

  // streams: (stream_id, device_index, device_type), as torch.Stream packs them
  m.def("_current_stream", [](int d) {
    auto s = backend::current_stream(c10::DeviceIndex(d));
    return py::make_tuple(s.id(), int(s.device_index()), int(s.device_type()));
  });
  m.def("_default_stream", [](int d) {
    auto s = backend::default_stream(c10::DeviceIndex(d));
    return py::make_tuple(s.id(), int(s.device_index()), int(s.device_type()));
  });
  m.def("_set_stream", [](int64_t id, int d) {
    backend::set_current_stream(c10::Stream(c10::Stream::UNSAFE, c10::Device(backend::kNeuron, c10::DeviceIndex(d)), id));
  });

  m.def("_stream_priority", [](int64_t id) { return id > runtime::kPoolSize ? -1 : 0; });

  // generators
  m.def("_default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(backend::default_generator(c10::DeviceIndex(d))));
  });

  // allocator
  m.def("_empty_cache", [] {
    py::gil_scoped_release no_gil;  // it waits for the device, whose tasks may need the GIL
    backend::caching_allocator().emptyCache();
  });
  m.def("_mem_get_info", [](int d) { return backend::caching_allocator().getMemoryInfo(c10::DeviceIndex(d)); });

  // compiled kernels
  m.def("_compiled_kernel_launcher", &aten::compiled_kernel_launcher);

  // host code as a device task (NKI kernels): fn(views) runs on the stream's
  // worker with the GIL, so callers must not wait for the device holding it.
  m.def("_enqueue_host_task", [](const std::string& name, const std::vector<at::Tensor>& tensors, py::function fn) {
    // The worker may drop the last reference: do it under the GIL, unless the interpreter is
    // finalizing (acquiring the GIL then ends the thread), in which case the function leaks.
    std::shared_ptr<py::function> held(new py::function(std::move(fn)), [](py::function* f) {
      if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
      py::gil_scoped_acquire gil;
      delete f;
    });
    py::gil_scoped_release no_gil;
    return aten::enqueue_host_task(name, tensors, [held](const std::vector<at::Tensor>& views) {
      if (!Py_IsInitialized() || _Py_IsFinalizing())
        throw std::runtime_error("the Python interpreter is shutting down; the kernel did not run");
      py::gil_scoped_acquire gil;
      try {
        (*held)(views);
      } catch (py::error_already_set& e) {
        throw std::runtime_error(e.what());
      }
    });
  });

  // op tracking
  m.def("_executed_ops", &aten::executed_ops);
  m.def("_fallback_ops", &aten::fallback_ops);
  // An op that ran on the host from Python (the sparse layouts' round trip).
  m.def("_count_host_round_trip", [](const std::string& op_name) {
    auto& counters = aten::op_counters(op_name);
    counters.executed.fetch_add(1, std::memory_order_relaxed);
    counters.fallback.fetch_add(1, std::memory_order_relaxed);
  });
  m.def("_clear_op_tracking", &aten::clear_op_tracking);

  // the neuron c10d backend
  distributed::bind(m);
  profiler::bind(m);
  adaptive::bind(m);
}
