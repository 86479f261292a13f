// What the runtime records about a device task while a profiler is on.
//
// The launching side fills a record and hands it to Stream::enqueue; the
// stream's worker stamps when the task started and ended. Records are owned
// by whoever collects them (the profiler glue) and must outlive the task.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace torchneuron::runtime {

// kWait: a stream held until another stream's work is done (Work.wait()).
// kFused: a segment of eager ops run as one compiled program (adaptive eager).
enum class TaskKind : uint8_t { kKernel, kCopy, kCollective, kGraph, kWait, kFused };

inline const char* task_kind_name(TaskKind kind) {
  static const char* const names[] = {"kernel", "copy", "collective", "graph", "wait", "fused"};
  return names[int(kind)];
}

struct TaskRecord {
  std::string_view name;  // must outlive the record (op names, literals)
  TaskKind kind = TaskKind::kKernel;
  int device = 0, stream = 0;
  int64_t enqueue_ns = 0;
  std::atomic<int64_t> start_ns{0}, end_ns{0};  // 0 until the worker gets there
  int64_t bytes_read = 0, bytes_written = 0, flops = 0;
  uint64_t correlation = 0;  // the launching host op (Kineto correlation id), 0 if none
  int32_t frame = -1;        // innermost Python frame of the launch, -1 if none
  std::string replaced;      // kFused: the ops the task replaced, comma-separated
};

// Nanoseconds since the Unix epoch, the clock the host profiler uses.
inline int64_t trace_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace torchneuron::runtime
