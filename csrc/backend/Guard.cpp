// DeviceGuardImplInterface for neuron: the device/stream/event vocabulary
// that c10 (DeviceGuard, StreamGuard, torch.Event, torch.accelerator) speaks.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "../profiler/Recorder.h"
#include "Allocator.h"
#include "Current.h"
#include "SyncTrace.h"

namespace torchneuron::backend {

namespace {

runtime::Event* as_event(void* event) { return static_cast<runtime::Event*>(event); }

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNeuron, current_device()); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      set_current_device(d.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool is_high_priority) const override {
    return stream_from_pool(d.index(), is_high_priority ? -1 : 0);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return stream_from_pool(d.index(), priority);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = current_stream(s.device_index());
    set_current_stream(s);
    return old;
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete as_event(event); }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ", int(device_index),
                " does not match recording stream's device index ", int(stream.device_index()), ".");
    if (!*event) *event = new runtime::Event();
    as_event(*event)->record(runtime_stream(stream));
    trace_sync(SyncKind::kEventRecord, *event, stream);
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    as_event(event)->block(runtime_stream(stream));
    trace_sync(SyncKind::kEventWait, event, stream);
  }
  // A completed event or stream also reports a failed task, as CUDA's query
  // returns the error: a poll loop must not read a failed result silently.
  bool queryEvent(void* event) const override {
    if (!event) return true;
    if (!as_event(event)->query()) return false;
    as_event(event)->synchronize();  // completed: returns at once, or rethrows
    return true;
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    profiler::SyncScope sync("event synchronize", as_event(event)->device());
    as_event(event)->synchronize();
    trace_sync(SyncKind::kEventSynchronize, event, default_stream(c10::DeviceIndex(as_event(event)->device())));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    return as_event(start)->elapsed_ms(*as_event(end));
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device_index(d.index() < 0 ? current_device() : d.index());
    c10::DeviceCapability cap;  // every dtype the kernels support, which is all but quantized ones
    auto& types = cap.capability_data.supported_scalar_types;
    types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = types.has_QUInt4x2 = types.has_QUInt2x4 = false;
    return cap;
  }
  bool queryStream(const c10::Stream& stream) const override {
    auto& s = runtime_stream(stream);
    if (!s.query()) return false;
    s.rethrow_error();
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override { synchronize_stream(stream); }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override { synchronize_device(device_index); }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    caching_allocator().recordStream(data_ptr, stream);
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace torchneuron::backend
