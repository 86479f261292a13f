// Ops that neuron composes from other ops rather than launching their CPU
// kernel:
// - random ops whose CPU kernels would draw from the CPU generator (their
//   schemas take no generator), composed from ops that take one, so they use
//   the device generator like every other random op;
// - functional ops without an out= overload whose CPU kernel is itself a
//   thin wrapper of one that has it (relu is clamp_min): launching the
//   latter writes into device memory directly instead of copying a result;
// - histc of integers, which CUDA computes and the CPU kernel rejects.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "Launcher.h"

namespace torchneuron::aten {

namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0 || (train.has_value() && !*train) || p == 0) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  double keep = 1 - p;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool)).bernoulli_(keep);
  double scale = keep == 0 ? 0.0 : 1.0 / keep;
  return {input.mul(mask).mul_(scale), mask};
}

at::Tensor relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  return at::clamp_min(self, 0);
}

// Integer histograms (MoE routers count tokens per expert with them) are
// computed in double, exact for every int32 value, and returned in the
// input's dtype as on CUDA. Other dtypes launch the CPU kernel as usual.
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  if (at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    return at::histc(self.to(at::kDouble), bins, min, max).to(self.scalar_type());
  }
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::histc", "");
  torch::jit::Stack stack{self, bins, min, max};
  launch(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return stack.back().toTensor();
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", native_dropout);
  m.impl("relu", relu);
  m.impl("histc", histc);
}

}  // namespace torchneuron::aten
