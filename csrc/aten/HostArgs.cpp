#include "HostArgs.h"

#include <algorithm>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include "../backend/Current.h"

namespace torchneuron::aten {

at::Tensor cpu_tensor_over(c10::Storage storage, c10::ScalarType dtype, c10::IntArrayRef sizes,
                           c10::IntArrayRef strides, int64_t offset, bool conj, bool neg) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  if (conj) t._set_conj(true);
  if (neg) t._set_neg(true);
  return t;
}

TensorSnapshot::TensorSnapshot(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != backend::kNeuron) {
    // CPU scalars and CPU index tensors are read when the task runs: copy
    // them now, so later writes by the host cannot reach the task.
    host_ = t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number() ? t.clone() : t;
    return;
  }
  auto* base = static_cast<char*>(t.storage().data_ptr().get());
  data_ = base ? base + t.storage_offset() * int64_t(t.itemsize()) : nullptr;
  storage_ = base;
  storage_id_ = t.storage().unsafeGetStorageImpl();
  tensor_id_ = t.unsafeGetTensorImpl();
  storage_nbytes_ = t.storage().nbytes();
  offset_ = t.storage_offset();
  dtype_ = t.scalar_type();
  conj_ = t.is_conj();
  neg_ = t.is_neg();
  sizes_.assign(t.sizes().begin(), t.sizes().end());
  strides_.assign(t.strides().begin(), t.strides().end());
}

at::Tensor TensorSnapshot::view(HostStorages* shared) const {
  if (dtype_ == c10::ScalarType::Undefined) return host_;
  auto make_storage = [this] {
    void* host = storage_ ? runtime::host_address(storage_) : nullptr;
    return c10::Storage(c10::Storage::use_byte_size_t(), storage_nbytes_, c10::DataPtr(host, c10::Device(c10::kCPU)),
                        c10::GetCPUAllocator(), /*resizable=*/true);
  };
  c10::Storage storage;
  if (shared) {
    for (const auto& [id, t] : shared->tensors)
      if (id == tensor_id_) return t;
    for (const auto& [id, s] : shared->storages)
      if (id == storage_id_) storage = s;
    if (!storage) shared->storages.emplace_back(storage_id_, storage = make_storage());
  } else {
    storage = make_storage();
  }
  auto t = cpu_tensor_over(std::move(storage), dtype_, sizes_, strides_, offset_, conj_, neg_);
  if (shared) shared->tensors.emplace_back(tensor_id_, t);
  return t;
}

bool TensorSnapshot::restore(const at::Tensor& view, bool allow_moved) const {
  if (dtype_ == c10::ScalarType::Undefined) return true;
  if (!view.sizes().equals(sizes_) || !view.strides().equals(strides_)) return false;
  bool moved = view.data_ptr() != (data_ ? runtime::host_address(data_) : nullptr);
  if (moved && !allow_moved) return false;
  // A kernel may also flip a lazy conjugation/negation bit on its output (as
  // linalg_lu_solve's out= kernel does); the device tensor keeps its bits, so
  // its data must hold the value the kernel meant.
  bool flipped = view.is_conj() != conj_ || view.is_neg() != neg_;
  if (moved || flipped) this->view().copy_(view);
  return true;
}

void HostArgs::push(const c10::IValue& v) {
  if (v.isTensor()) return push_tensor(v.toTensor());
  if (v.isTensorList()) {
    auto list = v.toTensorList();
    slots_.push_back({Kind::kTensorList, uint32_t(tensors_.size()), uint32_t(list.size())});
    for (const at::Tensor& t : list) tensors_.emplace_back(t);
    return;
  }
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList() &&
      v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    auto list = v.toListRef();
    slots_.push_back({Kind::kOptionalTensorList, uint32_t(tensors_.size()), uint32_t(list.size())});
    none_.resize(tensors_.size() + list.size());
    for (const auto& e : list) {
      none_[tensors_.size()] = !e.isTensor();
      tensors_.emplace_back(e.isTensor() ? e.toTensor() : at::Tensor());
    }
    return;
  }
  slots_.push_back({Kind::kValue, uint32_t(values_.size()), 1});
  values_.push_back(v);
}

void HostArgs::push_tensor(const at::Tensor& t) {
  slots_.push_back({Kind::kTensor, uint32_t(tensors_.size()), 1});
  tensors_.emplace_back(t);
}

void HostArgs::push_tensor_list(c10::ArrayRef<at::Tensor> tensors) {
  slots_.push_back({Kind::kTensorList, uint32_t(tensors_.size()), uint32_t(tensors.size())});
  for (const at::Tensor& t : tensors) tensors_.emplace_back(t);
}

torch::jit::Stack HostArgs::materialize() const {
  HostStorages shared;
  torch::jit::Stack stack;
  stack.reserve(slots_.size());
  for (const Slot& s : slots_) {
    switch (s.kind) {
      case Kind::kValue:
        stack.push_back(values_[s.first]);
        break;
      case Kind::kTensor:
        stack.emplace_back(tensors_[s.first].view(&shared));
        break;
      case Kind::kTensorList: {
        c10::List<at::Tensor> list;
        list.reserve(s.count);
        for (uint32_t i = 0; i < s.count; ++i) list.push_back(tensors_[s.first + i].view(&shared));
        stack.emplace_back(std::move(list));
        break;
      }
      case Kind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (uint32_t i = s.first; i < s.first + s.count; ++i)
          list.push_back(none_[i] ? std::nullopt : std::optional<at::Tensor>(tensors_[i].view(&shared)));
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  return stack;
}

bool HostArgs::restore(const torch::jit::Stack& materialized, bool allow_moved) const {
  bool same = true;
  // A tensor passed twice is one CPU tensor: restore it once (restoring a
  // flipped conjugate bit twice would undo it).
  c10::SmallVector<const c10::TensorImpl*, 8> done;
  auto restore_once = [&](const TensorSnapshot& snapshot, const at::Tensor& view) {
    if (std::find(done.begin(), done.end(), view.unsafeGetTensorImpl()) != done.end()) return;
    done.push_back(view.unsafeGetTensorImpl());
    same = snapshot.restore(view, allow_moved) && same;
  };
  for (size_t i = 0; i < slots_.size() && i < materialized.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.kind == Kind::kTensor) {
      restore_once(tensors_[s.first], materialized[i].toTensor());
    } else if (s.kind == Kind::kTensorList) {
      auto list = materialized[i].toTensorList();
      for (uint32_t k = 0; k < s.count && k < list.size(); ++k) restore_once(tensors_[s.first + k], list[k]);
    }  // values and index lists are never written
  }
  return same;
}

}  // namespace torchneuron::aten
