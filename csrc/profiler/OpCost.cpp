#include "OpCost.h"

#include "../aten/OutputPlan.h"

namespace torchneuron::profiler {

namespace {

int64_t nbytes(const at::Tensor& t) { return t.defined() ? int64_t(t.numel()) * int64_t(t.itemsize()) : 0; }

const at::Tensor* tensor_arg(c10::ArrayRef<c10::IValue> args, size_t i) {
  return i < args.size() && args[i].isTensor() ? &args[i].toTensor() : nullptr;
}

// 2 FLOPs (a multiply and an add) per term of each dot product.
int64_t matmul_flops(std::string_view op, c10::ArrayRef<c10::IValue> args, c10::ArrayRef<at::Tensor> outputs) {
  auto starts = [&](std::string_view prefix) { return op.substr(0, prefix.size()) == prefix; };
  // mm(a, b), bmm(a, b); addmm(c, a, b), baddbmm(c, a, b), addbmm(c, a, b)
  size_t a_index = starts("aten::mm") || starts("aten::bmm") ? 0
                   : starts("aten::addmm") || starts("aten::baddbmm") || starts("aten::addbmm") ? 1
                                                                                               : SIZE_MAX;
  if (a_index != SIZE_MAX) {
    const at::Tensor *a = tensor_arg(args, a_index), *b = tensor_arg(args, a_index + 1);
    if (!a || !b || a->dim() < 2 || b->dim() < 2) return 0;
    int64_t batch = a->dim() == 3 ? a->size(0) : 1;
    return 2 * batch * a->size(-2) * a->size(-1) * b->size(-1);
  }
  if (op.find("convolution") != std::string_view::npos && op.find("backward") == std::string_view::npos) {
    // weight [O, C / groups, *kernel]: each output element is a dot product
    // over C / groups * prod(kernel) terms.
    const at::Tensor* weight = tensor_arg(args, 1);
    if (!weight || weight->dim() < 3 || outputs.empty() || !outputs[0].defined()) return 0;
    return 2 * (weight->numel() / weight->size(0)) * int64_t(outputs[0].numel());
  }
  if (op.find("scaled_dot_product") != std::string_view::npos && op.find("backward") == std::string_view::npos) {
    // q [..., L, E], k [..., S, E], v [..., S, Ev]: QK^T and PV.
    const at::Tensor *q = tensor_arg(args, 0), *k = tensor_arg(args, 1), *v = tensor_arg(args, 2);
    if (!q || !k || !v || q->dim() < 2) return 0;
    int64_t batch = q->numel() / (q->size(-2) * q->size(-1));
    return 2 * batch * q->size(-2) * k->size(-2) * (q->size(-1) + v->size(-1));
  }
  return 0;
}

}  // namespace

TaskFacts op_cost(std::string_view op, c10::ArrayRef<c10::IValue> args, const std::vector<bool>& written,
                  c10::ArrayRef<at::Tensor> new_outputs) {
  TaskFacts facts;
  for (size_t i = 0; i < args.size(); ++i)
    aten::for_each_tensor(args[i], [&](const at::Tensor& t) {
      (i < written.size() && written[i] ? facts.bytes_written : facts.bytes_read) += nbytes(t);
    });
  for (const auto& t : new_outputs) facts.bytes_written += nbytes(t);
  facts.flops = matmul_flops(op, args, new_outputs);
  return facts;
}

}  // namespace torchneuron::profiler
