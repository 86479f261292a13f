// Which kernel scaled_dot_product_attention uses on neuron.
//
// Without a choice function for the device, PyTorch takes the unfused math
// path: matmul, softmax and matmul again, each rounded to the input dtype, so
// bf16 attention loses accuracy a fused kernel keeps (and costs seven
// launches). The device makes the choice CPU makes for the same shapes; the
// fused flash kernel it picks accumulates in float32 as a device's fused
// attention does, and runs as one launch.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>

namespace {

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // The CPU choice looks at shapes, dtypes and flags only, never at data.
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("aten::_fused_sdp_choice", "")
                       .typed<int64_t(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const std::optional<at::Tensor>&, double, bool, std::optional<double>, bool)>();
  return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value, attn_mask, dropout_p, is_causal,
                       scale, enable_gqa);
}

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &fused_sdp_choice)
}  // namespace at::native
