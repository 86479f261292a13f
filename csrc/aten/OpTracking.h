// Which ATen ops ran on neuron, and which needed a host round trip.
// Counting is a relaxed atomic increment on a per-op record: cheap enough to
// stay on for every launch.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace torchneuron::aten {

struct OpCounters {
  std::atomic<int64_t> executed{0};
  std::atomic<int64_t> fallback{0};  // results computed on the host and uploaded
};

// The record for an op name; stable for the life of the process.
OpCounters& op_counters(const std::string& op_name);
std::map<std::string, int64_t> executed_ops();
std::map<std::string, int64_t> fallback_ops();
void clear_op_tracking();

}  // namespace torchneuron::aten
