#include "Allocator.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/util/Exception.h>

#include "Current.h"
#include "../profiler/Recorder.h"

namespace torchneuron::backend {

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

// Size classes follow CUDA's caching allocator, whose behaviour users know.
constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1 << 20;         // requests up to 1 MiB use the small pool
constexpr size_t kSmallBuffer = 2 << 20;       // small pool segments
constexpr size_t kLargeBuffer = 20 << 20;      // segments for requests below kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;

struct Block {
  c10::DeviceIndex device;
  int stream;  // stream id the block is ordered on
  size_t size;
  size_t requested = 0;
  void* ptr;
  bool small;
  bool allocated = false;
  // In its free pool: the only state in which a neighbour may absorb it. A
  // freed block waiting for other streams' events, or held by a graph's
  // memory pool, is not allocated either, and must keep its identity.
  bool pooled = false;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  std::unordered_set<int> stream_uses;  // other streams (record_stream)
  std::vector<runtime::Event> pending;  // events to pass before reuse
  uint64_t pool = 0;                    // graph memory pool it was allocated in (0: none)
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

size_t round_size(size_t n) { return n < kMinBlockSize ? kMinBlockSize : (n + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize; }
size_t segment_size(size_t n) {
  if (n <= kSmallSize) return kSmallBuffer;
  if (n < kMinLargeAlloc) return kLargeBuffer;
  return (n + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

std::string format_size(size_t bytes) {
  char buf[64];
  if (bytes >= (size_t(1) << 30)) snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1 << 30));
  else if (bytes >= (size_t(1) << 20)) snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(1 << 20));
  else if (bytes >= 1024) snprintf(buf, sizeof buf, "%.2f KiB", double(bytes) / 1024.0);
  else snprintf(buf, sizeof buf, "%zu bytes", bytes);
  return buf;
}

void update(c10::CachingAllocator::StatArray& stat, bool small, int64_t delta) {
  for (auto type : {StatType::AGGREGATE, small ? StatType::SMALL_POOL : StatType::LARGE_POOL}) {
    auto& s = stat[size_t(type)];
    if (delta >= 0) s.increase(size_t(delta));
    else s.decrease(size_t(-delta));
  }
}

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}

  // `source`: the op and line to record the allocation with while profiling
  // (found before taking the lock: finding it takes the GIL).
  Block* malloc(size_t requested, int stream, uint64_t graph_pool, profiler::Source source = {}) {
    std::unique_lock<std::mutex> lock(mutex_);
    process_pending();
    size_t size = round_size(requested);
    if (graph_pool) {
      if (Block* reused = take_freed_graph_block(graph_pool, size)) {
        update(stats_.requested_bytes, reused->small, int64_t(requested) - int64_t(reused->requested));
        reused->requested = requested;
        return reused;
      }
    }
    bool small = size <= kSmallSize;
    auto& pool = small ? small_pool_ : large_pool_;
    Block* block = find_free(pool, stream, size);
    if (!block) block = new_segment(size, small, stream);
    if (!block) {
      // Free every cached segment and retry once, as CUDA does. The wait for
      // the device happens unlocked, so other threads can free meanwhile.
      stats_.num_alloc_retries++;
      lock.unlock();
      runtime::wait_device_idle(device_);
      lock.lock();
      release_cached();
      block = find_free(pool, stream, size);
      if (!block) block = new_segment(size, small, stream);
    }
    if (!block) raise_oom(requested);

    size_t remaining = block->size - size;
    if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
      // Split: the tail stays in the pool as an inactive split.
      auto* tail = new Block{device_, stream, remaining, 0, static_cast<char*>(block->ptr) + size, small};
      tail->prev = block;
      tail->next = block->next;
      if (tail->next) tail->next->prev = tail;
      block->next = tail;
      block->size = size;
      tail->pooled = true;
      pool.insert(tail);
    }
    block->allocated = true;
    block->requested = requested;
    block->pool = graph_pool;
    update(stats_.allocation, small, 1);
    update(stats_.allocated_bytes, small, int64_t(block->size));
    update(stats_.active, small, 1);
    update(stats_.active_bytes, small, int64_t(block->size));
    update(stats_.requested_bytes, small, int64_t(requested));
    if (profiler::recording()) record(block, int64_t(block->size), source);
    return block;
  }

  void free(Block* block) {
    std::vector<int> uses;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (block->pool) {
        // Graph memory: replays still write it, so it stays the pool's (and
        // counts as allocated) until the last graph using the pool is reset.
        // Later allocations of captures into the same pool may take it: replays
        // run in capture order, so the earlier uses are done by then (as CUDA's
        // graph pools assume).
        auto it = pools_.find(block->pool);
        if (it != pools_.end()) return it->second.held.push_back(block);
        block->pool = 0;
      }
      uses = free_locked(block);
    }
    if (!uses.empty()) wait_for_uses(block, uses);
  }

  void retain_pool(uint64_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    pools_[pool].users++;
  }
  void release_pool(uint64_t pool) {
    std::vector<std::pair<Block*, std::vector<int>>> used;  // blocks other streams still use
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pools_.find(pool);
      if (it == pools_.end() || --it->second.users > 0) return;
      auto held = std::move(it->second.held);
      pools_.erase(it);
      for (Block* b : held) {
        b->pool = 0;
        if (auto uses = free_locked(b); !uses.empty()) used.emplace_back(b, std::move(uses));
      }
    }
    for (auto& [b, uses] : used) wait_for_uses(b, uses);
  }

 private:
  // The smallest block of the pool freed since its capture that fits `size`
  // without wasting more than half of it.
  Block* take_freed_graph_block(uint64_t pool, size_t size) {
    auto it = pools_.find(pool);
    if (it == pools_.end()) return nullptr;
    auto& held = it->second.held;
    auto best = held.end();
    for (auto b = held.begin(); b != held.end(); ++b)
      if ((*b)->size >= size && (*b)->size <= 2 * size && (best == held.end() || (*b)->size < (*best)->size)) best = b;
    if (best == held.end()) return nullptr;
    Block* block = *best;
    held.erase(best);
    return block;
  }

  // Marks the block free. Returns the other streams still using it (their
  // events must be passed before reuse: wait_for_uses), or releases it to its
  // pool at once.
  std::vector<int> free_locked(Block* block) {
    block->allocated = false;
    update(stats_.allocation, block->small, -1);
    update(stats_.allocated_bytes, block->small, -int64_t(block->size));
    update(stats_.requested_bytes, block->small, -int64_t(block->requested));
    // Frees run on any thread (often a stream worker): no source line.
    if (profiler::recording()) record(block, -int64_t(block->size), {});
    if (block->stream_uses.empty()) {
      release_to_pool(block);
      return {};
    }
    std::vector<int> uses(block->stream_uses.begin(), block->stream_uses.end());
    block->stream_uses.clear();
    return uses;
  }

  // Records an event on each stream that still uses a freed block; the block
  // is reused once they have passed. The events go after the work enqueued
  // so far, without flushing deferred work (see Event::record_enqueued).
  void wait_for_uses(Block* block, const std::vector<int>& uses) {
    std::vector<runtime::Event> events(uses.size());
    for (size_t i = 0; i < uses.size(); ++i) events[i].record_enqueued(runtime::get_stream(device_, uses[i]));
    std::lock_guard<std::mutex> lock(mutex_);
    block->pending = std::move(events);
    pending_.push_back(block);
  }

 public:
  void record_stream(Block* block, int stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stream != block->stream) block->stream_uses.insert(stream);
  }

  void empty_cache() {
    runtime::wait_device_idle(device_);  // see release_cached()
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending();
    release_cached();
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats s = stats_;
    // Free pieces of split segments, counted on demand (pools are small).
    for (const Pool* pool : {&small_pool_, &large_pool_})
      for (const Block* b : *pool)
        if (b->prev || b->next) {
          update(s.inactive_split, b->small, 1);
          update(s.inactive_split_bytes, b->small, int64_t(b->size));
        }
    return s;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* arr : all_arrays())
      for (auto& s : *arr) s.reset_peak();
  }
  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* arr : all_arrays())
      for (auto& s : *arr) s.reset_accumulated();
    stats_.num_alloc_retries = stats_.num_ooms = 0;
    stats_.num_device_alloc = stats_.num_device_free = 0;
  }

 private:
  using Pool = std::set<Block*, BlockLess>;

  std::vector<c10::CachingAllocator::StatArray*> all_arrays() {
    return {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
            &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
            &stats_.inactive_split_bytes, &stats_.requested_bytes};
  }

  Block* find_free(Pool& pool, int stream, size_t size) {
    Block key{device_, stream, size, 0, nullptr, false};
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    // Do not carve a small request out of a huge cached segment (fragmentation).
    if (!b->small && size < kMinLargeAlloc && b->size >= kMinLargeAlloc && b->size > 2 * segment_size(size))
      return nullptr;
    pool.erase(it);
    b->pooled = false;
    return b;
  }

  Block* new_segment(size_t size, bool small, int stream) {
    size_t bytes = segment_size(size);
    void* p = runtime::device_malloc(device_, bytes);
    if (!p) return nullptr;
    stats_.num_device_alloc++;
    update(stats_.segment, small, 1);
    update(stats_.reserved_bytes, small, int64_t(bytes));
    return new Block{device_, stream, bytes, 0, p, small};
  }

  void release_to_pool(Block* block) {
    update(stats_.active, block->small, -1);
    update(stats_.active_bytes, block->small, -int64_t(block->size));
    auto& pool = block->small ? small_pool_ : large_pool_;
    for (Block* neighbour : {block->prev, block->next}) {
      if (!neighbour || !neighbour->pooled) continue;
      pool.erase(neighbour);
      if (neighbour == block->prev) {
        block->ptr = neighbour->ptr;
        block->prev = neighbour->prev;
        if (block->prev) block->prev->next = block;
      } else {
        block->next = neighbour->next;
        if (block->next) block->next->prev = block;
      }
      block->size += neighbour->size;
      delete neighbour;
    }
    block->pooled = true;
    pool.insert(block);
  }

  void process_pending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      Block* b = *it;
      bool done = std::all_of(b->pending.begin(), b->pending.end(), [](const runtime::Event& e) { return e.query(); });
      if (!done) {
        ++it;
        continue;
      }
      b->pending.clear();
      it = pending_.erase(it);
      release_to_pool(b);
    }
  }

  // Callers wait for the device first (unlocked): freed blocks may still be
  // in use by queued tasks of their own stream (reuse is stream-ordered,
  // release is not), as cudaFree waits.
  void release_cached() {
    // Blocks still used by other streams can be released too now.
    for (Block* b : pending_)
      for (auto& e : b->pending) e.synchronize();
    process_pending();
    for (Pool* pool : {&small_pool_, &large_pool_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {
          ++it;
          continue;
        }
        it = pool->erase(it);
        runtime::device_free(device_, b->ptr, b->size);
        stats_.num_device_free++;
        update(stats_.segment, b->small, -1);
        update(stats_.reserved_bytes, b->small, -int64_t(b->size));
        delete b;
      }
    }
  }

  [[noreturn]] void raise_oom(size_t requested) {
    stats_.num_ooms++;
    size_t capacity = runtime::device_capacity(device_);
    size_t allocated = size_t(stats_.allocated_bytes[0].current);
    size_t reserved = size_t(stats_.reserved_bytes[0].current);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", int(device_), " out of memory: tried to allocate ",
                     format_size(requested), " (capacity ", format_size(capacity), ", ", format_size(allocated),
                     " allocated, ", format_size(reserved - allocated),
                     " cached). Free tensors you no longer need, reduce the batch size, or raise "
                     "TORCHNEURON_DEVICE_MEMORY.");
  }

  const c10::DeviceIndex device_;
  std::mutex mutex_;
  Pool small_pool_, large_pool_;
  std::vector<Block*> pending_;
  DeviceStats stats_;

  // Under mutex_, so the totals and the order of events are the allocator's.
  void record(const Block* block, int64_t bytes, profiler::Source source) {
    profiler::record_memory(device_, block->ptr, bytes, stats_.allocated_bytes[0].current,
                            stats_.reserved_bytes[0].current, source);
  }
  struct GraphPool {
    int users = 0;
    std::vector<Block*> held;  // freed by their tensors, still used by graphs
  };
  std::unordered_map<uint64_t, GraphPool> pools_;
};

std::vector<std::unique_ptr<DeviceCache>>& caches() {
  static auto* v = [] {
    auto* caches = new std::vector<std::unique_ptr<DeviceCache>>();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) caches->push_back(std::make_unique<DeviceCache>(d));
    return caches;
  }();
  return *v;
}

DeviceCache& cache(c10::DeviceIndex device) {
  check_device_index(device);
  return *caches()[device];
}

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  cache(block->device).free(block);
}

}  // namespace

c10::DataPtr CachingAllocator::allocate_on(c10::DeviceIndex device, size_t nbytes) {
  lazy_init();
  c10::Device dev(kNeuron, device);
  if (nbytes == 0) return c10::DataPtr(nullptr, dev);
  c10::Stream current = current_stream(device);
  // Allocations of a capturing stream belong to its graph's memory pool.
  // (lazy_init above: the runtime stream is looked up directly, as on every allocation.)
  uint64_t pool = runtime::get_stream(device, int(current.id())).capture_tag();
  Block* block = cache(device).malloc(nbytes, int(current.id()), pool,
                                      profiler::recording() ? profiler::current_source() : profiler::Source{});
  return c10::DataPtr(block->ptr, block, &free_block, dev);
}

c10::DataPtr CachingAllocator::allocate(size_t nbytes) { return allocate_on(current_device(), nbytes); }

c10::DeleterFnPtr CachingAllocator::raw_deleter() const { return nullptr; }

void CachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  // Device-to-device copy for the allocator's callers (e.g. storage clone),
  // ordered on the current stream and completed before returning.
  auto& stream = runtime_stream(current_stream());
  constexpr std::string_view kName = "copy_ (device to device)";
  auto record = profiler::recording() ? profiler::record_task(kName, stream.device(), stream.id(),
                                                              {runtime::TaskKind::kCopy, int64_t(count), int64_t(count)})
                                      : nullptr;
  stream.enqueue([=] { std::memcpy(runtime::host_address(dest), runtime::host_address(src), count); },
                 std::move(record));
  profiler::SyncScope sync(kName, stream.device(), stream.id());
  stream.synchronize();
}

bool CachingAllocator::owns(const c10::DataPtr& ptr) const { return ptr.get_deleter() == &free_block; }

void CachingAllocator::emptyCache(c10::MempoolId_t) {
  for (auto& c : caches()) c->empty_cache();
}

void CachingAllocator::retain_graph_pool(c10::DeviceIndex device, uint64_t pool) { cache(device).retain_pool(pool); }
void CachingAllocator::release_graph_pool(c10::DeviceIndex device, uint64_t pool) { cache(device).release_pool(pool); }

void CachingAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (!owns(ptr)) return;  // e.g. empty tensors
  auto* block = static_cast<Block*>(ptr.get_context());
  TORCH_CHECK(stream.device_index() == block->device, "record_stream: stream is on neuron:", int(stream.device_index()),
              " but the tensor is on neuron:", int(block->device));
  cache(block->device).record_stream(block, int(stream.id()));
}

DeviceStats CachingAllocator::getDeviceStats(c10::DeviceIndex device) { return cache(device).stats(); }
void CachingAllocator::resetAccumulatedStats(c10::DeviceIndex device) { cache(device).reset_accumulated(); }
void CachingAllocator::resetPeakStats(c10::DeviceIndex device) { cache(device).reset_peak(); }

std::pair<size_t, size_t> CachingAllocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device_index(device);
  size_t total = runtime::device_capacity(device);
  return {total - runtime::device_bytes_in_use(device), total};
}

CachingAllocator& caching_allocator() {
  static CachingAllocator allocator;
  return allocator;
}

namespace {
struct Registration {
  Registration() { c10::SetAllocator(kNeuron, &caching_allocator()); }
} registration;
}  // namespace

}  // namespace torchneuron::backend
