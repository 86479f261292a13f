// PrivateUse1HooksInterface: what ATen asks of any accelerator (availability,
// generators, pinned memory, pointer ownership, storage resizing).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>

#include "Allocator.h"
#include "Current.h"
#include "Generator.h"
#include "HostAllocator.h"

namespace torchneuron::backend {

void resize_bytes(const c10::Storage& storage, size_t new_size);  // aten/Resize.cpp

namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  void init() const override { lazy_init(); }
  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    check_device_index(device);
    return is_initialized();
  }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    if (device != old) set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override { return default_generator(device); }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_generator(device); }

  at::Device getDeviceFromPtr(void* data) const override {
    int device = runtime::device_of_pointer(data);
    TORCH_CHECK(device >= 0, "pointer ", data, " is not neuron device memory");
    return at::Device(kNeuron, c10::DeviceIndex(device));
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_size) const override {
    resize_bytes(storage, new_size);
  }
};

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
} registration;

}  // namespace
}  // namespace torchneuron::backend
