#include "Python.h"

#include <string>
#include <type_traits>
#include <vector>

#include "Recorder.h"

namespace torchneuron::profiler {

namespace py = pybind11;

namespace {

// One table as columns (name -> list): each add() holds f(row) for every row.
template <typename Row>
class Columns {
 public:
  explicit Columns(std::vector<const Row*> rows) : rows_(std::move(rows)) {}

  template <typename F>
  Columns& add(const char* name, F f) {
    std::vector<std::decay_t<std::invoke_result_t<F, const Row&>>> values;
    values.reserve(rows_.size());
    for (const Row* r : rows_) values.push_back(f(*r));
    table_[name] = values;
    return *this;
  }

  py::dict table() const { return table_; }

 private:
  std::vector<const Row*> rows_;
  py::dict table_;
};

template <typename Container>
auto all_rows(const Container& c) {
  std::vector<const typename Container::value_type*> rows;
  for (const auto& r : c) rows.push_back(&r);
  return rows;
}

// The last session as columns, one dict per table.
py::dict trace_columns(const Trace& trace) {
  std::vector<const runtime::TaskRecord*> ran;
  for (const auto& t : trace.tasks)
    if (t.end_ns.load(std::memory_order_acquire) != 0) ran.push_back(&t);  // published after start_ns

  using runtime::TaskRecord;
  py::dict tasks = Columns<TaskRecord>(std::move(ran))
                       .add("name", [](const TaskRecord& t) { return std::string(t.name); })
                       .add("kind", [](const TaskRecord& t) { return std::string(runtime::task_kind_name(t.kind)); })
                       .add("device", [](const TaskRecord& t) { return int64_t(t.device); })
                       .add("stream", [](const TaskRecord& t) { return int64_t(t.stream); })
                       .add("enqueue_ns", [](const TaskRecord& t) { return t.enqueue_ns; })
                       .add("start_ns", [](const TaskRecord& t) { return t.start_ns.load(std::memory_order_relaxed); })
                       .add("end_ns", [](const TaskRecord& t) { return t.end_ns.load(std::memory_order_relaxed); })
                       .add("bytes_read", [](const TaskRecord& t) { return t.bytes_read; })
                       .add("bytes_written", [](const TaskRecord& t) { return t.bytes_written; })
                       .add("flops", [](const TaskRecord& t) { return t.flops; })
                       .add("correlation_id", [](const TaskRecord& t) { return int64_t(t.correlation); })
                       .add("frame_id", [](const TaskRecord& t) { return int64_t(t.frame); })
                       .add("replaced_ops", [](const TaskRecord& t) { return t.replaced; })
                       .table();

  py::dict syncs = Columns<SyncRecord>(all_rows(trace.syncs))
                       .add("what", [](const SyncRecord& s) { return std::string(s.what); })
                       .add("device", [](const SyncRecord& s) { return int64_t(s.device); })
                       .add("stream", [](const SyncRecord& s) { return int64_t(s.stream); })
                       .add("start_ns", [](const SyncRecord& s) { return s.start_ns; })
                       .add("end_ns", [](const SyncRecord& s) { return s.end_ns; })
                       .add("correlation_id", [](const SyncRecord& s) { return int64_t(s.correlation); })
                       .add("frame_id", [](const SyncRecord& s) { return int64_t(s.frame); })
                       .table();

  py::dict memory = Columns<MemoryRecord>(all_rows(trace.memory))
                        .add("device", [](const MemoryRecord& m) { return int64_t(m.device); })
                        .add("time_ns", [](const MemoryRecord& m) { return m.time_ns; })
                        .add("address", [](const MemoryRecord& m) { return int64_t(m.address); })
                        .add("bytes", [](const MemoryRecord& m) { return m.bytes; })
                        .add("allocated_bytes", [](const MemoryRecord& m) { return m.allocated; })
                        .add("reserved_bytes", [](const MemoryRecord& m) { return m.reserved; })
                        .add("correlation_id", [](const MemoryRecord& m) { return int64_t(m.correlation); })
                        .add("frame_id", [](const MemoryRecord& m) { return int64_t(m.frame); })
                        .table();

  const std::vector<Frame>& all = trace.frames;
  py::dict frames = Columns<Frame>(all_rows(all))
                        .add("frame_id", [&](const Frame& f) { return int64_t(&f - all.data()); })
                        .add("parent_id", [](const Frame& f) { return int64_t(f.parent); })
                        .add("file", [](const Frame& f) { return f.file; })
                        .add("line", [](const Frame& f) { return int64_t(f.line); })
                        .add("function", [](const Frame& f) { return f.function; })
                        .table();

  py::dict out;
  out["start_ns"] = trace.start_ns;
  out["end_ns"] = trace.end_ns;
  out["tasks"] = tasks;
  out["syncs"] = syncs;
  out["memory"] = memory;
  out["frames"] = frames;
  return out;
}

}  // namespace

void bind(py::module& m) {
  m.def("_profiler_recording", &recording);
  m.def("_profiler_last_trace", []() -> py::object {
    auto trace = last_session();
    if (!trace) return py::none();
    return trace_columns(*trace);
  });
}

}  // namespace torchneuron::profiler
