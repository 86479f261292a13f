// Warnings raised inside device tasks reach the host's Python `warnings`.
//
// A CPU kernel warns with TORCH_WARN on the stream worker that runs it, where
// no Python handler listens: the warning would go to stderr, unseen by
// `warnings.catch_warnings` and warning filters. Stream workers queue what
// their tasks raise instead; the host re-emits the queue on
// its own thread (as c10::warn, so the Python handler of the calling op turns
// it into a Python warning) at the call that waited for the task — the first
// call of an op signature — or else at the next launch or synchronisation.
#pragma once

#include <c10/util/Exception.h>

#include <vector>

namespace torchneuron::backend {

// Worker side: from now on, warnings raised on the calling thread (a stream
// worker, at its start) are queued for the host.
void queue_warnings_of_this_thread();

// Worker side, inside a task: holds back the warnings of an attempt the task
// may discard (an out= kernel whose result is not used warns about resizing
// an output the user never passed). keep() passes them on.
class TentativeWarnings final : c10::WarningHandler {
 public:
  TentativeWarnings() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~TentativeWarnings() override { c10::WarningUtils::set_warning_handler(previous_); }
  void keep() {
    for (const auto& w : held_) previous_->process(w);
    held_.clear();
  }

 private:
  void process(const c10::Warning& warning) override { held_.push_back(warning); }
  c10::WarningHandler* previous_;
  std::vector<c10::Warning> held_;
};

// Host side: re-emits queued warnings on the calling thread. Returns whether
// there were any. Cheap when the queue is empty (one atomic load).
bool deliver_task_warnings();

}  // namespace torchneuron::backend
