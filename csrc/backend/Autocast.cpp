// torch.autocast("neuron"): the same op policies as CUDA (ATen's shared op
// lists), lower precision for matmul-like ops, fp32 for precision-sensitive
// ones, type promotion for mixed-input ops.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at;  // the shared op lists name ATen types unqualified

// Refused under autocast, as CUDA refuses it (same error).
Tensor binary_cross_entropy_refused(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(LOWER)
  AT_FORALL_FP32(FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(PROMOTE)
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_refused));
#undef LOWER
#undef FP32
#undef FP32_SET_OPT_DTYPE
#undef PROMOTE
}

}  // namespace
