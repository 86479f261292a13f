// The device caching allocator (a c10::DeviceAllocator): stream-ordered block
// reuse with splitting and coalescing, record_stream, empty_cache and the
// CUDA-style statistics, on top of runtime::device_malloc.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

namespace torchneuron::backend {

class CachingAllocator : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Allocates on an explicit device (the current stream of that device).
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);
  // Graph memory pools (non-zero ids). Blocks allocated while a stream
  // captures into a pool serve only captures into that pool until the last
  // graph holding the pool releases it: replays keep writing them.
  void retain_graph_pool(c10::DeviceIndex device, uint64_t pool);
  void release_graph_pool(c10::DeviceIndex device, uint64_t pool);
  // Whether `ptr` was produced by this allocator.
  bool owns(const c10::DataPtr& ptr) const;
};

CachingAllocator& caching_allocator();

}  // namespace torchneuron::backend
