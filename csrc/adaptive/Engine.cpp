#include "Engine.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <cstdlib>
#include <unordered_map>

#include "Adaptive.h"
#include "Collector.h"

namespace torchneuron::adaptive {

namespace py = pybind11;

namespace {

// Distinct segments remembered; past it, segments seen once are forgotten
// (a program whose segments never recur must not grow the table forever).
constexpr size_t kMaxStates = 4096;

struct SignatureHash {
  size_t operator()(const std::vector<int64_t>& s) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : s) h = (h ^ uint64_t(x)) * 1099511628211ull;
    return size_t(h);
  }
};

std::mutex g_states_mutex;  // never held while taking the GIL
auto* g_states = new std::unordered_map<std::vector<int64_t>, std::shared_ptr<SegmentState>, SignatureHash>();
auto* g_by_key = new std::unordered_map<std::string, std::shared_ptr<SegmentState>>();
PyObject* g_engine = nullptr;

py::object dtype_object(c10::ScalarType t) { return py::reinterpret_borrow<py::object>((PyObject*)torch::getTHPDtype(t)); }

py::tuple geometry(c10::ScalarType dtype, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  return py::make_tuple(dtype_object(dtype), py::tuple(py::cast(sizes.vec())), py::tuple(py::cast(strides.vec())),
                        offset);
}

py::tuple geometry(const Layout& l) { return geometry(l.dtype, l.sizes, l.strides, l.offset); }

py::object ref_object(const Segment& seg, const TensorRef& r) {
  if (r.kind == TensorRef::kUndefined) return py::none();
  py::object view = r.view >= 0 ? py::object(geometry(seg.views[r.view])) : py::none();
  return py::make_tuple(r.kind == TensorRef::kInput ? "input" : "value", r.index, view);
}

// A constant as the op's Python overload takes it: enum-like arguments
// (dtype, layout, memory format) are ints in an IValue.
py::object constant_object(const c10::IValue& v, const c10::TypePtr& type) {
  c10::TypePtr t = type->kind() == c10::TypeKind::OptionalType ? type->containedType(0) : type;
  if (v.isInt()) {
    switch (t->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return dtype_object(c10::ScalarType(v.toInt()));
      case c10::TypeKind::LayoutType:
        return py::reinterpret_borrow<py::object>((PyObject*)torch::getTHPLayout(c10::Layout(v.toInt())));
      case c10::TypeKind::MemoryFormatType:
        return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(c10::MemoryFormat(v.toInt())));
      default:
        break;
    }
  }
  return torch::jit::toPyObject(v);
}

}  // namespace

void lock_without_gil(std::mutex& m) {
  if (m.try_lock()) return;
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    m.lock();
    PyEval_RestoreThread(state);
  } else {
    m.lock();
  }
}

Metrics& metrics() {
  static auto* m = new Metrics();
  return *m;
}

void reset_metrics() {
  auto& m = metrics();
  for (auto* c : {&m.segments, &m.ops_deferred, &m.signatures, &m.hot, &m.compiled, &m.replays, &m.ops_replayed,
                  &m.launches_saved, &m.aborted_replays, &m.failures, &m.intermediates_elided, &m.compile_us})
    c->store(0);
  std::lock_guard<std::mutex> lock(m.mutex);
  m.op_by_op.clear();
}

void set_engine(py::object engine) {
  PyObject* old = g_engine;
  g_engine = engine.release().ptr();
  Py_XDECREF(old);
}

bool engine_ready() { return g_engine != nullptr; }

std::shared_ptr<SegmentState> state_of(const std::vector<int64_t>& signature) {
  std::lock_guard<std::mutex> lock(g_states_mutex);
  auto it = g_states->find(signature);
  if (it != g_states->end()) return it->second;
  if (g_states->size() >= kMaxStates) {
    for (auto i = g_states->begin(); i != g_states->end();)
      i = i->second->status() == SegmentState::kCold ? g_states->erase(i) : std::next(i);
  }
  metrics().signatures++;
  return g_states->emplace(signature, std::make_shared<SegmentState>()).first->second;
}

void reset_states() {
  std::lock_guard<std::mutex> lock(g_states_mutex);
  g_states->clear();  // programs leak with their states' last references: they hold no device memory
  g_by_key->clear();
}

bool SegmentState::advance(const Segment& seg, const std::vector<bool>& live) {
  lock_without_gil(mutex_);
  std::lock_guard<std::mutex> lock(mutex_, std::adopt_lock);
  ++seen_;
  ops_ = seg.ops.size();
  Status s = status();
  if (s == kCompiled) return true;
  if (s == kCompiling || s == kFailed || (s == kCold && seen_ < settings().hot.load())) return false;
  py::gil_scoped_acquire gil;
  try {
    py::object engine = py::reinterpret_borrow<py::object>(g_engine);
    if (s == kCold) {
      // Hot: the engine answers "ready" (compiled by an earlier process,
      // found in the disk cache), "compiling" or "failed: <reason>".
      py::tuple answer = engine.attr("submit")(describe(seg, live));
      key_ = answer[0].cast<std::string>();
      std::string verdict = answer[1].cast<std::string>();
      metrics().hot++;
      {
        std::lock_guard<std::mutex> states(g_states_mutex);
        (*g_by_key)[key_] = shared_from_this();
      }
      if (verdict == "compiling") {
        status_ = kCompiling;
        return false;
      }
      if (verdict != "ready") {
        reason_ = answer[2].cast<std::string>();
        status_ = kFailed;
        metrics().failures++;
        return false;
      }
    }
    // Ready: load the program (from the compile cache the engine filled).
    py::object program = engine.attr("load")(key_, describe(seg, live));
    program_ = program.release().ptr();
    status_ = kCompiled;
    metrics().compiled++;
    return true;
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_KeyboardInterrupt)) throw;  // the user's (Ctrl-C), not a failure: the state stays
    reason_ = std::string("the engine raised: ") + e.what();
  } catch (const std::exception& e) {
    reason_ = std::string("the engine raised: ") + e.what();
  }
  status_ = kFailed;
  metrics().failures++;
  return false;
}

void SegmentState::call(const py::list& tensors) {
  py::handle program(program_);
  program(tensors);
}

void SegmentState::fail(const std::string& reason) {
  lock_without_gil(mutex_);
  std::lock_guard<std::mutex> lock(mutex_, std::adopt_lock);
  if (status() == kFailed) return;
  reason_ = reason;
  status_ = kFailed;
  metrics().failures++;
}

void SegmentState::compiled(bool ok, double seconds, const std::string& reason) {
  lock_without_gil(mutex_);
  std::lock_guard<std::mutex> lock(mutex_, std::adopt_lock);
  metrics().compile_us += int64_t(seconds * 1e6);
  if (status() != kCompiling) return;
  if (ok) {
    status_ = kReady;
  } else {
    reason_ = reason;
    status_ = kFailed;
    metrics().failures++;
  }
}

void compile_done(const std::string& key, bool ok, double seconds, const std::string& reason) {
  std::shared_ptr<SegmentState> state;
  {
    std::lock_guard<std::mutex> lock(g_states_mutex);
    auto it = g_by_key->find(key);
    if (it == g_by_key->end()) return;
    state = it->second;
  }
  state->compiled(ok, seconds, reason);
}

std::vector<std::tuple<std::string, size_t, std::string>> failures() {
  std::vector<std::shared_ptr<SegmentState>> states;
  {
    std::lock_guard<std::mutex> lock(g_states_mutex);
    for (const auto& [sig, s] : *g_states)
      if (s->status() == SegmentState::kFailed) states.push_back(s);
  }
  std::vector<std::tuple<std::string, size_t, std::string>> out;
  for (const auto& s : states) out.emplace_back(s->key(), s->ops(), s->reason());
  return out;
}

py::dict describe(const Segment& seg, const std::vector<bool>& live) {
  py::dict d;
  d["device"] = int(seg.device);
  py::list inputs, values, live_list, ops;
  for (const auto& t : seg.inputs) {
    py::tuple g = geometry(t.scalar_type(), t.sizes(), t.strides(), t.storage_offset());
    inputs.append(py::make_tuple(g[0], g[1], g[2], g[3], int64_t(t.storage().nbytes() / t.itemsize())));
  }
  for (size_t i = 0; i < seg.values.size(); ++i) {
    const auto& v = seg.values[i];
    values.append(geometry(v.layout));
    if (live[i]) live_list.append(int(i));
  }
  for (const auto& op : seg.ops) {
    const auto& schema = op.op->schema();
    py::list args;
    c10::ArrayRef<ArgRecord> records = Segment::slice(seg.args, op.args);
    for (size_t i = 0; i < records.size(); ++i) {
      const auto& a = records[i];
      switch (a.kind) {
        case ArgRecord::kConstant:
          args.append(py::make_tuple("constant", constant_object(a.constant, schema.arguments()[i].type())));
          break;
        case ArgRecord::kTensor:
          args.append(py::make_tuple("tensor", ref_object(seg, seg.refs[a.tensors.first])));
          break;
        case ArgRecord::kLifted:
          args.append(py::make_tuple("lifted", a.lifted));
          break;
        case ArgRecord::kTensorList: {
          py::list refs;
          for (const auto& r : Segment::slice(seg.refs, a.tensors)) refs.append(ref_object(seg, r));
          args.append(py::make_tuple("list", refs));
        }
      }
    }
    py::list returns;
    for (const Span& r : Segment::slice(seg.results, op.results)) {
      c10::ArrayRef<int32_t> created = Segment::slice(seg.created, r);
      returns.append(py::cast(std::vector<int32_t>(created.begin(), created.end())));
    }
    ops.append(py::make_tuple(schema.name(), schema.overload_name(), args, returns));
  }
  py::list lifted;
  for (const auto& t : seg.lifted) lifted.append(py::make_tuple(dtype_object(t.scalar_type()), t.numel()));
  d["lifted"] = lifted;
  d["inputs"] = inputs;
  d["values"] = values;
  d["live"] = live_list;
  d["ops"] = ops;
  return d;
}

}  // namespace torchneuron::adaptive
