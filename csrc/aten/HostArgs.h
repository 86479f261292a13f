// An op's arguments captured at launch, turned into CPU values inside the task.
//
// The host records only where each tensor's data is and how it is laid out;
// the worker builds the CPU views over device memory. That keeps tensor
// construction (and its allocations) off the host thread, which is what an
// eager program waits on, and pins the layout a tensor had at launch even if
// the host later resizes or rebinds it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <vector>

namespace torchneuron::aten {

// A CPU tensor of its own (no autograd history, its own version counter) over
// `storage` with the given layout and lazy conjugate/negative bits.
at::Tensor cpu_tensor_over(c10::Storage storage, c10::ScalarType dtype, c10::IntArrayRef sizes,
                           c10::IntArrayRef strides, int64_t offset, bool conj, bool neg);

// CPU storages and tensors already built for an op's arguments: views of
// one device storage stay views of one CPU storage, and a tensor passed
// twice stays one tensor, so the CPU kernel sees the aliasing (its overlap
// checks, an out= that is also an input) as the caller made it.
struct HostStorages {
  c10::SmallVector<std::pair<const void*, c10::Storage>, 4> storages;
  c10::SmallVector<std::pair<const void*, at::Tensor>, 4> tensors;
};

class TensorSnapshot {
 public:
  explicit TensorSnapshot(const at::Tensor& t);
  // A CPU tensor over the device memory (or the captured CPU tensor). Its
  // storage is resizable: a kernel that grows an output (some out= kernels
  // use it as scratch) moves it to host memory, and restore() copies the
  // result back.
  at::Tensor view(HostStorages* shared = nullptr) const;
  // After a kernel ran on `view`: false if the kernel left it with another
  // layout; otherwise true, after copying the data back to device memory if
  // the kernel moved it.
  // With `allow_moved` false, data the kernel moved counts as a change too.
  bool restore(const at::Tensor& view, bool allow_moved = true) const;

 private:
  void* data_ = nullptr;     // the first element
  void* storage_ = nullptr;  // the start of the device storage
  // The device StorageImpl and TensorImpl: alive at launch, used as
  // identities only, never dereferenced.
  const void* storage_id_ = nullptr;
  const void* tensor_id_ = nullptr;
  size_t storage_nbytes_ = 0;
  int64_t offset_ = 0;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;  // Undefined: `host_` is used as it is
  bool conj_ = false, neg_ = false;
  c10::SmallVector<int64_t, 5> sizes_, strides_;
  at::Tensor host_;
};

class HostArgs {
 public:
  // Appends an argument; tensors (and tensors inside lists) are snapshotted.
  void push(const c10::IValue& value);
  void push_tensor(const at::Tensor& t);
  void push_tensor_list(c10::ArrayRef<at::Tensor> tensors);
  // The CPU stack for the kernel. Call inside the task.
  torch::jit::Stack materialize() const;
  // restore() for every tensor of a stack made by materialize(); false if
  // any kernel-visible layout changed.
  bool restore(const torch::jit::Stack& materialized, bool allow_moved = true) const;

 private:
  enum class Kind : uint8_t { kValue, kTensor, kTensorList, kOptionalTensorList };
  struct Slot {
    Kind kind;
    uint32_t first, count;  // into values_ (kValue) or tensors_
  };
  c10::SmallVector<Slot, 8> slots_;
  std::vector<c10::IValue> values_;
  c10::SmallVector<TensorSnapshot, 4> tensors_;
  // Optional-list entries that were None (as opposed to undefined tensors),
  // kept apart so the rebuilt list matches the original entry for entry.
  std::vector<bool> none_;
};

}  // namespace torchneuron::aten
