// A graph: the tasks a stream recorded while capturing, replayable as one task.
//
// During a capture the stream does not run what is enqueued on it; it appends
// it here. Replay enqueues a single task that runs the recorded tasks in order
// on the same device memory, so a whole step costs one launch. Tasks read
// their tensor arguments from device memory each time they run; what they
// took by value at launch (host scalars, the CPU generator of a random op)
// stays as captured, as kernel arguments do in a CUDA graph.
#pragma once

#include <memory>
#include <vector>

#include "Stream.h"

namespace torchneuron::runtime {

class Graph {
 public:
  void record(Stream::Task task) { tasks_->push_back(std::move(task)); }
  size_t size() const { return tasks_->size(); }
  void clear() { tasks_ = std::make_shared<std::vector<Stream::Task>>(); }
  // Enqueues one task on `stream` running every recorded task in order; the
  // first error stops the replay and surfaces like any task error.
  uint64_t replay_on(Stream& stream, std::shared_ptr<TaskRecord> record = nullptr) const {
    return stream.enqueue(
        [tasks = tasks_] {
          for (auto& task : *tasks) task();
        },
        std::move(record));
  }

 private:
  std::shared_ptr<std::vector<Stream::Task>> tasks_ = std::make_shared<std::vector<Stream::Task>>();
};

}  // namespace torchneuron::runtime
