// The profiler's record of device activity (ARCHITECTURE §8).
//
// Off unless a profiling session runs; then every device task, host
// synchronisation and allocator event is recorded with the host op that
// caused it (Kineto's correlation id) and the Python line of the launch.
// When off, each hook costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <vector>

#include "../runtime/Trace.h"
#include "PythonStack.h"

namespace torchneuron::profiler {

extern std::atomic<bool> g_recording;
inline bool recording() { return g_recording.load(std::memory_order_relaxed); }

// What the launching side knows about a task's work.
struct TaskFacts {
  runtime::TaskKind kind = runtime::TaskKind::kKernel;
  int64_t bytes_read = 0, bytes_written = 0, flops = 0;
};

// A host thread blocked on the device.
struct SyncRecord {
  std::string_view what;
  int device = 0;
  int stream = -1;  // -1: the whole device
  int64_t start_ns = 0, end_ns = 0;
  uint64_t correlation = 0;
  int32_t frame = -1;
};

// The host op and Python line behind an event.
struct Source {
  uint64_t correlation = 0;
  int32_t frame = -1;
};

// An allocation (bytes > 0) or a free (bytes < 0) of the device allocator,
// with the device's totals right after it.
struct MemoryRecord {
  int device = 0;
  int64_t time_ns = 0;
  uint64_t address = 0;
  int64_t bytes = 0;
  int64_t allocated = 0, reserved = 0;
  uint64_t correlation = 0;
  int32_t frame = -1;
};

// Everything one session recorded. Tasks not yet run when the session
// stopped keep zero start/end times.
struct Trace {
  int64_t start_ns = 0, end_ns = 0;
  std::deque<runtime::TaskRecord> tasks;  // a deque: records must not move
  std::vector<SyncRecord> syncs;
  std::vector<MemoryRecord> memory;
  std::vector<Frame> frames;  // filled when the session stops
};

// Sessions. Only one records at a time; the last one stopped is kept for
// export. stop_session() returns nullptr when none was recording.
void start_session();
std::shared_ptr<const Trace> stop_session();
std::shared_ptr<const Trace> last_session();

// Hooks (call only when recording() is true). A task's record shares
// ownership of its session, so a late worker never stamps freed memory.
std::shared_ptr<runtime::TaskRecord> record_task(std::string_view name, int device, int stream,
                                                 const TaskFacts& facts);
// Takes the GIL: never call it under a lock another thread may hold while
// holding the GIL (take it first, then lock).
Source current_source();
void record_memory(int device, const void* address, int64_t bytes, int64_t allocated, int64_t reserved,
                   Source source = {});

// Records the time the host spends blocked inside it, when it is the
// outermost wait of its thread (a .cpu() is one wait, not three).
class SyncScope {
 public:
  SyncScope(std::string_view what, int device, int stream = -1);
  ~SyncScope();
  SyncScope(const SyncScope&) = delete;
  SyncScope& operator=(const SyncScope&) = delete;

 private:
  SyncRecord record_;
  bool active_ = false;
};

// Kineto's correlation ids of the host ops running on this thread.
void push_correlation(uint64_t id, bool user);
void pop_correlation(bool user);

}  // namespace torchneuron::profiler
