// Copies between host and device and between devices. Host->device copies
// from pageable memory are staged (the source may change once we return);
// from pinned memory they read the source in stream order (and a blocking one
// waits for that read).
// Device->host copies wait for the stream unless they target pinned memory
// with non_blocking=True — the semantics of CUDA.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <optional>

#include "../adaptive/Adaptive.h"
#include "../backend/Current.h"
#include "HostArgs.h"
#include "Launcher.h"

namespace torchneuron::aten {

namespace {

using backend::kNeuron;

profiler::TaskFacts copy_facts(const at::Tensor& dst) {
  int64_t bytes = int64_t(dst.numel()) * int64_t(dst.itemsize());
  return {runtime::TaskKind::kCopy, bytes, bytes, 0};
}

// A CPU tensor over the memory of the host tensor `t`, for a copy task to read
// or write when it runs: a TensorImpl of its own, so the task touches only the
// bytes, never the user's tensor object (its autograd history, version counter
// or metadata, which the host thread owns). Holding it keeps the memory (a
// pinned block) alive until the task is done.
at::Tensor task_alias(const at::Tensor& t) {
  return cpu_tensor_over(t.storage(), t.scalar_type(), t.sizes(), t.strides(), t.storage_offset(), t.is_conj(),
                         t.is_neg());
}

void copy_between_devices(const at::Tensor& src, const at::Tensor& dst) {
  c10::DeviceIndex from = src.device().index(), to = dst.device().index();
  auto src_view = host_view(src), dst_view = host_view(dst);
  if (from == to) {
    constexpr std::string_view what = "copy_ (device to device)";
    auto body = [src_view, dst_view]() mutable { dst_view.copy_(src_view); };
    static const auto& copy_op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    c10::IValue args[] = {dst, src, false}, returns[] = {dst};
    enqueue_or_defer(to, copy_op, what, args, returns, std::move(body), copy_facts(dst));
    return;
  }
  // Peer copy on the destination's stream, after the source's pending
  // writes; the source's stream then waits for the copy before it may reuse
  // the source's memory.
  auto& src_stream = backend::runtime_stream(backend::current_stream(from));
  auto& dst_stream = backend::runtime_stream(backend::current_stream(to));
  runtime::Event ready;
  ready.record(src_stream);
  ready.block(dst_stream);
  enqueue(
      to, "copy_ (between neuron devices)", [src_view, dst_view]() mutable { dst_view.copy_(src_view); },
      copy_facts(dst));
  runtime::Event done;
  done.record(dst_stream);
  done.block(src_stream);
}

at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  bool src_dev = src.device().type() == kNeuron, dst_dev = dst.device().type() == kNeuron;
  TORCH_CHECK(src_dev || src.device().is_cpu(), "copy_: cannot copy from ", src.device(), " to ", dst.device());
  TORCH_CHECK(dst_dev || dst.device().is_cpu(), "copy_: cannot copy from ", src.device(), " to ", dst.device());
  check_not_quantized("copy_", src.scalar_type());
  check_not_quantized("copy_", dst.scalar_type());
  if (!src.sizes().equals(dst.sizes())) {
    // Checked now, as CPU and CUDA do, rather than inside the task.
    auto shape = at::infer_size_dimvector(dst.sizes(), src.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape).equals(dst.sizes()), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (dst.numel() == 0) return dst;

  if (src_dev && dst_dev) {
    // The checks copy_ makes before handing devices it does not know to us.
    at::assert_no_internal_overlap(dst);
    at::assert_no_partial_overlap(dst, src);
    copy_between_devices(src, dst);
    return dst;
  }
  if (dst_dev) {  // host -> device
    c10::DeviceIndex device = dst.device().index();
    auto dst_view = host_view(dst);
    if (src.is_pinned()) {
      // Read when the task runs, so the copy is ordered after the stream's
      // earlier work, as on CUDA: pinned memory a pending non-blocking
      // device->host copy fills is read once that copy is done. The task holds
      // the source, so its pinned block outlives the copy.
      auto stream = backend::current_stream(device);
      TORCH_CHECK(non_blocking || !backend::runtime_stream(stream).capturing(),
                  "operation not permitted when stream is capturing: a blocking copy_ from host memory to ",
                  dst.device(), "; use non_blocking=True or copy before the capture");
      enqueue(
          device, "copy_ (host to device)", [src = task_alias(src), dst_view]() mutable { dst_view.copy_(src); },
          copy_facts(dst));
      // A blocking copy returns once the source was read: the host may then reuse it.
      if (!non_blocking) backend::synchronize_stream(stream);
    } else {
      // As on CUDA: a graph would replay the snapshot taken at capture time.
      TORCH_CHECK(!backend::runtime_stream(backend::current_stream(device)).capturing(),
                  "operation not permitted when stream is capturing: copy_ from pageable host memory to ",
                  dst.device(), "; copy from pinned memory (non_blocking=True) or copy before the capture");
      at::Tensor staged = src.clone();  // snapshot of the pageable source
      enqueue(
          device, "copy_ (host to device)", [staged, dst_view]() mutable { dst_view.copy_(staged); },
          copy_facts(dst));
    }
    return dst;
  }
  // device -> host
  c10::DeviceIndex device = src.device().index();
  bool blocking = !(non_blocking && dst.is_pinned());
  // A blocking read sees the device's finished work on every stream, not only
  // the current one (forgiving where CUDA would leave a race to the user).
  std::optional<profiler::SyncScope> sync;
  if (blocking) sync.emplace("copy_ (device to host)", device);
  if (blocking) runtime::wait_device_idle(device, /*include_communication=*/false);
  auto src_view = host_view(src);
  enqueue(
      device, "copy_ (device to host)", [src_view, dst = task_alias(dst)]() mutable { dst.copy_(src_view); },
      copy_facts(dst));
  if (blocking) backend::synchronize_stream(backend::current_stream(device));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  dst.resize_(src.sizes());
  return copy_from(src, dst, false);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
}

// Copies keep the conjugate and negative bits (the CPU copy_ in the task
// resolves them); materialising them first would copy_ again, endlessly.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torchneuron::aten
