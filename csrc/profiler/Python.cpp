#include "Python.h"

#include <string>

#include "Recorder.h"

namespace torchneuron::profiler {

namespace py = pybind11;

namespace {

// The last session as columns (name -> list), one dict per table.
py::dict trace_columns(const Trace& trace) {
  std::vector<std::string> name, kind;
  std::vector<int64_t> device, stream, enqueue, start, end, bytes_read, bytes_written, flops, correlation, frame;
  for (const auto& t : trace.tasks) {
    int64_t e = t.end_ns.load(std::memory_order_acquire);
    if (e == 0) continue;  // never ran
    name.emplace_back(t.name);
    kind.emplace_back(runtime::task_kind_name(t.kind));
    device.push_back(t.device);
    stream.push_back(t.stream);
    enqueue.push_back(t.enqueue_ns);
    start.push_back(t.start_ns.load(std::memory_order_relaxed));
    end.push_back(e);
    bytes_read.push_back(t.bytes_read);
    bytes_written.push_back(t.bytes_written);
    flops.push_back(t.flops);
    correlation.push_back(int64_t(t.correlation));
    frame.push_back(t.frame);
  }
  py::dict tasks;
  tasks["name"] = name;
  tasks["kind"] = kind;
  tasks["device"] = device;
  tasks["stream"] = stream;
  tasks["enqueue_ns"] = enqueue;
  tasks["start_ns"] = start;
  tasks["end_ns"] = end;
  tasks["bytes_read"] = bytes_read;
  tasks["bytes_written"] = bytes_written;
  tasks["flops"] = flops;
  tasks["correlation_id"] = correlation;
  tasks["frame_id"] = frame;

  py::dict syncs;
  {
    std::vector<std::string> what;
    std::vector<int64_t> device, stream, start, end, correlation, frame;
    for (const auto& s : trace.syncs) {
      what.emplace_back(s.what);
      device.push_back(s.device);
      stream.push_back(s.stream);
      start.push_back(s.start_ns);
      end.push_back(s.end_ns);
      correlation.push_back(int64_t(s.correlation));
      frame.push_back(s.frame);
    }
    syncs["what"] = what;
    syncs["device"] = device;
    syncs["stream"] = stream;
    syncs["start_ns"] = start;
    syncs["end_ns"] = end;
    syncs["correlation_id"] = correlation;
    syncs["frame_id"] = frame;
  }

  py::dict memory;
  {
    std::vector<int64_t> device, time, address, bytes, allocated, reserved, correlation, frame;
    for (const auto& m : trace.memory) {
      device.push_back(m.device);
      time.push_back(m.time_ns);
      address.push_back(int64_t(m.address));
      bytes.push_back(m.bytes);
      allocated.push_back(m.allocated);
      reserved.push_back(m.reserved);
      correlation.push_back(int64_t(m.correlation));
      frame.push_back(m.frame);
    }
    memory["device"] = device;
    memory["time_ns"] = time;
    memory["address"] = address;
    memory["bytes"] = bytes;
    memory["allocated_bytes"] = allocated;
    memory["reserved_bytes"] = reserved;
    memory["correlation_id"] = correlation;
    memory["frame_id"] = frame;
  }

  py::dict frames;
  {
    std::vector<int64_t> id, parent, line;
    std::vector<std::string> file, function;
    for (size_t i = 0; i < trace.frames.size(); ++i) {
      const Frame& f = trace.frames[i];
      id.push_back(int64_t(i));
      parent.push_back(f.parent);
      file.push_back(f.file);
      line.push_back(f.line);
      function.push_back(f.function);
    }
    frames["frame_id"] = id;
    frames["parent_id"] = parent;
    frames["file"] = file;
    frames["line"] = line;
    frames["function"] = function;
  }

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
