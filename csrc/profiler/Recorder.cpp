#include "Recorder.h"

#include <mutex>

namespace torchneuron::profiler {

std::atomic<bool> g_recording{false};

namespace {

std::mutex g_mutex;
std::shared_ptr<Trace> g_current;  // the session recording, if any
std::shared_ptr<const Trace> g_last;
// Sessions started so far: ids pushed in an older session (a range still
// open when it stopped is never popped) must not tag this one's events.
std::atomic<uint64_t> g_generation{0};

struct Correlation {
  uint64_t generation, id;
};
thread_local std::vector<Correlation> t_correlation, t_user_correlation;
thread_local int t_sync_depth = 0;

// The host op this thread is running: Kineto's innermost op, else the
// innermost record_function range.
uint64_t current_correlation() {
  uint64_t now = g_generation.load(std::memory_order_relaxed);
  for (const auto* stack : {&t_correlation, &t_user_correlation})
    if (!stack->empty() && stack->back().generation == now) return stack->back().id;
  return 0;
}

}  // namespace

void start_session() {
  take_python_frames();  // frames of an older session that lost its tasks
  auto trace = std::make_shared<Trace>();
  trace->start_ns = runtime::trace_clock_ns();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_current = std::move(trace);
  g_generation.fetch_add(1, std::memory_order_relaxed);
  g_recording.store(true, std::memory_order_release);
}

std::shared_ptr<const Trace> stop_session() {
  std::shared_ptr<Trace> trace;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_recording.store(false, std::memory_order_release);
    trace = std::move(g_current);
  }
  if (!trace) return nullptr;
  trace->end_ns = runtime::trace_clock_ns();
  trace->frames = take_python_frames();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last = trace;
  return trace;
}

std::shared_ptr<const Trace> last_session() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_last;
}

std::shared_ptr<runtime::TaskRecord> record_task(std::string_view name, int device, int stream,
                                                 const TaskFacts& facts) {
  // The stack first: it takes the GIL, which must never be awaited under g_mutex.
  int32_t frame = current_python_frame();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_current) return nullptr;  // the session stopped meanwhile
  runtime::TaskRecord& r = g_current->tasks.emplace_back();
  r.name = name;
  r.kind = facts.kind;
  r.device = device;
  r.stream = stream;
  r.bytes_read = facts.bytes_read;
  r.bytes_written = facts.bytes_written;
  r.flops = facts.flops;
  r.correlation = current_correlation();
  r.frame = frame;
  r.enqueue_ns = runtime::trace_clock_ns();
  return std::shared_ptr<runtime::TaskRecord>(g_current, &r);
}

Source current_source() { return {current_correlation(), current_python_frame()}; }

void record_memory(int device, const void* address, int64_t bytes, int64_t allocated, int64_t reserved,
                   Source source) {
  MemoryRecord r{device,   runtime::trace_clock_ns(), reinterpret_cast<uint64_t>(address), bytes, allocated,
                 reserved, source.correlation,        source.frame};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_current) g_current->memory.push_back(r);
}

SyncScope::SyncScope(std::string_view what, int device, int stream) {
  if (t_sync_depth++ > 0 || !recording()) return;
  active_ = true;
  record_.what = what;
  record_.device = device;
  record_.stream = stream;
  record_.correlation = current_correlation();
  record_.frame = current_python_frame();
  record_.start_ns = runtime::trace_clock_ns();
}

SyncScope::~SyncScope() {
  --t_sync_depth;
  if (!active_) return;
  record_.end_ns = runtime::trace_clock_ns();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_current) g_current->syncs.push_back(record_);
}

void push_correlation(uint64_t id, bool user) {
  (user ? t_user_correlation : t_correlation).push_back({g_generation.load(std::memory_order_relaxed), id});
}

void pop_correlation(bool user) {
  auto& stack = user ? t_user_correlation : t_correlation;
  if (!stack.empty()) stack.pop_back();  // Kineto may pop ids pushed before the session started
}

}  // namespace torchneuron::profiler
