// A stream: an in-order queue of tasks drained by its own worker thread.
//
// The host enqueues and runs ahead; the worker executes tasks one after the
// other. A task that throws records the first error of the stream, which the
// host receives at its next synchronisation; later tasks still run, so the
// stream stays usable (like an asynchronous accelerator queue).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "Trace.h"

namespace torchneuron::runtime {

class Graph;

class Stream {
 public:
  using Task = std::function<void()>;

  Stream(int device, int id, int priority) : device_(device), id_(id), priority_(priority) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const { return device_; }
  int id() const { return id_; }
  int priority() const { return priority_; }

  // Appends a task and returns its sequence number (1, 2, ...). Starts the
  // worker thread on first use. With a record, the worker stamps the task's
  // start and end in it (profiling), holding it until then; a capture drops
  // the record.
  uint64_t enqueue(Task task, std::shared_ptr<TaskRecord> record = nullptr);
  // enqueue() for the deferred-work flusher: does not flush again.
  uint64_t enqueue_flushed(Task task, std::shared_ptr<TaskRecord> record = nullptr);
  // Host waits for every task enqueued so far, then rethrows the first error a
  // task raised since the last synchronisation (clearing it).
  void synchronize();
  // Waits until task `seq` has run. Errors are left for synchronize().
  void wait_until(uint64_t seq) const;
  // True when every enqueued task has run.
  bool query() const {
    flush_deferred();
    return completed_.load(std::memory_order_acquire) >= enqueued_.load(std::memory_order_acquire);
  }
  uint64_t enqueued() const {
    flush_deferred();
    return enqueued_.load(std::memory_order_acquire);
  }
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  // Rethrows (and clears) a pending task error without waiting.
  void rethrow_error();

  // Capture: until end_capture(), enqueue() appends tasks to `graph` instead
  // of running them (and returns the sequence number of the last real task).
  // `tag` is opaque to the runtime; the glue names its memory pool with it.
  // Throws std::logic_error if the stream is already capturing.
  void begin_capture(Graph* graph, uint64_t tag);
  Graph* end_capture();
  bool capturing() const { return capture_.load(std::memory_order_acquire) != nullptr; }
  uint64_t capture_tag() const { return capture_tag_.load(std::memory_order_acquire); }

  // Deferred work (adaptive eager): the host side may hold tasks back instead
  // of enqueuing them, and marks the stream while it does. Before anything
  // extends or observes the stream's order (enqueue, enqueued, query,
  // synchronize, begin_capture; an event record enqueues) the stream calls the
  // deferred-work flusher, which hands the held work over with
  // enqueue_flushed() and clears the mark.
  void mark_deferred() { deferred_.store(true, std::memory_order_release); }
  void clear_deferred() { deferred_.store(false, std::memory_order_release); }
  bool has_deferred() const { return deferred_.load(std::memory_order_acquire); }
  void flush_deferred() const;

 private:
  void run();

  const int device_, id_, priority_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  mutable std::condition_variable done_cv_;
  struct Queued {
    Task task;
    std::shared_ptr<TaskRecord> record;
  };
  std::deque<Queued> queue_;
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  mutable std::atomic<int> host_waiters_{0};
  bool worker_sleeping_ = false;
  bool worker_started_ = false;
  std::exception_ptr error_;
  std::atomic<bool> has_error_{false};
  std::atomic<Graph*> capture_{nullptr};
  std::atomic<uint64_t> capture_tag_{0};
  std::atomic<bool> deferred_{false};
};

// Whether the calling thread is a stream's worker (it runs device tasks).
bool on_worker_thread();

// The flusher of deferred work, set once by the host side that defers.
void set_deferred_flusher(void (*flusher)(Stream&));

// Called at the start of every worker thread (e.g. to set its intra-op
// thread count); set before the first enqueue.
void set_worker_start_hook(void (*hook)());

// Stream table. Id 0 is a device's default stream; ids 1..kPoolSize are the
// low-priority pool and kPoolSize+1..2*kPoolSize the high-priority pool, as in
// CUDA's stream pools. The ids after those are communication streams (high
// priority), leased to process groups as NCCL keeps internal streams.
// Streams are created on first use and live forever.
constexpr int kPoolSize = 32;
constexpr int kCommunicationStreams = 128;
constexpr int kFirstCommunicationStream = 1 + 2 * kPoolSize;
constexpr int kStreamsPerDevice = kFirstCommunicationStream + kCommunicationStreams;
Stream& get_stream(int device, int id);
// Next stream of the pool for a priority (0 = low, negative = high), round robin.
int stream_from_pool(int device, int priority);
// A communication stream no one else holds; throws std::runtime_error when
// all are leased. Release it once its work is done.
int acquire_communication_stream(int device);
void release_communication_stream(int device, int id);
// Waits for every stream of a device, then rethrows the first error found.
void synchronize_device(int device);
// Waits for every stream of a device; errors stay for the next synchronize.
// Blocking reads skip the communication streams: a transfer waiting for a
// peer must not stall them (the peer may wait for this host), and its
// result is ordered by Work.wait(), as with NCCL.
void wait_device_idle(int device, bool include_communication = true);
// Whether any stream of the device is capturing a graph.
bool device_capturing(int device);

}  // namespace torchneuron::runtime
