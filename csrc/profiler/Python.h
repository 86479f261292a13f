// Python face of the profiler recorder (torchneuron._C._profiler_*).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torchneuron::profiler {

void bind(pybind11::module& m);

}  // namespace torchneuron::profiler
