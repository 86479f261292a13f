// Recognition and compilation of segments: the state of each distinct
// segment (by structural signature), and the Python engine that compiles and
// loads programs (torchneuron.adaptive._engine).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <map>
#include <string_view>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "Segment.h"

namespace torchneuron::adaptive {

struct Metrics {
  std::atomic<int64_t> segments{0}, ops_deferred{0}, signatures{0}, hot{0}, compiled{0}, replays{0},
      ops_replayed{0}, launches_saved{0}, aborted_replays{0}, failures{0}, intermediates_elided{0};
  std::atomic<int64_t> compile_us{0};
  // Segments that ran op by op without being looked at, by reason.
  std::mutex mutex;
  std::map<std::string, int64_t> op_by_op;
  void count_op_by_op(std::string_view reason) {
    std::lock_guard<std::mutex> lock(mutex);
    ++op_by_op[std::string(reason)];
  }
};
Metrics& metrics();
void reset_metrics();

class SegmentState : public std::enable_shared_from_this<SegmentState> {
 public:
  enum Status : int { kCold, kCompiling, kReady, kCompiled, kFailed };

  // Counts an occurrence and moves the state on (asks for a compile when
  // the segment turns hot, loads a compiled program). True when this
  // occurrence should run the compiled program.
  bool advance(const Segment& seg, const std::vector<bool>& live);
  // Runs the program (the caller holds the GIL and collects its tasks).
  void call(const pybind11::list& tensors);
  // Marks the segment as never to be compiled again.
  void fail(const std::string& reason);
  // The engine's answer to a compile request.
  void compiled(bool ok, double seconds, const std::string& reason);

  Status status() const { return Status(status_.load()); }
  const std::string& key() const { return key_; }
  const std::string& reason() const { return reason_; }
  size_t ops() const { return ops_; }

 private:
  std::mutex mutex_;
  std::atomic<int> status_{kCold};
  int64_t seen_ = 0;
  size_t ops_ = 0;
  std::string key_, reason_;
  PyObject* program_ = nullptr;  // owned; leaked at exit with the interpreter
};

// The state of the segment with this signature (created on first sight).
std::shared_ptr<SegmentState> state_of(const std::vector<int64_t>& signature);
// The engine reports on the compile of `key`.
void compile_done(const std::string& key, bool ok, double seconds, const std::string& reason);
// Failures so far: (key, ops, reason).
std::vector<std::tuple<std::string, size_t, std::string>> failures();
// Forgets every segment (a test or a user resetting the mode's state).
void reset_states();

// The Python engine; set once by torchneuron.adaptive.
void set_engine(pybind11::object engine);
bool engine_ready();

// The segment as the engine reads it (see torchneuron/adaptive/_graph.py).
pybind11::dict describe(const Segment& seg, const std::vector<bool>& live);

// Locks `m`, releasing the GIL while waiting if this thread holds it.
void lock_without_gil(std::mutex& m);

}  // namespace torchneuron::adaptive
