// Adaptive eager: a segment is the run of eager ops a stream holds back.
//
// In adaptive mode the launcher plans and allocates an op's outputs as in
// eager, then appends the op here instead of enqueuing its task. The segment
// records, besides each op's ready-made eager task, how the op's tensors
// relate to the segment's other tensors (external input, result of an earlier
// op, view of either) and a structural signature of the whole run, so that a
// recurring segment can be recognised and replaced by one compiled program.
//
// The segment holds its inputs strongly (they must exist when it runs), as
// aliases taken when the op was recorded (the user's tensor object may be
// restrided or given other storage, `t_()`, `.data =`, before the flush), but
// the results of its ops only weakly: a result the program no longer
// references when the segment flushes is an intermediate the compiled
// program need not write back.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <memory>
#include <string_view>
#include <vector>

#include "../runtime/Stream.h"

namespace torchneuron::adaptive {

// A tensor's layout over its storage.
struct Layout {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;

  static Layout of(const at::Tensor& t);
  bool matches(const at::Tensor& t) const;
};

// A run of entries of one of the segment's flat tables: a segment records
// each op into tables shared by all its ops, so that recording an op
// allocates nothing once the tables have grown to a segment's size (a
// flushed segment's tables are cleared and reused by the next).
struct Span {
  int32_t first = 0, count = 0;
};

// How an op reaches one of its tensor arguments (kUndefined: an undefined
// tensor, or None in a Tensor?[]).
struct TensorRef {
  enum Kind : uint8_t { kUndefined, kInput, kValue } kind = kUndefined;
  int32_t index = -1;  // into Segment::inputs or Segment::values
  // Into Segment::views when the argument is laid out differently from the
  // input or value it views (an as_strided of it), else -1.
  int32_t view = -1;
};

// One schema argument: a constant, a tensor, a list of tensors, or the
// per-tensor scalars of a _foreach_ op, which an optimizer changes every step
// (bias corrections; a weight-decay factor that follows a learning-rate
// schedule): those are lifted out of the signature and reach the program as a
// tensor (Segment::lifted[lifted]).
struct ArgRecord {
  enum Kind : uint8_t { kConstant, kTensor, kTensorList, kLifted } kind = kConstant;
  c10::IValue constant;
  int32_t lifted = -1;
  Span tensors;  // into Segment::refs
};

struct RecordedOp {
  const c10::OperatorHandle* op;
  std::string_view name;  // outlives the segment (the launcher's op names)
  Span args;     // into Segment::args, one per schema argument
  // Into Segment::results, one per schema return, each the span of
  // Segment::created holding, per tensor in it, the value it created or -1
  // (an argument returned as it is, a view, an undefined tensor).
  Span results;
  runtime::Stream::Task eager_task;
  std::shared_ptr<runtime::TaskRecord> record;  // profiling, else null
};

// A tensor the segment's ops created.
struct Value {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  Layout layout;
};

struct Segment {
  std::vector<RecordedOp> ops;
  std::vector<ArgRecord> args;
  std::vector<TensorRef> refs;
  std::vector<Span> results;
  std::vector<int32_t> created;
  std::vector<at::Tensor> inputs;  // aliases, one per device storage read from outside the segment
  std::vector<at::Tensor> lifted;  // CPU tensors of lifted scalars
  std::vector<Value> values;
  std::vector<Layout> views;
  ska::flat_hash_map<const c10::StorageImpl*, TensorRef> by_storage;  // kind and index only
  // Structural signature (op identities, geometry, constants, references);
  // the live mask of values is appended at flush.
  std::vector<int64_t> signature;
  // Why the segment can only run op by op ("" if it can be compiled).
  std::string_view unsupported;
  c10::DeviceIndex device = 0;

  bool empty() const { return ops.empty(); }
  // Forgets every op, keeping the tables' capacity.
  void clear();
  template <typename T>
  static c10::ArrayRef<T> slice(const std::vector<T>& table, Span span) {
    return c10::ArrayRef<T>(table.data() + span.first, size_t(span.count));
  }
  // Appends one op whose outputs the launcher has allocated: `returns` are the
  // values it returned (the top of its stack).
  void append(const c10::OperatorHandle& op, std::string_view name, c10::ArrayRef<c10::IValue> args,
              c10::ArrayRef<c10::IValue> returns, runtime::Stream::Task eager_task,
              std::shared_ptr<runtime::TaskRecord> record);
  // The storages of the values some tensor still references, null for the
  // others: strong references, so that a value alive here stays alive until
  // the segment has run (Python, and its garbage collector, runs in between).
  std::vector<c10::Storage> live_values() const;

 private:
  TensorRef reference(const at::Tensor& t);
  // The scalars of a _foreach_ op's last positional argument, a Scalar[] or
  // a float (one scalar for every tensor), or the float alpha of
  // _foreach_add/_sub, lifted; false if they must stay constants.
  bool lift(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, size_t index, ArgRecord& arg);
  void sign(const TensorRef& ref);
  void sign(const c10::IValue& constant);
};

// The program's tensors are aliases of the segment's: the same memory and
// layout, but a version counter and autograd state of their own. The ops
// bumped the versions of what they write when they were launched; the
// program must not bump them again, nor record autograd history.
at::Tensor alias(c10::Storage storage, const Layout& layout);
at::Tensor alias(const at::Tensor& t);
// An alias of t's whole storage as a 1-d tensor of t's dtype (the elements
// that fit: storage bytes / item size).
at::Tensor whole_storage(const at::Tensor& t);

}  // namespace torchneuron::adaptive
