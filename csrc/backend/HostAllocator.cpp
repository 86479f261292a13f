#include "HostAllocator.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "Current.h"

namespace torchneuron::backend {

namespace {

struct HostBlock {
  void* ptr;
  size_t size;
  bool in_use = false;
  std::vector<runtime::Event> events;  // copies still reading or writing it
};

size_t round_pow2(size_t n) {
  size_t r = 4096;
  while (r < n) r <<= 1;
  return r;
}

class PinnedAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return at::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    size_t size = round_pow2(nbytes);
    HostBlock* block = nullptr;
    auto it = free_.find(size);
    if (it != free_.end()) {
      block = it->second;
      free_.erase(it);
    } else {
      void* p = std::aligned_alloc(4096, size);
      TORCH_CHECK_WITH(OutOfMemoryError, p, "pinned host memory: out of memory allocating ", size, " bytes");
      block = new HostBlock{p, size};
      blocks_[reinterpret_cast<uintptr_t>(p)] = block;
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(size);
      stats_.num_host_alloc++;
    }
    block->in_use = true;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    return at::DataPtr(block->ptr, block, &deleter, c10::Device(c10::DeviceType::CPU));
  }

  at::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!lookup_locked(ptr)) return false;
    }
    // Recorded without the lock: a record flushes the stream's deferred work
    // (adaptive eager), whose tensors may hold pinned memory this allocator frees.
    runtime::Event event;
    event.record(runtime_stream(stream));
    std::lock_guard<std::mutex> lock(mutex_);
    auto* block = lookup_locked(ptr);  // the caller's tensor keeps the block allocated
    if (!block) return false;
    block->events.push_back(std::move(event));
    return true;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    for (auto& [size, block] : free_) {
      blocks_.erase(reinterpret_cast<uintptr_t>(block->ptr));
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(block->size);
      stats_.num_host_free++;
      std::free(block->ptr);
      delete block;
    }
    free_.clear();
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_accumulated();
    stats_.num_host_alloc = stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_peak();
  }

  bool is_pinned(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return lookup_locked(ptr) != nullptr;
  }

  void free(HostBlock* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    block->in_use = false;
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(block->size);
    if (block->events.empty()) free_.emplace(block->size, block);
    else pending_.push_back(block);
  }

 private:
  static void deleter(void* ctx);

  HostBlock* lookup_locked(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return nullptr;
    --it;
    return p < it->first + it->second->size ? it->second : nullptr;
  }

  void process_events() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      HostBlock* b = *it;
      bool done = true;
      for (auto& e : b->events) done = done && e.query();
      if (!done) {
        ++it;
        continue;
      }
      b->events.clear();
      free_.emplace(b->size, b);
      it = pending_.erase(it);
    }
  }

  std::mutex mutex_;
  std::map<uintptr_t, HostBlock*> blocks_;
  std::multimap<size_t, HostBlock*> free_;
  std::vector<HostBlock*> pending_;
  at::HostStats stats_;
};

PinnedAllocator g_pinned;

void PinnedAllocator::deleter(void* ctx) { g_pinned.free(static_cast<HostBlock*>(ctx)); }

}  // namespace

at::HostAllocator& pinned_allocator() { return g_pinned; }
bool is_pinned_ptr(const void* ptr) { return g_pinned.is_pinned(ptr); }

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_pinned)

}  // namespace torchneuron::backend
