#include "Config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace torchneuron::runtime {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The whole of `text` as a non-negative integer, or -1.
int parse_count(const std::string& text) {
  if (text.empty() || text.size() > 6) return -1;
  for (char ch : text)
    if (ch < '0' || ch > '9') return -1;
  return std::stoi(text);
}

// The whole of `text` as a positive number (an integer if `integer`);
// throws std::invalid_argument naming the variable and what it expects.
double parse_positive(const char* name, const std::string& text, bool integer, const char* unit) {
  size_t pos = 0;
  double value = -1;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != text.size() || !(value > 0) || value > 1e12 || (integer && value != double(int64_t(value))))
    throw std::invalid_argument(std::string(name) + "='" + text + "': expected a positive " +
                                (integer ? "integer" : "number") + unit);
  return value;
}

Config parse() {
  Config c;
  try {
    c.platform_target = env("NEURON_PLATFORM_TARGET_OVERRIDE");
    if (c.platform_target.empty()) c.platform_target = "trn2";
    if (c.platform_target != "trn2" && c.platform_target != "trn3")
      throw std::invalid_argument("NEURON_PLATFORM_TARGET_OVERRIDE='" + c.platform_target +
                                  "': expected trn2 or trn3");

    std::string visible = env("NEURON_RT_VISIBLE_CORES");
    std::string num = env("NEURON_RT_NUM_CORES");
    if (!visible.empty()) {
      c.visible_cores = parse_core_list(visible);
      if (!num.empty() && parse_count(num) != int(c.visible_cores.size()))
        throw std::invalid_argument("NEURON_RT_NUM_CORES=" + num + " disagrees with NEURON_RT_VISIBLE_CORES='" +
                                    visible + "' (" + std::to_string(c.visible_cores.size()) + " cores)");
    } else {
      int n = num.empty() ? 2 : parse_count(num);
      if (n < 0 || n > 64)
        throw std::invalid_argument("NEURON_RT_NUM_CORES='" + num + "': expected an integer in [0, 64]");
      for (int i = 0; i < n; ++i) c.visible_cores.push_back(i);
    }

    std::string mem = env("TORCHNEURON_DEVICE_MEMORY");
    if (!mem.empty()) c.device_memory_bytes = parse_bytes(mem);

    std::string blocking = env("NEURON_LAUNCH_BLOCKING");
    c.launch_blocking = !blocking.empty() && blocking != "0";
    std::string strict = env("TORCHNEURON_COMPILE_STRICT");
    c.compile_strict = !strict.empty() && strict != "0";
    std::string nki_batch = env("TORCHNEURON_NKI_BATCH");
    c.nki_batch = nki_batch.empty() || nki_batch != "0";

    std::string threads = env("TORCHNEURON_WORKER_THREADS");
    if (!threads.empty()) {
      c.worker_threads = parse_count(threads);
      if (c.worker_threads < 1 || c.worker_threads > 256)
        throw std::invalid_argument("TORCHNEURON_WORKER_THREADS='" + threads + "': expected an integer in [1, 256]");
    }

    std::string adaptive = env("TORCHNEURON_ADAPTIVE_EAGER");
    c.adaptive_eager = !adaptive.empty() && adaptive != "0";
    struct Tunable {
      const char* name;
      bool integer;
      const char* unit;
      double* value;
    };
    double hot = double(c.adaptive_hot), max_ops = double(c.adaptive_max_ops);
    for (const Tunable& t : {Tunable{"TORCHNEURON_ADAPTIVE_HOT", true, "", &hot},
                             Tunable{"TORCHNEURON_ADAPTIVE_MAX_OPS", true, "", &max_ops},
                             Tunable{"TORCHNEURON_ADAPTIVE_IDLE_MS", false, " of milliseconds", &c.adaptive_idle_ms},
                             Tunable{"TORCHNEURON_ADAPTIVE_COMPILE_TIMEOUT", false, " of seconds",
                                     &c.adaptive_compile_timeout_s}}) {
      std::string text = env(t.name);
      if (!text.empty()) *t.value = parse_positive(t.name, text, t.integer, t.unit);
    }
    c.adaptive_hot = int64_t(hot);
    c.adaptive_max_ops = int64_t(max_ops);

    std::string level = env("TORCHNEURON_LOG_LEVEL");
    if (!level.empty()) c.log_level = std::atoi(level.c_str());
  } catch (const std::exception& e) {
    c.error = e.what();
    c.visible_cores.clear();
  }
  return c;
}

}  // namespace

const Config& config() {
  static const Config c = parse();
  return c;
}

size_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("TORCHNEURON_DEVICE_MEMORY='" + text + "': expected bytes such as 4GiB, 512MiB or 1048576");
  }
  std::string unit = text.substr(pos);
  for (auto& ch : unit) ch = char(std::tolower(ch));
  double scale = 1;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else
    throw std::invalid_argument("TORCHNEURON_DEVICE_MEMORY='" + text + "': unknown unit '" + unit + "'");
  if (value <= 0) throw std::invalid_argument("TORCHNEURON_DEVICE_MEMORY='" + text + "': must be positive");
  return size_t(value * scale);
}

std::vector<int> parse_core_list(const std::string& text) {
  std::vector<int> cores;
  size_t start = 0;
  auto bad = [&]() {
    return std::invalid_argument("NEURON_RT_VISIBLE_CORES='" + text + "': expected a list such as 0-1, 1 or 0,2-3");
  };
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part.empty()) throw bad();
    size_t dash = part.find('-');
    int lo = parse_count(part.substr(0, dash));
    int hi = dash == std::string::npos ? lo : parse_count(part.substr(dash + 1));
    if (lo < 0 || hi < lo || hi > 63) throw bad();
    for (int i = lo; i <= hi; ++i) {
      if (std::find(cores.begin(), cores.end(), i) != cores.end())
        throw std::invalid_argument("NEURON_RT_VISIBLE_CORES='" + text + "': core " + std::to_string(i) +
                                    " is listed twice");
      cores.push_back(i);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return cores;
}

}  // namespace torchneuron::runtime
