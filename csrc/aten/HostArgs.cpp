#include "HostArgs.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include "../backend/Current.h"

namespace torchneuron::aten {

TensorSnapshot::TensorSnapshot(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != backend::kNeuron) {
    // CPU scalars and CPU index tensors are read when the task runs: copy
    // them now, so later writes by the host cannot reach the task.
    host_ = t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number() ? t.clone() : t;
    return;
  }
  auto* base = static_cast<char*>(t.storage().data_ptr().get());
  data_ = base ? base + t.storage_offset() * int64_t(t.itemsize()) : nullptr;
  dtype_ = t.scalar_type();
  conj_ = t.is_conj();
  neg_ = t.is_neg();
  sizes_.assign(t.sizes().begin(), t.sizes().end());
  strides_.assign(t.strides().begin(), t.strides().end());
}

at::Tensor TensorSnapshot::view() const {
  if (dtype_ == c10::ScalarType::Undefined) return host_;
  size_t nbytes = at::detail::computeStorageNbytes(sizes_, strides_, c10::elementSize(dtype_));
  void* host = data_ ? runtime::host_address(data_) : nullptr;
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(host, c10::Device(c10::kCPU)),
                       c10::GetCPUAllocator(), /*resizable=*/true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    c10::scalarTypeToTypeMeta(dtype_));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes_, strides_);
  if (conj_) t._set_conj(true);
  if (neg_) t._set_neg(true);
  return t;
}

bool TensorSnapshot::restore(const at::Tensor& view, bool allow_moved) const {
  if (dtype_ == c10::ScalarType::Undefined) return true;
  if (!view.sizes().equals(sizes_) || !view.strides().equals(strides_)) return false;
  if (view.data_ptr() != (data_ ? runtime::host_address(data_) : nullptr)) {
    if (!allow_moved) return false;
    this->view().copy_(view);
  }
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
  torch::jit::Stack stack;
  stack.reserve(slots_.size());
  for (const Slot& s : slots_) {
    switch (s.kind) {
      case Kind::kValue:
        stack.push_back(values_[s.first]);
        break;
      case Kind::kTensor:
        stack.emplace_back(tensors_[s.first].view());
        break;
      case Kind::kTensorList: {
        c10::List<at::Tensor> list;
        list.reserve(s.count);
        for (uint32_t i = 0; i < s.count; ++i) list.push_back(tensors_[s.first + i].view());
        stack.emplace_back(std::move(list));
        break;
      }
      case Kind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (uint32_t i = s.first; i < s.first + s.count; ++i)
          list.push_back(none_[i] ? std::nullopt : std::optional<at::Tensor>(tensors_[i].view()));
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  return stack;
}

bool HostArgs::restore(const torch::jit::Stack& materialized, bool allow_moved) const {
  bool same = true;
  for (size_t i = 0; i < slots_.size() && i < materialized.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.kind == Kind::kTensor) {
      same = tensors_[s.first].restore(materialized[i].toTensor(), allow_moved) && same;
    } else if (s.kind == Kind::kTensorList) {
      auto list = materialized[i].toTensorList();
      for (uint32_t k = 0; k < s.count && k < list.size(); ++k)
        same = tensors_[s.first + k].restore(list[k], allow_moved) && same;
    }  // values and index lists are never written
  }
  return same;
}

}  // namespace torchneuron::aten
