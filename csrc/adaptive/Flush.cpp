// Deferring ops into segments and flushing them: op by op, or as one fused
// task once the segment's compiled program is ready.
//
// Recognition and compilation are driven from Python (torchneuron.adaptive):
// a segment seen `hot` times is described to the engine, which compiles it in
// a child process; when it reports the program compiled, the next flush of
// that segment loads it and from then on runs it instead of the ops.
//
// Locking: a stream's flushes are serialised, in order, by its flush mutex.
// A flush may call Python (the GIL), so a thread that holds the GIL releases
// it while it waits for the flush mutex: no thread ever waits for the flush
// mutex while holding the GIL.
#include <ATen/Context.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "../backend/Current.h"
#include "../profiler/Recorder.h"
#include "../runtime/Config.h"
#include "Adaptive.h"
#include "Collector.h"
#include "Engine.h"
#include "Segment.h"

namespace torchneuron::adaptive {

namespace py = pybind11;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}


struct Pending {
  explicit Pending(runtime::Stream& s) : stream(s) {}
  runtime::Stream& stream;
  std::mutex mutex;  // guards `segment`
  Segment segment;
  std::mutex flush_mutex;  // guards `spare`
  // The last flushed segment, cleared: its tables' capacity serves the next.
  Segment spare;
  std::atomic<int64_t> last_defer_ns{0};
};

std::mutex g_pending_mutex;
std::vector<Pending*>* g_pending = new std::vector<Pending*>();  // leaked: streams live forever

Pending& pending_of(runtime::Stream& s) {
  thread_local std::unordered_map<const runtime::Stream*, Pending*> cache;
  Pending*& p = cache[&s];
  if (p) return *p;
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  for (Pending* q : *g_pending)
    if (&q->stream == &s) return *(p = q);
  g_pending->push_back(p = new Pending(s));
  return *p;
}

thread_local bool t_idle_flusher = false;
// The streams this thread is flushing, outermost first (a program's
// allocation may wait for the device, which flushes the other streams).
thread_local std::vector<const runtime::Stream*> t_flushing;

bool python_usable() {
  return engine_ready() && !t_idle_flusher && !runtime::on_worker_thread() && Py_IsInitialized() &&
         !_Py_IsFinalizing();
}

// ---- idle flushing ------------------------------------------------------------

void idle_flusher_loop() {
  t_idle_flusher = true;
  for (;;) {
    // Re-reads the setting every few ms, so a shorter timeout applies at once.
    const int64_t idle_ns = settings().idle_ns.load(std::memory_order_relaxed);
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::clamp<int64_t>(idle_ns / 2, 100000, 5000000)));
    std::vector<Pending*> all;
    {
      std::lock_guard<std::mutex> lock(g_pending_mutex);
      all = *g_pending;
    }
    int64_t now = now_ns();
    for (Pending* p : all)
      if (p->stream.has_deferred() && now - p->last_defer_ns.load(std::memory_order_relaxed) > idle_ns) {
        try {
          p->stream.flush_deferred();
        } catch (...) {  // nothing to report to: the ops' own errors surface at synchronisation
        }
      }
  }
}

void start_idle_flusher() {
  static std::once_flag once;
  std::call_once(once, [] { std::thread(idle_flusher_loop).detach(); });
}

// ---- running a flushed segment --------------------------------------------------

void run_op_by_op(runtime::Stream& s, Segment& seg) {
  for (auto& op : seg.ops) s.enqueue_flushed(std::move(op.eager_task), std::move(op.record));
}

std::string replaced_ops(const Segment& seg) {
  std::string names;
  for (const auto& op : seg.ops) {
    if (!names.empty()) names += ", ";
    names += op.name;
  }
  return names;
}

// Runs the compiled program of `seg` on the host, collecting the tasks it
// launches, and enqueues them as one task. False if this occurrence must run
// op by op instead.
bool replay(runtime::Stream& s, Segment& seg, const std::vector<c10::Storage>& live, SegmentState& state) {
  Collector collector;
  std::string failure;
  bool aborted = false;
  {
    // The program allocates its buffers (and uploads its scalars) on the
    // current stream, which must be the segment's: a synchronize(), an
    // .item() or a wait_stream() flushes other streams' segments too, and
    // memory ordered on the flushing thread's stream could be reused there
    // before the fused task has run.
    c10::StreamGuard on_segment_stream(
        c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, seg.device), s.id()));
    py::gil_scoped_acquire gil;
    py::list tensors;
    // Each input as its whole storage (flat): the program views it as the
    // segment's ops did (see torchneuron/adaptive/_graph.py).
    for (const auto& t : seg.inputs) tensors.append(whole_storage(t));
    // Saved and restored, not cleared: a flush nested in the program (an
    // allocation that waits for the device flushes other streams) has its own.
    Collector* const outer = std::exchange(t_collector, &collector);
    try {
      // Uploaded as part of the fused task (the copies are collected).
      for (const auto& t : seg.lifted) tensors.append(t.to(c10::Device(c10::DeviceType::PrivateUse1, seg.device)));
      for (size_t v = 0; v < live.size(); ++v)
        if (live[v]) tensors.append(alias(live[v], seg.values[v].layout));
      state.call(tensors);
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt)) {  // see run()
        t_collector = outer;
        throw;
      }
      failure = e.what();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    t_collector = outer;
    // The program launched a synchronous op: what it collected so far is not
    // the whole segment.
    aborted = collector.aborted;
    if (aborted) failure.clear();
    if (!failure.empty()) {
      state.fail("its compiled program failed on the host: " + failure);
      return false;
    }
    if (aborted || collector.tasks.empty()) {
      metrics().aborted_replays++;
      return false;
    }
  }
  std::vector<runtime::Stream::Task> eager;
  eager.reserve(seg.ops.size());
  for (auto& op : seg.ops) eager.push_back(std::move(op.eager_task));
  std::shared_ptr<runtime::TaskRecord> record;
  if (profiler::recording()) {
    profiler::TaskFacts facts;
    facts.kind = runtime::TaskKind::kFused;
    record = profiler::record_task("adaptive_segment", seg.device, s.id(), facts);
    record->replaced = replaced_ops(seg);
  }
  s.enqueue_flushed(
      [tasks = std::move(collector.tasks), eager = std::move(eager)]() mutable {
        try {
          for (auto& t : tasks) t();
        } catch (...) {
          // Report the error as eager would: run the ops one by one, which
          // raises the first failing op's own error. (The segment's results
          // are undefined after an error, as after a failed eager op.)
          for (auto& t : eager) t();
          throw;  // the ops did not fail where the program did: report the program's error
        }
      },
      std::move(record));
  auto& m = metrics();
  m.replays++;
  m.ops_replayed += int64_t(seg.ops.size());
  m.launches_saved += int64_t(seg.ops.size()) - 1;
  for (const auto& l : live) m.intermediates_elided += !l;
  return true;
}

void run(runtime::Stream& s, Segment& seg) {
  auto& m = metrics();
  m.segments++;
  m.ops_deferred += int64_t(seg.ops.size());
  std::string_view why = !seg.unsupported.empty() ? seg.unsupported
                         : !python_usable()       ? std::string_view("flushed where no program may run (idle flush, stream worker)")
                         : seg.ops.size() < 2     ? std::string_view("a single op")
                                                  : std::string_view();
  if (!why.empty()) {
    m.count_op_by_op(why);
    return run_op_by_op(s, seg);
  }
  std::vector<c10::Storage> live = seg.live_values();
  std::vector<bool> is_live(live.size());
  for (size_t v = 0; v < live.size(); ++v) is_live[v] = bool(live[v]);
  seg.signature.push_back(-2);
  seg.signature.insert(seg.signature.end(), is_live.begin(), is_live.end());
  std::shared_ptr<SegmentState> state = state_of(seg.signature);
  try {
    if (state->advance(seg, is_live) && replay(s, seg, live, *state)) return;
  } catch (py::error_already_set&) {
    // Ctrl-C while the engine or the program ran: the ops still run, as
    // eager's would, and the interrupt reaches the user.
    run_op_by_op(s, seg);
    throw;
  }
  run_op_by_op(s, seg);
}

// The runtime's deferred-work flusher.
void flush(runtime::Stream& s) {
  // This thread is running this stream's segment (its program collects what
  // it launches); its flush mutex is held, below.
  if (std::find(t_flushing.begin(), t_flushing.end(), &s) != t_flushing.end()) return;
  Pending& p = pending_of(s);
  if (runtime::on_worker_thread()) {
    // A stream worker (freeing memory that another stream used records an
    // event there, which flushes) must not wait for another thread's running
    // flush: that flush's program may wait for the device, hence for this
    // worker. It passes it (what it enqueues may precede the segment's tasks).
    if (!p.flush_mutex.try_lock()) return;
  } else {
    lock_without_gil(p.flush_mutex);
  }
  std::lock_guard<std::mutex> flushing(p.flush_mutex, std::adopt_lock);
  Segment seg;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.segment.empty()) return s.clear_deferred();
    seg = std::exchange(p.segment, std::move(p.spare));
  }
  // The stream stays marked until the segment's tasks are enqueued: another
  // thread's synchronize() or launch meanwhile (the idle flusher's flush and
  // the host's .item(), say) waits for this flush instead of passing it.
  auto unmark_if_empty = [&] {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.segment.empty()) s.clear_deferred();
  };
  t_flushing.push_back(&s);
  try {
    run(s, seg);
  } catch (...) {
    t_flushing.pop_back();
    unmark_if_empty();
    throw;
  }
  t_flushing.pop_back();
  unmark_if_empty();
  seg.clear();
  p.spare = std::move(seg);
}

const bool registered = [] {
  runtime::set_deferred_flusher(&flush);
  return true;
}();

}  // namespace

Settings& settings() {
  static auto* s = [] {
    const runtime::Config& c = runtime::config();
    return new Settings{{c.adaptive_hot}, {c.adaptive_max_ops}, {int64_t(c.adaptive_idle_ms * 1e6)},
                        {int64_t(c.adaptive_compile_timeout_s * 1e3)}};
  }();
  return *s;
}

std::atomic<bool> g_enabled{runtime::config().adaptive_eager};

void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

bool should_defer(const runtime::Stream& stream) {
  return enabled() && t_collector == nullptr && !backend::launch_blocking() &&
         !at::globalContext().deterministicAlgorithms() && !stream.capturing();
}

void defer(runtime::Stream& stream, c10::DeviceIndex device, const c10::OperatorHandle& op, std::string_view name,
           c10::ArrayRef<c10::IValue> args, c10::ArrayRef<c10::IValue> returns, runtime::Stream::Task task,
           std::shared_ptr<runtime::TaskRecord> record) {
  Pending& p = pending_of(stream);
  size_t size;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    // Ops of another device on this stream's segment cannot happen (one
    // stream, one device), but a segment starts on the device of its first op.
    if (p.segment.empty()) p.segment.device = device;
    p.segment.append(op, name, args, returns, std::move(task), std::move(record));
    size = p.segment.ops.size();
    stream.mark_deferred();
  }
  p.last_defer_ns.store(now_ns(), std::memory_order_relaxed);
  start_idle_flusher();
  if (int64_t(size) >= settings().max_ops.load(std::memory_order_relaxed)) stream.flush_deferred();
}

}  // namespace torchneuron::adaptive
