// Python face of the neuron c10d backend (torchneuron._C._ProcessGroupNeuron).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torchneuron::distributed {

void bind(pybind11::module& m);

}  // namespace torchneuron::distributed
