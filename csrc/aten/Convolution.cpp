// Convolutions on neuron: ATen routes PrivateUse1 convolutions to the
// *_overrideable ops; they launch the generic convolution ops, whose CPU
// kernels then run on the device buffers like any other op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "Launcher.h"

namespace torchneuron::aten {

namespace {

void convolution(const c10::OperatorHandle&, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  launch(op, keys, stack);  // same arguments
}

// convolution_backward_overrideable lacks convolution_backward's bias_sizes
// argument (after weight); bias sizes follow from the weight.
void convolution_backward(const c10::OperatorHandle&, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  constexpr size_t kArgs = 10;  // grad_output, input, weight, stride, padding, dilation, transposed,
                                // output_padding, groups, output_mask
  size_t base = stack->size() - kArgs;
  const at::Tensor weight = (*stack)[base + 2].toTensor();
  bool transposed = (*stack)[base + 6].toBool();
  int64_t groups = (*stack)[base + 8].toInt();
  int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  stack->insert(stack->begin() + base + 3, c10::IValue(std::vector<int64_t>{channels}));
  launch(op, keys, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&convolution>());
  m.impl("convolution_backward_overrideable", torch::CppFunction::makeFromBoxedFunction<&convolution_backward>());
}

}  // namespace torchneuron::aten
