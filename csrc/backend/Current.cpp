#include "Current.h"

#include <pthread.h>

extern "C" void omp_set_num_threads(int);  // from the OpenMP runtime torch loads

#include <array>
#include <atomic>
#include <mutex>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "../profiler/Recorder.h"
#include "SyncTrace.h"
#include "TaskWarnings.h"

namespace torchneuron::backend {

namespace {
constexpr int kMaxDevices = 64;
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
thread_local c10::DeviceIndex t_device = 0;
thread_local std::array<int8_t, kMaxDevices> t_stream_ids{};  // 0 = default stream

void on_fork_child() { g_bad_fork = true; }

// A stream worker runs kernel bodies, which are device work: autograd and
// version counters belong to the host thread that launched the op. Were they
// on here, a body touching a user's tensor would rewrite its autograd history
// behind the host's back (a non-blocking copy into a tensor that requires grad
// silently cut its gradient) and race the host on its metadata.
//
// Intra-op parallelism of the kernels a stream worker runs (OpenMP's thread
// count is a per-thread setting). By default torch's; measured on 2 cores,
// fewer threads leave the host more room but slow the kernels more.
void configure_worker() {
  auto keys = c10::impl::tls_local_dispatch_key_set();
  keys.excluded_ = keys.excluded_ | c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  c10::impl::_force_tls_local_dispatch_key_set(keys);
  if (int n = runtime::config().worker_threads) omp_set_num_threads(n);
  queue_warnings_of_this_thread();  // kernel warnings reach the host's Python
}

// Runtime errors are std exceptions; surface them as the c10 errors PyTorch
// maps to Python exception types.
template <typename F>
auto translate(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}
}  // namespace

void lazy_init() {
  if (g_initialized.load(std::memory_order_acquire)) {
    TORCH_CHECK(!g_bad_fork.load(std::memory_order_relaxed),
                "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, "
                "you must use the 'spawn' start method");
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    const auto& cfg = runtime::config();
    TORCH_CHECK(cfg.error.empty(), "neuron runtime: invalid environment: ", cfg.error);
    pthread_atfork(nullptr, nullptr, on_fork_child);
    runtime::set_worker_start_hook(&configure_worker);
    g_initialized = true;
  });
  TORCH_CHECK(!g_bad_fork.load(), "Cannot re-initialize neuron in forked subprocess. To use neuron with "
              "multiprocessing, you must use the 'spawn' start method");
}

bool is_initialized() { return g_initialized.load(); }
bool is_in_bad_fork() { return g_bad_fork.load(); }

c10::DeviceIndex device_count() noexcept {
  const auto& cfg = runtime::config();
  return cfg.error.empty() ? c10::DeviceIndex(std::min<size_t>(cfg.visible_cores.size(), kMaxDevices)) : 0;
}

void check_device_index(c10::DeviceIndex device) {
  TORCH_CHECK_VALUE(runtime::config().error.empty(), "neuron runtime: invalid environment: ", runtime::config().error);
  TORCH_CHECK(device >= 0 && device < device_count(), "Invalid device argument ", int(device), ": neuron has ",
              int(device_count()), " device(s) (set by NEURON_RT_NUM_CORES / NEURON_RT_VISIBLE_CORES)");
}

c10::DeviceIndex current_device() { return t_device; }

void set_current_device(c10::DeviceIndex device) {
  check_device_index(device);
  lazy_init();
  t_device = device;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  if (device < 0) device = t_device;
  check_device_index(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, device), t_stream_ids[device]);
}

c10::Stream default_stream(c10::DeviceIndex device) {
  if (device < 0) device = t_device;
  check_device_index(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, device), 0);
}

void set_current_stream(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "set_current_stream: expected a neuron stream, got ", stream);
  check_device_index(stream.device_index());
  TORCH_CHECK(stream.id() >= 0 && stream.id() < runtime::kStreamsPerDevice, "invalid neuron stream id ", stream.id());
  t_stream_ids[stream.device_index()] = int8_t(stream.id());
}

c10::Stream stream_from_pool(c10::DeviceIndex device, int priority) {
  if (device < 0) device = t_device;
  check_device_index(device);
  int id = runtime::stream_from_pool(device, priority);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, device), id);
}

runtime::Stream& runtime_stream(c10::Stream stream) {
  lazy_init();
  return translate([&]() -> runtime::Stream& { return runtime::get_stream(stream.device_index(), int(stream.id())); });
}

bool launch_blocking() {
  static const bool blocking = runtime::config().launch_blocking;
  return blocking;
}

void synchronize_stream(c10::Stream stream) {
  auto& s = runtime_stream(stream);
  // As on CUDA: a captured stream has nothing to wait for, its tasks never ran.
  TORCH_CHECK(!s.capturing(), "operation not permitted when stream is capturing: it would wait for neuron:",
              int(stream.device_index()), " stream ", stream.id(), ", which is capturing a graph");
  profiler::SyncScope sync("stream synchronize", stream.device_index(), int(stream.id()));
  s.synchronize();
  trace_sync(SyncKind::kStreamSynchronize, nullptr, stream);
  deliver_task_warnings();
}

void synchronize_device(c10::DeviceIndex device) {
  if (device < 0) device = t_device;
  check_device_index(device);
  lazy_init();
  TORCH_CHECK(!runtime::device_capturing(device), "operation not permitted when stream is capturing: neuron:",
              int(device), " has a stream capturing a graph");
  profiler::SyncScope sync("device synchronize", device);
  runtime::synchronize_device(device);
  trace_sync(SyncKind::kDeviceSynchronize, nullptr, default_stream(device));
  deliver_task_warnings();
}

}  // namespace torchneuron::backend
