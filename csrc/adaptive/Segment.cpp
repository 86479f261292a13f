#include "Segment.h"

#include <ATen/ops/tensor.h>

#include <cstring>
#include <functional>

namespace torchneuron::adaptive {

namespace {

int64_t bits(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

bool same_layout(const at::Tensor& t, c10::ScalarType dtype, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                 int64_t offset) {
  return t.scalar_type() == dtype && t.sizes().equals(sizes) && t.strides().equals(strides) &&
         t.storage_offset() == offset;
}

void sign_layout(std::vector<int64_t>& sig, const Layout& l) {
  sig.push_back(int64_t(l.dtype));
  sig.push_back(int64_t(l.sizes.size()));
  sig.insert(sig.end(), l.sizes.begin(), l.sizes.end());
  sig.insert(sig.end(), l.strides.begin(), l.strides.end());
  sig.push_back(l.offset);
}

}  // namespace

Layout Layout::of(const at::Tensor& t) {
  return Layout{t.scalar_type(), {t.sizes().begin(), t.sizes().end()}, {t.strides().begin(), t.strides().end()},
                t.storage_offset()};
}

bool Layout::matches(const at::Tensor& t) const { return same_layout(t, dtype, sizes, strides, offset); }

at::Tensor alias(c10::Storage storage, const Layout& layout) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(layout.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, layout.offset);
  return t;
}

at::Tensor alias(const at::Tensor& t) { return alias(t.storage(), Layout::of(t)); }

at::Tensor whole_storage(const at::Tensor& t) {
  Layout flat;
  flat.dtype = t.scalar_type();
  flat.sizes = {int64_t(t.storage().nbytes() / t.itemsize())};
  flat.strides = {1};
  return alias(t.storage(), flat);
}

void Segment::clear() {
  ops.clear();
  args.clear();
  refs.clear();
  results.clear();
  created.clear();
  inputs.clear();
  lifted.clear();
  values.clear();
  views.clear();
  by_storage.clear();
  signature.clear();
  unsupported = {};
  device = 0;
}

TensorRef Segment::reference(const at::Tensor& t) {
  TensorRef ref;
  if (!t.defined()) return ref;
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    unsupported = "a CPU tensor argument";  // its host value may change before the segment runs
    return ref;
  }
  if (t.is_conj() || t.is_neg()) unsupported = "a conjugate or negative view";
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  auto it = by_storage.find(storage);
  if (it == by_storage.end()) {
    ref.kind = TensorRef::kInput;
    ref.index = int32_t(inputs.size());
    inputs.push_back(alias(t));
    by_storage.emplace(storage, ref);
    signature.push_back(-1);  // a new input and its layout
    signature.push_back(t.device().index());
    signature.push_back(int64_t(t.storage().nbytes()));
    sign_layout(signature, Layout::of(t));
    return ref;
  }
  ref.kind = it->second.kind;
  ref.index = it->second.index;
  bool same;
  if (ref.kind == TensorRef::kInput) {
    const at::Tensor& base = inputs[ref.index];
    same = same_layout(t, base.scalar_type(), base.sizes(), base.strides(), base.storage_offset());
  } else {
    same = values[ref.index].layout.matches(t);
  }
  if (!same) {  // only views carry their layout
    ref.view = int32_t(views.size());
    views.push_back(Layout::of(t));
  }
  return ref;
}

void Segment::sign(const TensorRef& ref) {
  signature.push_back(int64_t(ref.kind) * 2 + (ref.view >= 0));
  signature.push_back(ref.index);
  if (ref.view >= 0) sign_layout(signature, views[ref.view]);
}

void Segment::sign(const c10::IValue& v) {
  signature.push_back(int64_t(v.tag));
  if (v.isNone()) return;
  if (v.isInt()) return signature.push_back(v.toInt());
  if (v.isDouble()) return signature.push_back(bits(v.toDouble()));
  if (v.isBool()) return signature.push_back(v.toBool());
  if (v.isString()) return signature.push_back(int64_t(std::hash<std::string_view>()(v.toStringView())));
  if (v.isDevice()) return signature.push_back(int64_t(v.toDevice().type()) * 1000 + v.toDevice().index());
  if (v.isIntList()) {
    auto list = v.toIntList();
    signature.push_back(int64_t(list.size()));
    for (int64_t x : list) signature.push_back(x);
    return;
  }
  if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    signature.push_back(int64_t(list.size()));
    for (double x : list) signature.push_back(bits(x));
    return;
  }
  if (v.isBoolList()) {
    auto list = v.toBoolList();
    signature.push_back(int64_t(list.size()));
    for (bool x : list) signature.push_back(x);
    return;
  }
  if (v.isList()) {  // a Scalar[] (a foreach op's per-tensor scalars)
    auto list = v.toListRef();
    signature.push_back(int64_t(list.size()));
    for (const auto& x : list) sign(x);
    return;
  }
  unsupported = "a constant argument of a type the compiler does not take";
}

bool Segment::lift(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, size_t index, ArgRecord& arg) {
  const auto& schema = op.schema();
  if (schema.name().rfind("aten::_foreach_", 0) != 0 || args.empty() || !args[0].isTensorList()) return false;
  // The program builder takes the scalars from the op's last positional
  // argument, or from the alpha of _foreach_add/_sub(self, other, alpha=)
  // (SGD's -lr).
  const auto& arguments = schema.arguments();
  const bool last_positional =
      !arguments[index].kwarg_only() && (index + 1 == arguments.size() || arguments[index + 1].kwarg_only());
  const bool alpha = arguments[index].kwarg_only() && arguments[index].name() == "alpha" &&
                     (schema.name().rfind("aten::_foreach_add", 0) == 0 ||
                      schema.name().rfind("aten::_foreach_sub", 0) == 0);
  if (!last_positional && !alpha) return false;
  auto tensors = args[0].toTensorList();
  if (tensors.size() == 0) return false;
  std::vector<double> values;
  if (args[index].isDouble()) {
    values.assign(tensors.size(), args[index].toDouble());
  } else {
    for (const auto& x : args[index].toListRef()) {
      if (!x.isDouble() && !x.isInt()) return false;
      values.push_back(x.isDouble() ? x.toDouble() : double(x.toInt()));
    }
  }
  // The kernel computes in the tensors' math type: float for reduced floats.
  c10::ScalarType dtype = tensors.get(0).scalar_type();
  if (!c10::isFloatingType(dtype)) return false;
  if (dtype != c10::kDouble) dtype = c10::kFloat;
  arg.kind = ArgRecord::kLifted;
  arg.lifted = int32_t(lifted.size());
  lifted.push_back(at::tensor(values, at::TensorOptions().dtype(c10::kDouble)).to(dtype));
  signature.push_back(-3);
  signature.push_back(int64_t(dtype));
  signature.push_back(int64_t(values.size()));
  return true;
}

void Segment::append(const c10::OperatorHandle& op, std::string_view name, c10::ArrayRef<c10::IValue> op_args,
                     c10::ArrayRef<c10::IValue> returns, runtime::Stream::Task eager_task,
                     std::shared_ptr<runtime::TaskRecord> record) {
  RecordedOp rec{&op, name, {int32_t(args.size()), int32_t(op_args.size())}, {}, std::move(eager_task),
                 std::move(record)};
  signature.push_back(reinterpret_cast<intptr_t>(&op.schema()));
  for (const auto& a : op_args) {
    const size_t index = size_t(&a - op_args.data());
    ArgRecord arg;
    arg.tensors.first = int32_t(refs.size());
    if (a.isTensor() && a.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
      arg.constant = a.toTensor().item();  // a Python number the op took as a tensor
      sign(arg.constant);
    } else if (a.isTensor()) {
      arg.kind = ArgRecord::kTensor;
      refs.push_back(reference(a.toTensor()));
    } else if (a.isTensorList()) {
      arg.kind = ArgRecord::kTensorList;
      for (const at::Tensor& t : a.toTensorList()) refs.push_back(reference(t));
      signature.push_back(int64_t(refs.size()) - arg.tensors.first);
    } else if (a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList() &&
               a.toListRef().size() > 0 && (a.toListRef()[0].isTensor() || a.toListRef()[0].isNone()) &&
               op.schema().arguments()[index].type()->kind() == c10::TypeKind::ListType) {
      arg.kind = ArgRecord::kTensorList;  // Tensor?[] (indices)
      for (const auto& e : a.toListRef()) refs.push_back(e.isNone() ? TensorRef{} : reference(e.toTensor()));
      signature.push_back(int64_t(refs.size()) - arg.tensors.first);
    } else if (((a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList()) || a.isDouble()) &&
               lift(op, op_args, index, arg)) {
    } else {
      arg.constant = a;
      sign(a);
    }
    arg.tensors.count = int32_t(refs.size()) - arg.tensors.first;
    for (const auto& ref : slice(refs, arg.tensors)) sign(ref);
    args.push_back(std::move(arg));
  }
  // Results: a tensor on a storage the segment has not seen is a new value.
  rec.results = {int32_t(results.size()), int32_t(returns.size())};
  for (const auto& r : returns) {
    Span result{int32_t(created.size()), 0};
    auto visit = [&](const at::Tensor& t) {
      if (!t.defined() || by_storage.count(t.storage().unsafeGetStorageImpl())) {
        created.push_back(-1);
        return;
      }
      TensorRef ref;
      ref.kind = TensorRef::kValue;
      ref.index = int32_t(values.size());
      by_storage.emplace(t.storage().unsafeGetStorageImpl(), ref);
      created.push_back(ref.index);
      values.push_back(Value{c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()),
                             c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), Layout::of(t)});
      sign_layout(signature, values.back().layout);
    };
    if (r.isTensor()) visit(r.toTensor());
    else if (r.isTensorList())
      for (const at::Tensor& t : r.toTensorList()) visit(t);
    else unsupported = "a result that is not a tensor";
    result.count = int32_t(created.size()) - result.first;
    signature.push_back(result.count);
    results.push_back(result);
  }
  ops.push_back(std::move(rec));
}

std::vector<c10::Storage> Segment::live_values() const {
  std::vector<c10::Storage> live(values.size());
  for (size_t i = 0; i < values.size(); ++i) live[i] = c10::Storage(values[i].storage.lock());
  return live;
}

}  // namespace torchneuron::adaptive
