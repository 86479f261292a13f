// The device hooks of PyTorch's legacy autograd profiler
// (`torch.autograd.profiler.profile(use_device="neuron")` without Kineto):
// it records an event on the current stream at each op's start and end and
// reports the elapsed time between them as the op's device time. Without
// these hooks it logs "PrivateUse1 used in profiler but not enabled" for
// every op and reports garbage times.
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/profiler/stubs/base.h>
#include <c10/util/ApproximateClock.h>

#include "../backend/Current.h"
#include "../runtime/Event.h"

namespace torchneuron::profiler {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

struct LegacyProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    c10::DeviceIndex index = backend::current_device();
    if (device) *device = index;
    auto e = std::make_shared<runtime::Event>();
    if (cpu_ns) *cpu_ns = c10::getTime();
    e->record(backend::runtime_stream(backend::current_stream(index)));
    *event = std::move(e);
  }
  // Microseconds, as the CUDA hooks report.
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    auto* a = static_cast<runtime::Event*>(start->get());
    auto* b = static_cast<runtime::Event*>(end->get());
    a->synchronize();
    b->synchronize();
    return float(a->elapsed_ms(*b) * 1000.0);
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (c10::DeviceIndex i = 0; i < backend::device_count(); ++i) {
      c10::DeviceGuard guard(c10::Device(backend::kNeuron, i));
      op(i);
    }
  }
  void synchronize() const override { backend::synchronize_device(backend::current_device()); }
};

struct Registration {
  Registration() {
    static LegacyProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} registration;

}  // namespace
}  // namespace torchneuron::profiler
