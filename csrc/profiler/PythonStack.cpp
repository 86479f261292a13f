#include "PythonStack.h"

#include <Python.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace torchneuron::profiler {

namespace {

// Frames nearer the root than this are dropped: the launching lines are at
// the inner end.
constexpr int kMaxDepth = 64;

struct Key {
  PyCodeObject* code;
  int line;
  int32_t parent;
  bool operator==(const Key& o) const { return code == o.code && line == o.line && parent == o.parent; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.code) ^ (size_t(k.line) * 0x9e3779b97f4a7c15ull) ^ (size_t(k.parent) << 20);
  }
};

// Guarded by the GIL and the mutex (taken in that order). The table holds a
// reference to each code object, so an address cannot be reused by another
// function while the session runs.
std::mutex g_mutex;
std::unordered_map<Key, int32_t, KeyHash> g_ids;
std::vector<Frame> g_frames;
std::vector<PyObject*> g_codes;

std::string utf8(PyObject* s) {
  const char* c = s ? PyUnicode_AsUTF8(s) : nullptr;
  if (!c) {
    PyErr_Clear();
    return "?";
  }
  return c;
}

int32_t intern(PyCodeObject* code, int line, int32_t parent) {
  Key key{code, line, parent};
  auto it = g_ids.find(key);
  if (it != g_ids.end()) return it->second;
  int32_t id = int32_t(g_frames.size());
  g_frames.push_back({parent, utf8(code->co_filename), line, utf8(code->co_qualname)});
  Py_INCREF(code);
  g_codes.push_back(reinterpret_cast<PyObject*>(code));
  g_ids.emplace(key, id);
  return id;
}

// Whether this thread is inside Python code, asked without the GIL: only the
// thread itself changes its frame pointer. Autograd's engine threads have a
// thread state but run no Python; taking the GIL there would stall every
// backward launch behind busy Python threads.
bool runs_python() {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return false;  // the GIL may never come back
  PyThreadState* ts = PyGILState_GetThisThreadState();
#if PY_VERSION_HEX >= 0x030D0000
  return ts && ts->current_frame;
#else
  return ts && ts->cframe && ts->cframe->current_frame;
#endif
}

// The stack of this thread's previous capture, outermost first. Between two
// launches only the inner end of a stack changes. A frame's id depends only
// on its (code, line) and its callers', and the line on (code, lasti): a
// frame at the same instruction as last time under the same callers has the
// same id, so neither its line (a line-table decode) nor its id is looked up
// again. The table holds the code objects, so their addresses stay theirs.
struct Cached {
  PyCodeObject* code;
  int lasti;
  int32_t id;
};
thread_local std::vector<Cached> t_previous;
thread_local uint64_t t_previous_table = 0;
std::atomic<uint64_t> g_table{1};  // changes when the frame table is cleared

}  // namespace

int32_t current_python_frame() {
  if (!runs_python()) return -1;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* stack[kMaxDepth];
  int depth = 0;
  for (PyFrameObject* f = PyThreadState_GetFrame(PyThreadState_Get()); f;) {
    if (depth == kMaxDepth) {  // keep the innermost frames
      Py_DECREF(f);
      break;
    }
    stack[depth++] = f;
    f = PyFrame_GetBack(f);
  }
  uint64_t table = g_table.load(std::memory_order_acquire);
  if (t_previous_table != table) t_previous.clear();
  t_previous_table = table;
  int32_t id = -1;
  size_t same = 0;  // frames shared with the previous capture, from the outermost
  for (int i = depth - 1; i >= 0; --i, ++same) {
    if (same >= t_previous.size()) break;
    const Cached& c = t_previous[same];
    PyCodeObject* code = PyFrame_GetCode(stack[i]);
    bool hit = c.code == code && c.lasti == PyFrame_GetLasti(stack[i]);
    Py_DECREF(code);
    if (!hit) break;
    id = c.id;
  }
  t_previous.resize(same);
  if (same < size_t(depth)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (int i = depth - 1 - int(same); i >= 0; --i) {
      PyCodeObject* code = PyFrame_GetCode(stack[i]);
      id = intern(code, PyFrame_GetLineNumber(stack[i]), id);
      t_previous.push_back({code, PyFrame_GetLasti(stack[i]), id});
      Py_DECREF(code);
    }
  }
  for (int i = 0; i < depth; ++i) Py_DECREF(stack[i]);
  PyGILState_Release(gil);
  return id;
}

std::vector<Frame> take_python_frames() {
  std::vector<PyObject*> codes;
  std::vector<Frame> frames;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    frames.swap(g_frames);
    codes.swap(g_codes);
    g_ids.clear();
    g_table.fetch_add(1, std::memory_order_release);
  }
  if (!codes.empty() && Py_IsInitialized() && !_Py_IsFinalizing()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    for (PyObject* c : codes) Py_DECREF(c);
    PyGILState_Release(gil);
  }
  return frames;
}

}  // namespace torchneuron::profiler
