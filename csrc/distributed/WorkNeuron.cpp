#include "WorkNeuron.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>

#include <thread>

#include "../aten/Launcher.h"
#include "../backend/Current.h"
#include "../profiler/Recorder.h"

namespace torchneuron::distributed {

void TaskOutcome::raise() const { C10_THROW_ERROR(DistBackendError, error); }

WorkNeuron::WorkNeuron(int rank, c10d::OpType type, const char* op, c10::Stream stream, uint64_t task_seq,
                       std::shared_ptr<TaskOutcome> outcome, std::vector<at::Tensor> results)
    : c10d::Work(rank, type),
      op_(op),
      stream_(stream),
      task_seq_(task_seq),
      outcome_(std::move(outcome)),
      results_(std::move(results)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                        std::vector<c10::Device>{stream.device()})) {
  // Completed under the communication stream right after the launch: its
  // events mark the task, so waiters' streams wait for the transfer only.
  c10::StreamGuard guard(stream_);
  future_->markCompleted(c10::IValue(results_));
}

bool WorkNeuron::task_done() const { return backend::runtime_stream(stream_).completed() >= task_seq_; }

bool WorkNeuron::isCompleted() { return task_done(); }

bool WorkNeuron::isSuccess() const { return task_done() && !outcome_->failed(); }

std::exception_ptr WorkNeuron::exception() const {
  if (!task_done() || !outcome_->failed()) return nullptr;
  try {
    outcome_->raise();
  } catch (...) {
    return std::current_exception();
  }
}

bool WorkNeuron::wait(std::chrono::milliseconds timeout) {
  if (task_done() && outcome_->failed()) outcome_->raise();
  c10::DeviceIndex device = stream_.device_index();
  // The check runs on the caller's stream, so a failed transfer poisons the
  // work that consumes its result instead of passing unreduced data on.
  aten::enqueue(
      device, op_,
      [comm = &backend::runtime_stream(stream_), seq = task_seq_, outcome = outcome_] {
        comm->wait_until(seq);
        if (outcome->failed()) outcome->raise();
      },
      {runtime::TaskKind::kWait});
  if (timeout == kNoTimeout) return true;
  profiler::SyncScope sync(op_, device, int(stream_.id()));  // the host blocks until the transfer is done
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!task_done()) {
    if (std::chrono::steady_clock::now() >= deadline)
      C10_THROW_ERROR(DistBackendError, std::string(op_) + " did not complete within " +
                                            std::to_string(timeout.count()) + " ms (Work.wait timeout)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (outcome_->failed()) outcome_->raise();
  return true;
}

}  // namespace torchneuron::distributed
