#include "Stream.h"

#include <array>
#include <chrono>
#include <memory>
#include <cxxabi.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "Graph.h"
#include "Runtime.h"

namespace torchneuron::runtime {

namespace {
// Spinning briefly before sleeping saves the futex round trip (several µs)
// when work arrives in bursts, which is the common case for eager launches.
constexpr auto kWorkerSpin = std::chrono::microseconds(50);
constexpr auto kHostSpin = std::chrono::microseconds(20);

std::atomic<void (*)()> g_worker_start_hook{nullptr};
std::atomic<void (*)(Stream&)> g_deferred_flusher{nullptr};
}  // namespace

void set_worker_start_hook(void (*hook)()) { g_worker_start_hook = hook; }
void set_deferred_flusher(void (*flusher)(Stream&)) { g_deferred_flusher = flusher; }

void Stream::flush_deferred() const {
  if (!deferred_.load(std::memory_order_acquire)) return;
  if (auto flusher = g_deferred_flusher.load()) flusher(const_cast<Stream&>(*this));
}

uint64_t Stream::enqueue(Task task, std::shared_ptr<TaskRecord> record) {
  flush_deferred();
  return enqueue_flushed(std::move(task), std::move(record));
}

uint64_t Stream::enqueue_flushed(Task task, std::shared_ptr<TaskRecord> record) {
  uint64_t seq;
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (Graph* graph = capture_.load(std::memory_order_relaxed)) {
      graph->record(std::move(task));
      return enqueued_.load(std::memory_order_relaxed);
    }
    if (!worker_started_) {
      worker_started_ = true;
      std::thread([this] { run(); }).detach();  // streams live for the whole process
    }
    queue_.push_back({std::move(task), std::move(record)});
    seq = enqueued_.fetch_add(1, std::memory_order_acq_rel) + 1;
    wake = worker_sleeping_;
  }
  if (wake) work_cv_.notify_one();
  return seq;
}

namespace {
// The stream whose worker this thread is (nullptr on host threads).
thread_local const Stream* t_worker_of = nullptr;
}  // namespace

bool on_worker_thread() { return t_worker_of != nullptr; }

void Stream::run() {
  t_worker_of = this;
  if (auto hook = g_worker_start_hook.load()) hook();
  for (;;) {
    Task task;
    std::shared_ptr<TaskRecord> record;
    {
      auto spin_until = std::chrono::steady_clock::now() + kWorkerSpin;
      while (completed_.load(std::memory_order_relaxed) == enqueued_.load(std::memory_order_acquire) &&
             std::chrono::steady_clock::now() < spin_until)
        std::this_thread::yield();
      std::unique_lock<std::mutex> lock(mutex_);
      while (queue_.empty()) {
        worker_sleeping_ = true;
        work_cv_.wait(lock);
        worker_sleeping_ = false;
      }
      task = std::move(queue_.front().task);
      record = std::move(queue_.front().record);
      queue_.pop_front();
    }
    if (record) record->start_ns.store(trace_clock_ns(), std::memory_order_relaxed);
    try {
      task();
    } catch (abi::__forced_unwind&) {
      throw;  // the thread is being cancelled (e.g. it asked for the GIL during interpreter exit)
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) {
        error_ = std::current_exception();
        has_error_.store(true, std::memory_order_release);
      }
    }
    if (record) record->end_ns.store(trace_clock_ns(), std::memory_order_release);
    task = nullptr;  // release captures before signalling completion
    record = nullptr;
    // seq_cst pairs with the host's increment of host_waiters_: one of the
    // two always sees the other's write, so no wake-up is lost.
    completed_.fetch_add(1, std::memory_order_seq_cst);
    if (host_waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_all();
    }
  }
}

void Stream::wait_until(uint64_t seq) const {
  if (completed_.load(std::memory_order_acquire) >= seq) return;
  if (t_worker_of == this)  // e.g. a kernel body (host code run as a task) reading device data
    throw std::logic_error("a task of neuron stream " + std::to_string(id_) + " on device " + std::to_string(device_) +
                           " waits for its own stream, which would never finish: device tasks cannot synchronize "
                           "with the device");
  auto spin_until = std::chrono::steady_clock::now() + kHostSpin;
  while (std::chrono::steady_clock::now() < spin_until) {
    if (completed_.load(std::memory_order_acquire) >= seq) return;
    std::this_thread::yield();
  }
  host_waiters_.fetch_add(1, std::memory_order_seq_cst);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return completed_.load(std::memory_order_seq_cst) >= seq; });
  }
  host_waiters_.fetch_sub(1, std::memory_order_acq_rel);
}

void Stream::begin_capture(Graph* graph, uint64_t tag) {
  flush_deferred();  // work deferred before the capture is not part of the graph
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_.load(std::memory_order_relaxed))
    throw std::logic_error("neuron stream " + std::to_string(id_) + " on device " + std::to_string(device_) +
                           " is already capturing a graph");
  capture_tag_.store(tag, std::memory_order_release);
  capture_.store(graph, std::memory_order_release);
}

Graph* Stream::end_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_tag_.store(0, std::memory_order_release);
  return capture_.exchange(nullptr, std::memory_order_acq_rel);
}

void Stream::synchronize() {
  wait_until(enqueued());
  rethrow_error();
}

void Stream::rethrow_error() {
  if (!has_error_.load(std::memory_order_acquire)) return;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = error_;
    error_ = nullptr;
    has_error_.store(false, std::memory_order_release);
  }
  if (error) std::rethrow_exception(error);
}

namespace {

struct DeviceStreams {
  std::array<std::atomic<Stream*>, kStreamsPerDevice> streams{};
  std::atomic<uint32_t> next_low{0}, next_high{0};
  int communication_used = 0;          // ids handed out so far (under create_mutex)
  std::vector<int> communication_free;  // released ids
  std::mutex create_mutex;
};

DeviceStreams& device_streams(int device) {
  // Leaked on purpose: worker threads may outlive static destruction.
  static std::vector<DeviceStreams>* table = new std::vector<DeviceStreams>(device_count());
  check_device(device);
  return (*table)[device];
}

}  // namespace

Stream& get_stream(int device, int id) {
  DeviceStreams& ds = device_streams(device);
  if (id < 0 || id >= kStreamsPerDevice)
    throw std::out_of_range("invalid neuron stream id " + std::to_string(id) + " on device " + std::to_string(device));
  Stream* s = ds.streams[id].load(std::memory_order_acquire);
  if (s) return *s;
  std::lock_guard<std::mutex> lock(ds.create_mutex);
  s = ds.streams[id].load(std::memory_order_acquire);
  if (!s) {
    int priority = id > kPoolSize ? -1 : 0;  // the communication streams too
    s = new Stream(device, id, priority);
    ds.streams[id].store(s, std::memory_order_release);
  }
  return *s;
}

int stream_from_pool(int device, int priority) {
  DeviceStreams& ds = device_streams(device);
  if (priority < 0) return 1 + kPoolSize + int(ds.next_high++ % kPoolSize);
  return 1 + int(ds.next_low++ % kPoolSize);
}

int acquire_communication_stream(int device) {
  DeviceStreams& ds = device_streams(device);
  std::lock_guard<std::mutex> lock(ds.create_mutex);
  if (!ds.communication_free.empty()) {
    int id = ds.communication_free.back();
    ds.communication_free.pop_back();
    return id;
  }
  if (ds.communication_used == kCommunicationStreams)
    throw std::runtime_error("all " + std::to_string(kCommunicationStreams) + " communication streams of neuron:" +
                             std::to_string(device) + " are held by process groups; destroy groups no longer used");
  return kFirstCommunicationStream + ds.communication_used++;
}

void release_communication_stream(int device, int id) {
  DeviceStreams& ds = device_streams(device);
  std::lock_guard<std::mutex> lock(ds.create_mutex);
  ds.communication_free.push_back(id);
}

void wait_device_idle(int device, bool include_communication) {
  DeviceStreams& ds = device_streams(device);
  for (int id = 0; id < (include_communication ? kStreamsPerDevice : kFirstCommunicationStream); ++id)
    if (Stream* s = ds.streams[id].load(std::memory_order_acquire)) s->wait_until(s->enqueued());
}

bool device_capturing(int device) {
  DeviceStreams& ds = device_streams(device);
  for (auto& slot : ds.streams)
    if (Stream* s = slot.load(std::memory_order_acquire); s && s->capturing()) return true;
  return false;
}

void synchronize_device(int device) {
  wait_device_idle(device);
  DeviceStreams& ds = device_streams(device);
  for (auto& slot : ds.streams)
    if (Stream* s = slot.load(std::memory_order_acquire)) s->rethrow_error();
}

}  // namespace torchneuron::runtime
