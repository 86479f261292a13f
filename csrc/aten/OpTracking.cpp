#include "OpTracking.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchneuron::aten {

namespace {
std::mutex g_mutex;
std::unordered_map<std::string, std::unique_ptr<OpCounters>>& table() {
  static auto* t = new std::unordered_map<std::string, std::unique_ptr<OpCounters>>();
  return *t;
}

template <typename Field>
std::map<std::string, int64_t> collect(Field field) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, int64_t> out;
  for (auto& [name, c] : table())
    if (int64_t n = (c.get()->*field).load(std::memory_order_relaxed)) out[name] = n;
  return out;
}
}  // namespace

OpCounters& op_counters(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& slot = table()[op_name];
  if (!slot) slot = std::make_unique<OpCounters>();
  return *slot;
}

std::map<std::string, int64_t> executed_ops() { return collect(&OpCounters::executed); }
std::map<std::string, int64_t> fallback_ops() { return collect(&OpCounters::fallback); }

void clear_op_tracking() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [name, c] : table()) {
    c->executed = 0;
    c->fallback = 0;
  }
}

}  // namespace torchneuron::aten
