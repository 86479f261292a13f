#include "Python.h"

#include "Adaptive.h"
#include "Engine.h"

namespace torchneuron::adaptive {

namespace py = pybind11;

void bind(py::module& m) {
  m.def("_adaptive_enabled", [] { return enabled(); });
  m.def("_adaptive_set_enabled", &set_enabled);
  m.def("_adaptive_set_engine", &set_engine);
  m.def("_adaptive_settings", [] {
    auto& s = settings();
    return py::make_tuple(s.hot.load(), s.max_ops.load(), double(s.idle_ns.load()) / 1e6,
                          double(s.compile_timeout_ms.load()) / 1e3);
  });
  m.def("_adaptive_configure", [](int64_t hot, int64_t max_ops, double idle_ms, double compile_timeout) {
    TORCH_CHECK_VALUE(hot >= 1 && max_ops >= 1 && idle_ms > 0 && compile_timeout > 0,
                      "adaptive eager: hot and max_ops must be at least 1, idle_ms and compile_timeout positive; "
                      "got hot=", hot, ", max_ops=", max_ops, ", idle_ms=", idle_ms, ", compile_timeout=",
                      compile_timeout);
    auto& s = settings();
    s.hot = hot;
    s.max_ops = max_ops;
    s.idle_ns = int64_t(idle_ms * 1e6);
    s.compile_timeout_ms = std::max<int64_t>(1, int64_t(compile_timeout * 1e3));
  });
  m.def("_adaptive_compile_done", &compile_done);
  m.def("_adaptive_metrics", [] {
    const auto& s = metrics();
    py::dict d;
    d["segments"] = s.segments.load();
    d["ops_deferred"] = s.ops_deferred.load();
    d["distinct_segments"] = s.signatures.load();
    d["hot"] = s.hot.load();
    d["compiled"] = s.compiled.load();
    d["replays"] = s.replays.load();
    d["ops_replayed"] = s.ops_replayed.load();
    d["launches_saved"] = s.launches_saved.load();
    d["aborted_replays"] = s.aborted_replays.load();
    d["intermediates_elided"] = s.intermediates_elided.load();
    d["compile_seconds"] = double(s.compile_us.load()) / 1e6;
    py::list failed;
    for (const auto& [key, ops, reason] : failures()) {
      py::dict f;
      f["key"] = key;
      f["ops"] = ops;
      f["reason"] = reason;
      failed.append(f);
    }
    d["failures"] = failed;
    {
      std::lock_guard<std::mutex> lock(const_cast<Metrics&>(s).mutex);
      d["op_by_op"] = s.op_by_op;
    }
    return d;
  });
  m.def("_adaptive_reset", [] {
    reset_metrics();
    reset_states();
  });
}

}  // namespace torchneuron::adaptive
