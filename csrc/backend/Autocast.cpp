// torch.autocast("neuron"): the same op policies as CUDA (ATen's shared op
// lists), lower precision for matmul-like ops, fp32 for precision-sensitive
// ones, type promotion for mixed-input ops.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at;  // the shared op lists name ATen types unqualified

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
#undef LOWER
#undef FP32
#undef FP32_SET_OPT_DTYPE
#undef PROMOTE
}

}  // namespace
