// Devices and their memory. Emulated HBM is host memory with a capacity:
// allocations beyond it fail exactly as a real device's would.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "Runtime.h"

namespace torchneuron::runtime {

namespace {

constexpr size_t kAlignment = 512;  // like the device's DMA alignment

struct DeviceMemory {
  size_t capacity = 0;
  std::atomic<size_t> in_use{0};
};

size_t host_ram_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(16) << 30;
}

std::vector<DeviceMemory>& memories() {
  static std::vector<DeviceMemory>* m = [] {
    const Config& c = config();
    auto* v = new std::vector<DeviceMemory>(c.visible_cores.size());
    size_t capacity = c.device_memory_bytes;
    if (capacity == 0) {
      // The platform's per-core HBM share, capped so that all devices
      // together fit in half of host RAM.
      size_t n = std::max<size_t>(1, v->size());
      capacity = std::min(platform().hbm_per_core_bytes(), host_ram_bytes() / 2 / n);
    }
    for (auto& d : *v) d.capacity = capacity;
    return v;
  }();
  return *m;
}

// Live allocations by start address, to answer device_of_pointer().
std::mutex g_registry_mutex;
std::map<uintptr_t, std::pair<size_t, int>> g_registry;

}  // namespace

int device_count() { return int(config().visible_cores.size()); }

int physical_core(int device) {
  check_device(device);
  return config().visible_cores[device];
}

void check_device(int device) {
  const Config& c = config();
  if (!c.error.empty()) throw std::runtime_error("neuron runtime: invalid environment: " + c.error);
  if (device < 0 || device >= int(c.visible_cores.size()))
    throw std::out_of_range("invalid neuron device index " + std::to_string(device) + ": " +
                            std::to_string(c.visible_cores.size()) + " device(s) visible");
}

void* device_malloc(int device, size_t nbytes) {
  check_device(device);
  DeviceMemory& mem = memories()[device];
  size_t rounded = (std::max<size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  size_t used = mem.in_use.load();
  do {
    if (used + rounded > mem.capacity) return nullptr;
  } while (!mem.in_use.compare_exchange_weak(used, used + rounded));
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) {
    mem.in_use -= rounded;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_registry[reinterpret_cast<uintptr_t>(p)] = {rounded, device};
  return p;
}

void device_free(int device, void* ptr, size_t nbytes) {
  if (!ptr) return;
  size_t rounded;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    auto it = g_registry.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_registry.end()) throw std::invalid_argument("device_free: pointer is not a device allocation");
    rounded = it->second.first;
    g_registry.erase(it);
  }
  (void)nbytes;
  std::free(ptr);
  memories()[device].in_use -= rounded;
}

size_t device_capacity(int device) {
  check_device(device);
  return memories()[device].capacity;
}

size_t device_bytes_in_use(int device) {
  check_device(device);
  return memories()[device].in_use.load();
}

int device_of_pointer(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = g_registry.upper_bound(p);
  if (it == g_registry.begin()) return -1;
  --it;
  return p < it->first + it->second.first ? it->second.second : -1;
}

}  // namespace torchneuron::runtime
