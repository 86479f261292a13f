// torchneuron._C's adaptive-eager functions (torchneuron.adaptive).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torchneuron::adaptive {
void bind(pybind11::module& m);
}  // namespace torchneuron::adaptive
