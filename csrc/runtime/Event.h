// An event marks a point in a stream. The stream's worker stamps the time
// when it reaches the point, which gives elapsed_ms() device-side timing.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace torchneuron::runtime {

class Stream;

class Event {
 public:
  // Marks the current end of `stream`; re-recording moves the mark.
  void record(Stream& stream);
  // Marks the end of the work already enqueued on `stream`, leaving its
  // deferred work (adaptive eager) after the mark instead of flushing it.
  // For the device allocator: a freed block's last uses are all enqueued (a
  // deferred op holds its inputs, and allocates its outputs on its own
  // stream), and a free must not wait for another thread's flush, which may
  // wait for a lock the freeing thread holds (a free runs wherever the last
  // reference drops: in the garbage collector, in the middle of an import).
  void record_enqueued(Stream& stream);
  // Makes `stream` wait (on the device) until this event has completed.
  void block(Stream& stream) const;
  // True when completed, or never recorded (as CUDA).
  bool query() const;
  // Host waits for completion; rethrows a pending error of the stream.
  void synchronize() const;
  // Device of the stream it was recorded on, -1 if never recorded.
  int device() const;
  // Milliseconds between this event and `end`; both must be recorded.
  double elapsed_ms(const Event& end) const;

 private:
  struct Mark {
    Stream* stream;
    uint64_t seq = 0;
    std::atomic<int64_t> time_ns{-1};
  };
  std::shared_ptr<Mark> state_;
};

}  // namespace torchneuron::runtime
