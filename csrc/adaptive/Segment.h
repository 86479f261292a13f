// Adaptive eager: a segment is the run of eager ops a stream holds back.
//
// In adaptive mode the launcher plans and allocates an op's outputs as in
// eager, then appends the op here instead of enqueuing its task. The segment
// records, besides each op's ready-made eager task, how the op's tensors
// relate to the segment's other tensors (external input, result of an earlier
// op, view of either) and a structural signature of the whole run, so that a
// recurring segment can be recognised and replaced by one compiled program.
//
// The segment holds its inputs strongly (they must exist when it runs) but
// the results of its ops only weakly: a result the program no longer
// references when the segment flushes is an intermediate the compiled
// program need not write back.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../runtime/Stream.h"

namespace torchneuron::adaptive {

// How an op reaches one of its tensor arguments.
struct TensorRef {
  enum Kind : uint8_t { kUndefined, kInput, kValue } kind = kUndefined;
  int32_t index = -1;  // into Segment::inputs or Segment::values
  // Set when the argument is laid out differently from the input or value
  // it views (an as_strided of it); only then is the layout below filled.
  bool is_view = false;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;
};

// One schema argument: a constant, a tensor, a list of tensors, or the
// per-tensor scalars of a _foreach_ op, which an optimizer changes every step
// (bias corrections; a weight-decay factor that follows a learning-rate
// schedule): those are lifted out of the signature and reach the program as a
// tensor (Segment::lifted[lifted]).
struct ArgRecord {
  enum Kind : uint8_t { kConstant, kTensor, kTensorList, kOptionalTensorList, kLifted } kind = kConstant;
  c10::IValue constant;
  int32_t lifted = -1;
  c10::SmallVector<TensorRef, 1> tensors;
  std::vector<bool> none;  // kOptionalTensorList: entries that were None
};

struct RecordedOp {
  const c10::OperatorHandle* op;
  std::string_view name;  // outlives the segment (the launcher's op names)
  std::vector<ArgRecord> args;
  // Per schema return, per tensor in it: the value it created, or -1 (an
  // argument returned as it is, a view, an undefined tensor).
  std::vector<c10::SmallVector<int32_t, 1>> returns;
  runtime::Stream::Task eager_task;
  std::shared_ptr<runtime::TaskRecord> record;  // profiling, else null
};

// A tensor the segment's ops created.
struct Value {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  c10::ScalarType dtype;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;
};

struct Segment {
  std::vector<RecordedOp> ops;
  std::vector<at::Tensor> inputs;  // one per device storage read from outside the segment
  std::vector<at::Tensor> lifted;  // CPU tensors of lifted scalars
  std::vector<Value> values;
  std::unordered_map<const c10::StorageImpl*, TensorRef> by_storage;  // kind and index only
  // Structural signature (op identities, geometry, constants, references);
  // the live mask of values is appended at flush.
  std::vector<int64_t> signature;
  // Why the segment can only run op by op ("" if it can be compiled).
  std::string_view unsupported;
  c10::DeviceIndex device = 0;

  bool empty() const { return ops.empty(); }
  // Appends one op whose outputs the launcher has allocated: `returns` are the
  // values it returned (the top of its stack).
  void append(const c10::OperatorHandle& op, std::string_view name, c10::ArrayRef<c10::IValue> args,
              c10::ArrayRef<c10::IValue> returns, runtime::Stream::Task eager_task,
              std::shared_ptr<runtime::TaskRecord> record);
  // Which values some tensor still references.
  std::vector<bool> live_values() const;

 private:
  TensorRef reference(const at::Tensor& t);
  // The scalars of a _foreach_ op's last positional argument, a Scalar[] or
  // a float (one scalar for every tensor), lifted; false if they must stay
  // constants.
  bool lift(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, size_t index, ArgRecord& arg);
  void sign(const TensorRef& ref);
  void sign(const c10::IValue& constant);
};

}  // namespace torchneuron::adaptive
