// Kernels that create or rebind device storage: empty tensors, resize_,
// set_, record_stream. They run on the host (no data is computed); only
// resize_'s copy of old contents is a device task.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../backend/Allocator.h"
#include "../backend/Current.h"
#include "Launcher.h"

namespace torchneuron::backend {

// Grows or shrinks a storage; the old contents are copied on the current
// stream, so the copy is ordered after every earlier write.
void resize_bytes(const c10::Storage& storage, size_t new_size) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceIndex device = storage.device().index();
  auto new_data = caching_allocator().allocate_on(device, new_size);
  size_t keep = std::min(storage.nbytes(), new_size);
  if (keep > 0) {
    void* dst = new_data.get();
    const void* src = storage.data();
    aten::enqueue(device, "resize_ (copy of old contents)",
                  [dst, src, keep] { std::memcpy(runtime::host_address(dst), runtime::host_address(src), keep); });
  }
  // The old block may belong to another stream: it must not be reused there
  // before the copy on this stream has read it.
  caching_allocator().recordStream(storage.data_ptr(), current_stream(device));
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(new_data));
  const_cast<c10::Storage&>(storage).set_nbytes(new_size);
}

}  // namespace torchneuron::backend

namespace torchneuron::aten {

namespace {

using backend::kNeuron;

// Under torch.use_deterministic_algorithms(True), uninitialised memory is
// filled (NaN, or the integer maximum) as on CPU and CUDA, so that reading it
// by mistake gives the same result every run.
bool fill_uninitialized() {
  return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

c10::DeviceIndex device_of(std::optional<c10::Device> device) {
  c10::DeviceIndex index = device && device->has_index() ? device->index() : backend::current_device();
  backend::check_device_index(index);
  return index;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                               std::optional<c10::Device> device, std::optional<bool>,
                               std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::Device(kNeuron, device_of(device)));
  check_not_quantized("empty", c10::dtype_or_default(dtype));
  return filled_if_deterministic(at::detail::empty_generic(size, &backend::caching_allocator(),
                                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                           c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(c10::Device(kNeuron, device_of(device)));
  check_not_quantized("empty_strided", c10::dtype_or_default(dtype));
  return filled_if_deterministic(at::detail::empty_strided_generic(size, stride, &backend::caching_allocator(),
                                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                                   c10::dtype_or_default(dtype)));
}

void ensure_storage(const at::Tensor& self) {
  size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.itemsize(),
                                                   self.storage_offset());
  if (needed > self.storage().nbytes()) backend::resize_bytes(self.storage(), needed);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> format) {
  auto* impl = self.unsafeGetTensorImpl();
  for (int64_t s : size)
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  if (self.sizes() == size && (!format || self.is_contiguous(*format))) return self;
  auto old_sizes = self.sizes().vec();
  auto old_strides = self.strides().vec();
  impl->set_sizes_contiguous(size);
  if (format) impl->empty_tensor_restride(*format);
  int64_t old_nbytes = int64_t(self.storage().nbytes());
  try {
    ensure_storage(self);
  } catch (...) {
    impl->set_sizes_and_strides(old_sizes, old_strides);  // e.g. out of memory: the tensor is unchanged
    throw;
  }
  if (fill_uninitialized()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNeuron, "set_: expected a neuron storage for a neuron tensor, got a ",
              source.device(), " storage");
  TORCH_CHECK(source.device() == self.device(), "set_: storage is on ", source.device(), " but the tensor is on ",
              self.device());
  TORCH_CHECK(offset >= 0, "set_: storage offset must be non-negative, got ", offset);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(offset);
  } else {
    TORCH_CHECK(size.size() == stride.size(), "set_: size and stride must have the same length, got ", size.size(),
                " and ", stride.size());
    impl->set_sizes_and_strides(size, stride, offset);
  }
  ensure_storage(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = int64_t(source.nbytes() / self.itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       backend::caching_allocator().allocate_on(self.device().index(), 0), &backend::caching_allocator(),
                       true);
  return set_storage_offset(self, std::move(storage), 0, {0}, {});
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "record_stream: expected a neuron stream, got ", stream);
  backend::caching_allocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

// `param.data = other` (Module.to and Module._apply use it) keeps the Parameter
// object, and so weight tying, only when this says the two tensors are
// compatible. c10 answers yes for dense CPU and CUDA tensors and leaves
// PrivateUse1 to the backend: without this, model.to("neuron") replaced every
// Parameter and untied shared weights (an LM head tied to its embedding).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense_host_or_neuron = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && !t.is_quantized() && (t.is_cpu() || t.device().type() == kNeuron);
  };
  return self.key_set() == from.key_set() || (dense_host_or_neuron(self) && dense_host_or_neuron(from));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("record_stream", record_stream);
}

// Also above the Python key, where the CompositeImplicitAutograd kernel it
// replaces ran: a tensor subclass (TorchAO's MXTensor) must not receive the
// query in __torch_dispatch__, or model.to("neuron") fails for it.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

}  // namespace torchneuron::aten
