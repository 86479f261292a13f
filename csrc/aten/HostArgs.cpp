#include "HostArgs.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/TensorImpl.h>

#include "../backend/Current.h"

namespace torchneuron::aten {

TensorSnapshot::TensorSnapshot(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != backend::kNeuron) {
    // CPU scalars are read when the task runs: copy them now.
    host_ = t.defined() && t.dim() == 0 && !t.unsafeGetTensorImpl()->is_wrapped_number() ? t.clone() : t;
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
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(host, c10::Device(c10::kCPU)), nullptr,
                       false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    c10::scalarTypeToTypeMeta(dtype_));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes_, strides_);
  if (conj_) t._set_conj(true);
  if (neg_) t._set_neg(true);
  return t;
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
    for (const auto& e : list) tensors_.emplace_back(e.isTensor() ? e.toTensor() : at::Tensor());
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
        for (uint32_t i = 0; i < s.count; ++i) {
          at::Tensor t = tensors_[s.first + i].view();
          list.push_back(t.defined() ? std::optional<at::Tensor>(t) : std::nullopt);
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  return stack;
}

}  // namespace torchneuron::aten
