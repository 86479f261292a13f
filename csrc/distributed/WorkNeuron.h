// The Work of a collective on neuron tensors: a task on a communication
// stream, which the caller's stream can wait for without blocking the host.
#pragma once

#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <string>
#include <vector>

namespace torchneuron::distributed {

// What the task reports to its Work, written before the task completes (so
// readers that saw completion see it). A message, not an exception object:
// every raise builds a fresh DistBackendError, since raising adds context.
struct TaskOutcome {
  std::string error;
  bool failed() const { return !error.empty(); }
  [[noreturn]] void raise() const;
};

class WorkNeuron : public c10d::Work {
 public:
  WorkNeuron(int rank, c10d::OpType type, const char* op, c10::Stream stream, uint64_t task_seq,
             std::shared_ptr<TaskOutcome> outcome, std::vector<at::Tensor> results);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return results_; }
  // Makes the caller's current stream wait for the task (the host runs on);
  // a failure is raised at that stream's next synchronisation. With a
  // timeout, the host also waits, at most that long.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override { wait(); }
  void blockCurrentStream() override { wait(); }
  // A future completed at launch whose value is ready on the communication
  // stream: waiting on it orders the waiter's current stream (as NCCL). It
  // carries no error: a failure makes the group's next call raise, and
  // torch.neuron.synchronize() raise.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  bool task_done() const;

  const char* op_;
  c10::Stream stream_;
  uint64_t task_seq_;
  std::shared_ptr<TaskOutcome> outcome_;
  std::vector<at::Tensor> results_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace torchneuron::distributed
