#include "Diagnostics.h"

#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace torchneuron::distributed {

namespace {
std::string progress_key(int rank) { return "neuron_progress/" + std::to_string(rank); }
}  // namespace

struct ProgressPublisher::State {
  c10::intrusive_ptr<c10d::Store> store;
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t reached = 0;
  bool stopping = false;
};

ProgressPublisher::ProgressPublisher(c10::intrusive_ptr<c10d::Store> store, int rank)
    : state_(std::make_shared<State>()), rank_(rank) {
  state_->store = std::move(store);
  std::thread([state = state_, key = progress_key(rank)] {
    uint64_t published = 0;
    std::unique_lock<std::mutex> lock(state->mutex);
    while (!state->stopping) {
      state->cv.wait_for(lock, std::chrono::milliseconds(100));
      uint64_t reached = state->reached;
      if (reached == published || state->stopping) continue;
      lock.unlock();
      try {
        state->store->set(key, std::to_string(reached));
        published = reached;
      } catch (const std::exception&) {
        // The store is gone (its host exited): a failure report says so.
      }
      lock.lock();
    }
  }).detach();  // the thread owns its state, so no one waits on a dead store
}

ProgressPublisher::~ProgressPublisher() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->cv.notify_all();
}

void ProgressPublisher::reached(uint64_t seq) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (seq > state_->reached) state_->reached = seq;
}

std::vector<std::pair<int, uint64_t>> ProgressPublisher::behind(uint64_t seq, int size) const {
  std::vector<std::pair<int, uint64_t>> out;
  for (int r = 0; r < size; ++r) {
    if (r == rank_) continue;
    uint64_t reached = 0;
    if (state_->store->check({progress_key(r)})) {
      auto bytes = state_->store->get(progress_key(r));
      reached = std::stoull(std::string(bytes.begin(), bytes.end()));
    }
    if (reached < seq) out.emplace_back(r, reached);
  }
  return out;
}

namespace {

std::mutex inflight_mutex;
std::map<std::thread::id, std::string> inflight;
std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void on_terminate() {
  std::unique_lock<std::mutex> lock(inflight_mutex, std::try_to_lock);
  if (lock.owns_lock())
    for (const auto& [thread, what] : inflight)
      std::fprintf(stderr,
                   "torchneuron: aborting during %s. Gloo aborts the process when ranks pass tensors of different "
                   "sizes to a collective; with TORCH_DISTRIBUTED_DEBUG=DETAIL the ranks compare shapes first and "
                   "raise an error instead.\n",
                   what.c_str());
  if (previous_terminate) previous_terminate();
  std::abort();
}

}  // namespace

InFlight::InFlight(std::string what) {
  static std::once_flag installed;
  std::call_once(installed, [] { previous_terminate = std::set_terminate(on_terminate); });
  std::lock_guard<std::mutex> lock(inflight_mutex);
  inflight[std::this_thread::get_id()] = std::move(what);
}

InFlight::~InFlight() {
  std::lock_guard<std::mutex> lock(inflight_mutex);
  inflight.erase(std::this_thread::get_id());
}

}  // namespace torchneuron::distributed
