// What an op's outputs look like, computed without computing data.
//
// The plan comes from the op's Meta kernel run on meta copies of the
// arguments, and is cached by the arguments' signature (sizes, strides,
// dtypes, scalar values): in 2.13 many Meta kernels are Python and cost tens
// to hundreds of µs, while a cache hit costs well under one.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torchneuron::aten {

// Geometry of one tensor.
struct Geometry {
  c10::ScalarType dtype;
  c10::SmallVector<int64_t, 6> sizes, strides;
  int64_t offset = 0;
  bool same_as(const at::Tensor& t) const;
};

struct OutputSpec {
  enum Kind : uint8_t { kNew, kArgument, kView, kUndefined };
  Kind kind;
  int arg = -1;  // flat index of the argument tensor aliased (kArgument, kView)
  Geometry geometry;
};

struct OutputPlan {
  // The op must run synchronously (data-dependent output shapes, outputs
  // that are not tensors, or no Meta kernel).
  bool synchronous = false;
  // Whether a call with this signature has run without error. Until one has,
  // each call runs to completion before the launch returns, so argument
  // errors the CPU kernel raises surface at the call; it also checks output
  // shapes and out= layouts against the plan: where the CPU kernel disagrees
  // (a Meta kernel that is wrong for it), that call and every later one with
  // this signature take the synchronous path, which uses what the CPU kernel
  // produced. A signature whose kernel warned waits at its next call too, so
  // warnings are raised at the call.
  mutable std::atomic<bool> checked{false}, cpu_disagrees{false}, warns{false};
  // One entry per schema return; a Tensor[] return has several specs.
  std::vector<std::vector<OutputSpec>> returns;
  // Written arguments whose geometry the op changes (out= resizing).
  std::vector<std::pair<int, Geometry>> resized_args;
  // For each return, the position of each of its tensors among the new
  // outputs, or -1 for outputs that are not new.
  std::vector<std::vector<int>> new_index;
  bool views_only = false;  // metadata-only op: nothing to launch
  bool has_new_outputs = false;
  bool has_undefined_outputs = false;  // e.g. convolution_backward with a partial output_mask
};

// Visits every tensor of an argument list in order; the position in this
// order is the "flat index" used by OutputSpec::arg.
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) f(e.toTensor());
  }
}

// Plans of one op, by argument signature. Hits allocate nothing.
class PlanCache {
 public:
  // Returns the plan for `op` on `args`, computing and caching it on a miss.
  // `scalar_values_matter` false: the op's output geometry cannot depend on
  // its int and floating-point scalars, so plans are shared across their
  // values (an optimizer's per-step scalars would otherwise miss every step).
  std::shared_ptr<const OutputPlan> get(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                        bool scalar_values_matter = true);

 private:
  struct Entry {
    std::vector<int64_t> key;
    std::shared_ptr<const OutputPlan> plan;
  };
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Entry>> entries_;  // by key hash
  size_t size_ = 0;
};

}  // namespace torchneuron::aten
