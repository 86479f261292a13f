// What an ATen op's task reads, writes and computes, for the profiler:
// bytes from the tensor arguments and results, FLOPs for the matmul-like ops
// (the ones whose arithmetic dominates a model).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string_view>
#include <vector>

#include "Recorder.h"

namespace torchneuron::profiler {

// `written[i]`: the op writes argument i (in-place or out=).
TaskFacts op_cost(std::string_view op, c10::ArrayRef<c10::IValue> args, const std::vector<bool>& written,
                  c10::ArrayRef<at::Tensor> new_outputs);

}  // namespace torchneuron::profiler
