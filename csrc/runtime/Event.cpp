#include "Event.h"

#include <chrono>
#include <stdexcept>

#include "Stream.h"

namespace torchneuron::runtime {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void Event::record(Stream& stream) {
  stream.flush_deferred();
  record_enqueued(stream);
}

void Event::record_enqueued(Stream& stream) {
  auto mark = std::make_shared<Mark>();
  mark->stream = &stream;
  // The marker task is the event's point: its sequence number is the mark.
  mark->seq = stream.enqueue_flushed([mark] { mark->time_ns.store(now_ns(), std::memory_order_release); });
  state_ = std::move(mark);
}

void Event::block(Stream& stream) const {
  if (!state_ || state_->stream == &stream) return;  // same stream: already ordered
  stream.enqueue([mark = state_] { mark->stream->wait_until(mark->seq); });
}

int Event::device() const { return state_ ? state_->stream->device() : -1; }

bool Event::query() const { return !state_ || state_->stream->completed() >= state_->seq; }

void Event::synchronize() const {
  if (!state_) return;
  state_->stream->wait_until(state_->seq);
  state_->stream->rethrow_error();
}

double Event::elapsed_ms(const Event& end) const {
  if (!state_ || !end.state_)
    throw std::runtime_error("elapsed_time: both events must be recorded before calculating elapsed time");
  synchronize();
  end.synchronize();
  int64_t t0 = state_->time_ns.load(std::memory_order_acquire);
  int64_t t1 = end.state_->time_ns.load(std::memory_order_acquire);
  return double(t1 - t0) / 1e6;
}

}  // namespace torchneuron::runtime
