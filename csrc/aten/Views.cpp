// View ops are metadata only: they never launch. ATen's own device-generic
// implementations do the stride arithmetic.
#include <ATen/ATen.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
}
