// Ops that neuron composes from other ops rather than launching their CPU
// kernel:
// - random ops whose CPU kernels would draw from the CPU generator (their
//   schemas take no generator), composed from ops that take one, so they use
//   the device generator like every other random op;
// - functional ops without an out= overload whose CPU kernel is itself a
//   thin wrapper of one that has it (relu is clamp_min): launching the
//   latter writes into device memory directly instead of copying a result.
#include <ATen/ATen.h>
#include <torch/library.h>

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", native_dropout);
  m.impl("relu", relu);
}

}  // namespace torchneuron::aten
