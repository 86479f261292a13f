// While a fused segment's compiled program runs on the host, the tasks it
// launches are collected into one device task instead of being enqueued.
#pragma once

#include <stdexcept>
#include <string_view>
#include <vector>

#include "../runtime/Stream.h"

namespace torchneuron::adaptive {

struct Collector {
  std::vector<runtime::Stream::Task> tasks;
  bool aborted = false;  // see ReplayAborted
};

// The collector of this thread, null outside a fused program.
inline thread_local Collector* t_collector = nullptr;

// A fused program launched something that cannot be collected (a
// synchronous op): this occurrence of the segment runs op by op instead.
// The thrower also sets its collector's `aborted`, which survives the
// exception's translation to a Python error and back.
struct ReplayAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace torchneuron::adaptive
