#include "TaskWarnings.h"

#include <atomic>
#include <mutex>
#include <vector>

namespace torchneuron::backend {
namespace {

std::mutex g_mutex;
std::vector<c10::Warning> g_pending;  // guarded by g_mutex
std::atomic<bool> g_has_pending{false};

struct QueueingHandler final : c10::WarningHandler {
  void process(const c10::Warning& warning) override {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_pending.push_back(warning);
    g_has_pending.store(true, std::memory_order_release);
  }
};

QueueingHandler g_handler;

}  // namespace

void queue_warnings_of_this_thread() { c10::WarningUtils::set_warning_handler(&g_handler); }

bool deliver_task_warnings() {
  if (!g_has_pending.load(std::memory_order_acquire)) return false;
  std::vector<c10::Warning> warnings;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    warnings.swap(g_pending);
    g_has_pending.store(false, std::memory_order_release);
  }
  for (const auto& w : warnings) c10::warn(w);
  return !warnings.empty();
}

}  // namespace torchneuron::backend
