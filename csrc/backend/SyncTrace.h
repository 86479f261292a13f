// The orderings between streams and the host that a program asks for (event
// record and wait, event, stream and device synchronisation), reported to one
// observer: the stream sanitizer (torchneuron/sanitizer.py), which checks
// every kernel's reads and writes against them.
//
// Trace points sit where c10 and torchneuron order streams (the guard and
// the synchronize calls), not in the runtime: a hardware runtime keeps them.
// Implementation waits that no program asked for (a first call checking its
// plan) are not reported, since a program may not rely on them. With no
// observer, a trace point costs one atomic load.
#pragma once

#include <c10/core/Stream.h>

#include <atomic>
#include <cstdint>

namespace torchneuron::backend {

enum class SyncKind : int { kEventRecord, kEventWait, kEventSynchronize, kStreamSynchronize, kDeviceSynchronize };

// `event` identifies an event (0 for stream and device kinds); `stream` is the
// recording, waiting or synchronised stream (its device, for kDeviceSynchronize).
using SyncObserver = void (*)(SyncKind kind, uintptr_t event, c10::Stream stream);

inline std::atomic<SyncObserver> g_sync_observer{nullptr};

inline void trace_sync(SyncKind kind, const void* event, c10::Stream stream) {
  if (auto observer = g_sync_observer.load(std::memory_order_acquire))
    observer(kind, reinterpret_cast<uintptr_t>(event), stream);
}

}  // namespace torchneuron::backend
