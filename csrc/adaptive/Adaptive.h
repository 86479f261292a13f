// Adaptive eager (ARCHITECTURE §2): eager semantics, fused-program speed.
//
// With the mode on, the launcher defers an op's task into its stream's
// pending segment instead of enqueuing it (outputs are planned, allocated and
// returned as in eager). The runtime flushes the segment before anything
// observes or extends the stream (see runtime::Stream's deferred work); the
// flush enqueues the ops one by one or, for a recurring segment whose
// compiled program is ready, one task running that program. Segments also
// flush at a size limit and when the host stops issuing work for a while.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <memory>
#include <string_view>

#include "../runtime/Stream.h"

namespace torchneuron::adaptive {

// Tunables, from TORCHNEURON_ADAPTIVE_* at start-up (runtime::Config).
struct Settings {
  std::atomic<int64_t> hot;      // occurrences that make a segment hot (compiled)
  std::atomic<int64_t> max_ops;  // a segment flushes when it holds this many ops
  std::atomic<int64_t> idle_ns;  // ... or when nothing was deferred to it for this long
  std::atomic<int64_t> compile_timeout_ms;  // the compiler gives up on a segment after this long
};
Settings& settings();

extern std::atomic<bool> g_enabled;
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on);

// Whether a launch on `stream` is deferred: the mode is on, and neither
// NEURON_LAUNCH_BLOCKING, deterministic algorithms, a graph capture nor a
// running fused program forbids it.
bool should_defer(const runtime::Stream& stream);

// Appends a launched op to the pending segment of `stream`. `returns` are
// its results, as the launcher returns them.
void defer(runtime::Stream& stream, c10::DeviceIndex device, const c10::OperatorHandle& op, std::string_view name,
           c10::ArrayRef<c10::IValue> args, c10::ArrayRef<c10::IValue> returns, runtime::Stream::Task task,
           std::shared_ptr<runtime::TaskRecord> record);

}  // namespace torchneuron::adaptive
