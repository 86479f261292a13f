// Environment configuration, parsed once, in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchneuron::runtime {

struct Config {
  std::vector<int> visible_cores;   // physical core ids, one per logical device
  std::string platform_target;      // "trn2" or "trn3"
  size_t device_memory_bytes = 0;   // per device; 0 = derive from platform and host RAM
  bool launch_blocking = false;     // NEURON_LAUNCH_BLOCKING
  bool compile_strict = false;       // TORCHNEURON_COMPILE_STRICT: a graph that fails to compile raises
  bool nki_batch = true;            // TORCHNEURON_NKI_BATCH: NKI affine_range loops and grids may run batched
  int log_level = 0;                // TORCHNEURON_LOG_LEVEL (0 = silent)
  int worker_threads = 0;           // TORCHNEURON_WORKER_THREADS: intra-op threads per worker (0: torch's)
  // Adaptive eager (TORCHNEURON_ADAPTIVE_*): on at start-up, and its tunables'
  // starting values (torchneuron.adaptive.configure changes them).
  bool adaptive_eager = false;             // _EAGER
  int64_t adaptive_hot = 2;                // _HOT: occurrences that make a segment hot
  int64_t adaptive_max_ops = 1024;         // _MAX_OPS: ops at which a segment flushes
  double adaptive_idle_ms = 5;             // _IDLE_MS: idle time after which it flushes
  double adaptive_compile_timeout_s = 300; // _COMPILE_TIMEOUT: longest compile of one segment
  std::string error;                // non-empty when the environment is invalid
};

// Parsed on first call; thread-safe.
const Config& config();

// "1.5GiB", "512MiB", "4096" (bytes) -> bytes; throws std::invalid_argument.
size_t parse_bytes(const std::string& text);
// "0-1", "1", "0,2-3" -> {0,1}, {1}, {0,2,3}; throws std::invalid_argument.
std::vector<int> parse_core_list(const std::string& text);

}  // namespace torchneuron::runtime
