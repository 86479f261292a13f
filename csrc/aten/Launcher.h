// The eager launcher: every ATen op on neuron tensors comes through here.
//
//   check devices -> plan outputs (cached Meta) -> allocate on the current
//   stream -> enqueue a task that runs the CPU kernel on host views of the
//   device buffers (the out= overload when there is one, so results land in
//   device memory directly) -> return at once.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <string_view>

#include "../adaptive/Adaptive.h"
#include "../adaptive/Collector.h"
#include "../backend/Current.h"
#include "../profiler/Recorder.h"

namespace torchneuron::aten {

// The boxed kernel registered for neuron (fallback and explicit ops).
void launch(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// A CPU tensor over the device memory of `t` (kernel bodies only). CPU
// tensors are returned as they are.
at::Tensor host_view(const at::Tensor& t);

// Enqueues `body` on the current stream of `device` and returns the task's
// sequence number on that stream. An exception in the body surfaces at the
// next synchronisation with `what` in its message; `what` must outlive the
// task (op names and string literals do). `facts` describe the task's work
// to the profiler. While a fused program runs (adaptive eager), the task is
// collected into the program's task instead and 0 is returned.
template <typename Body>
uint64_t enqueue(c10::DeviceIndex device, std::string_view what, Body&& body,
                 const profiler::TaskFacts& facts = {});

namespace detail {
// Adds the op name and stream to a task's error, keeping its type; an
// asynchronous one also says when it surfaces.
[[noreturn]] void rethrow_task_error(std::string_view what, c10::Stream stream, bool asynchronous = true);
void after_enqueue(runtime::Stream& stream);

// `body` as a stream task whose error names `what` and the stream.
template <typename Body>
runtime::Stream::Task as_task(std::string_view what, c10::Stream stream, Body&& body) {
  return [what, stream, body = std::forward<Body>(body)]() mutable {
    try {
      body();
    } catch (...) {
      rethrow_task_error(what, stream);
    }
  };
}

// `body` as a task whose error (named as `as_task` names it, but raised at
// the call rather than at a later synchronisation) is kept in `failure` for
// the launching thread, which waits for the task, to rethrow.
template <typename Body>
auto keeping_error(std::string_view what, c10::Stream stream, std::shared_ptr<std::exception_ptr> failure,
                   Body&& body) {
  return [what, stream, failure = std::move(failure), body = std::forward<Body>(body)]() mutable {
    try {
      try {
        body();
      } catch (...) {
        rethrow_task_error(what, stream, /*asynchronous=*/false);
      }
    } catch (...) {
      *failure = std::current_exception();
    }
  };
}

inline std::shared_ptr<runtime::TaskRecord> task_record(const runtime::Stream& s, std::string_view what,
                                                        c10::Stream stream, const profiler::TaskFacts& facts) {
  return profiler::recording() && !s.capturing()
             ? profiler::record_task(what, stream.device_index(), int(stream.id()), facts)
             : nullptr;
}
}  // namespace detail

template <typename Body>
uint64_t enqueue(c10::DeviceIndex device, std::string_view what, Body&& body, const profiler::TaskFacts& facts) {
  c10::Stream stream = backend::current_stream(device);
  runtime::Stream::Task task = detail::as_task(what, stream, std::forward<Body>(body));
  if (adaptive::Collector* collector = adaptive::t_collector) {  // a fused program is running
    collector->tasks.push_back(std::move(task));
    return 0;
  }
  auto& s = backend::runtime_stream(stream);
  uint64_t seq = s.enqueue(std::move(task), detail::task_record(s, what, stream, facts));
  detail::after_enqueue(s);
  return seq;
}

// `enqueue`, unless adaptive eager holds launches on the current stream back:
// then the task joins the stream's pending segment as a call of `op` with
// `args` and `returns` (as the kernel got and returned them), and nullopt is
// returned. Callers ask only for tasks that may run later inside a fused
// program: not random ops, nor a first call whose plan is checked now.
template <typename Body>
std::optional<uint64_t> enqueue_or_defer(c10::DeviceIndex device, const c10::OperatorHandle& op,
                                         std::string_view what, c10::ArrayRef<c10::IValue> args,
                                         c10::ArrayRef<c10::IValue> returns, Body&& body,
                                         const profiler::TaskFacts& facts) {
  // Mode off (the eager path every op takes): no stream lookup beyond enqueue's own.
  if (!adaptive::enabled()) return enqueue(device, what, std::forward<Body>(body), facts);
  c10::Stream current = backend::current_stream(device);
  runtime::Stream& stream = backend::runtime_stream(current);
  if (!adaptive::should_defer(stream)) return enqueue(device, what, std::forward<Body>(body), facts);
  adaptive::defer(stream, device, op, what, args, returns, detail::as_task(what, current, std::forward<Body>(body)),
                  detail::task_record(stream, what, current, facts));
  return std::nullopt;
}

// Refuses PyTorch's quantized dtypes (quint8, qint8, qint32, quint4x2,
// quint2x4), naming `what`: neuron keeps no quantized tensors (their
// quantizer, engines and kernels are CPU-only); TorchAO's quantized layouts
// are plain tensors and run here.
void check_not_quantized(std::string_view what, c10::ScalarType dtype);

// Uninitialised neuron tensor with the given geometry.
at::Tensor empty_neuron(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                        c10::DeviceIndex device);

}  // namespace torchneuron::aten
