#include "OutputPlan.h"

#include "../runtime/Runtime.h"

#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/hash.h>

#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace torchneuron::aten {

namespace {

// ---- signature ------------------------------------------------------------

using Key = c10::SmallVector<int64_t, 64>;

void add_tensor(Key& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.push_back(-1);
    return;
  }
  k.push_back((int64_t(t.scalar_type()) << 8) | (int64_t(t.device().type()) << 1) | (t.is_conj() ? 1 : 0));
  k.push_back((t.dim() << 2) | (t.is_neg() ? 1 : 0) | (t.unsafeGetTensorImpl()->is_wrapped_number() ? 2 : 0));
  for (auto s : t.sizes()) k.push_back(s);
  for (auto s : t.strides()) k.push_back(s);
  k.push_back(t.storage_offset());
  k.push_back(int64_t(t.storage().nbytes()));
}

// False when an argument has a type the key cannot describe (no caching).
// Without `values`, int and floating-point scalars are keyed by type only.
bool add_value(Key& k, const c10::IValue& v, bool values) {
  if (v.isTensor()) {
    k.push_back(1);
    add_tensor(k, v.toTensor());
  } else if (v.isNone()) {
    k.push_back(2);
  } else if (v.isInt()) {
    k.push_back(3);
    if (values) k.push_back(v.toInt());
  } else if (v.isDouble()) {
    k.push_back(4);
    if (!values) return true;
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    k.push_back(bits);
  } else if (v.isBool()) {
    k.push_back(5);
    k.push_back(v.toBool());
  } else if (v.isComplexDouble()) {
    k.push_back(6);
    if (!values) return true;
    auto c = v.toComplexDouble();
    double parts[2] = {c.real(), c.imag()};
    int64_t bits[2];
    std::memcpy(bits, parts, sizeof bits);
    k.push_back(bits[0]);
    k.push_back(bits[1]);
  } else if (v.isIntList()) {
    k.push_back(7);
    auto list = v.toIntList();
    k.push_back(int64_t(list.size()));
    for (int64_t x : list) k.push_back(x);
  } else if (v.isSymInt()) {
    auto s = v.toSymInt();
    if (!s.is_heap_allocated()) {
      k.push_back(3);
      k.push_back(s.as_int_unchecked());
    } else {
      return false;
    }
  } else if (v.isTensorList()) {
    k.push_back(8);
    auto list = v.toTensorList();
    k.push_back(int64_t(list.size()));
    for (const at::Tensor& t : list) add_tensor(k, t);
  } else if (v.isList()) {
    k.push_back(9);
    auto list = v.toListRef();
    k.push_back(int64_t(list.size()));
    for (const auto& e : list)
      if (!add_value(k, e, values)) return false;
  } else if (v.isDevice()) {
    k.push_back(10);
    k.push_back(int64_t(v.toDevice().type()) * 256 + v.toDevice().index());
  } else if (v.isGenerator()) {
    k.push_back(11);  // generators do not change output geometry
  } else if (v.isString()) {
    k.push_back(12);
    k.push_back(int64_t(c10::hash<std::string>()(v.toStringRef())));
  } else {
    return false;
  }
  return true;
}

size_t hash_key(const Key& k) {
  size_t h = k.size();
  for (int64_t x : k) h = c10::hash_combine(h, size_t(x));
  return h;
}

// ---- meta execution --------------------------------------------------------

at::Tensor to_meta(const at::Tensor& t) {
  // Python scalars arrive as wrapped numbers, which must stay CPU tensors
  // (type promotion ranks them lower; Meta kernels accept CPU scalars).
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  // Same geometry over a meta storage of the same size, so that bounds
  // checks (as_strided, set_) behave as on the device.
  c10::Allocator* meta = c10::GetAllocator(c10::kMeta);
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(), meta->allocate(0), meta, true);
  auto m = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                    t.dtype());
  m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) m._set_conj(true);
  if (t.is_neg()) m._set_neg(true);
  return m;
}

c10::IValue meta_value(const c10::IValue& v) {
  if (v.isTensor()) return to_meta(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(to_meta(t));
    return out;
  }
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    auto list = v.toList();
    if (list.elementType()->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& e : v.toListRef())
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(to_meta(e.toTensor())) : std::nullopt);
      return out;
    }
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kMeta);
  return v;
}

// Meta kernels that disagree with the CPU kernels of 2.13 on an output's
// shape or dtype, corrected here so the op stays asynchronous (the first-call
// check would otherwise find the disagreement and make it synchronous).
void correct_known_meta_disagreements(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                      torch::jit::Stack& results) {
  const auto& name = op.schema().name();
  if (name == "aten::native_layer_norm" || name == "aten::native_batch_norm" ||
      name == "aten::_native_batch_norm_legit" || name == "aten::_batch_norm_with_update") {
    // The statistics of bf16/fp16 normalisation: Meta (and CUDA) declare
    // float32, the CPU kernels keep the input dtype unless a parameter or
    // running statistic is float32. The CPU backward kernels expect the CPU
    // dtype, so the device keeps CPU's.
    c10::ScalarType in = args[0].toTensor().scalar_type();
    bool same = in == c10::kBFloat16 || in == c10::kHalf;
    for (size_t i = 1; i < args.size() && same; ++i)
      for_each_tensor(args[i], [&](const at::Tensor& t) {
        if (t.defined() && t.is_floating_point() && t.scalar_type() != in) same = false;
      });
    if (same)
      for (size_t r = 1; r < 3 && r < results.size(); ++r)
        if (results[r].isTensor() && results[r].toTensor().defined())
          results[r] = results[r].toTensor().to(in);
  }
  if (name == "aten::native_batch_norm" || name == "aten::_native_batch_norm_legit") {
    // In inference (training=False) save_mean and save_invstd are empty.
    auto training = std::find_if(op.schema().arguments().begin(), op.schema().arguments().end(),
                                 [](const c10::Argument& a) { return a.name() == "training"; });
    size_t i = training - op.schema().arguments().begin();
    if (i < args.size() && args[i].isBool() && !args[i].toBool() && results.size() == 3)
      for (size_t r = 1; r < 3; ++r) results[r] = at::empty({0}, results[r].toTensor().options());
  }
}

Geometry geometry_of(const at::Tensor& t) {
  Geometry g{t.scalar_type()};
  g.sizes.assign(t.sizes().begin(), t.sizes().end());
  g.strides.assign(t.strides().begin(), t.strides().end());
  g.offset = t.storage_offset();
  return g;
}

std::shared_ptr<OutputPlan> compute_plan(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  auto plan = std::make_shared<OutputPlan>();
  const auto& schema = op.schema();
  for (const auto& ret : schema.returns()) {
    auto kind = ret.type()->kind();
    bool tensor_like = kind == c10::TypeKind::TensorType ||
                       (kind == c10::TypeKind::ListType &&
                        ret.type()->containedType(0)->kind() == c10::TypeKind::TensorType);
    if (!tensor_like) {
      plan->synchronous = true;
      return plan;
    }
  }

  torch::jit::Stack stack;
  std::vector<at::Tensor> flat_meta;
  std::vector<bool> flat_written;
  for (size_t i = 0; i < args.size(); ++i) {
    stack.push_back(meta_value(args[i]));
    const auto* alias = schema.arguments()[i].alias_info();
    bool written = alias && alias->isWrite();
    for_each_tensor(stack.back(), [&](const at::Tensor& t) {
      flat_meta.push_back(t);
      flat_written.push_back(written);
    });
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const std::exception& e) {
    // No usable Meta kernel (data-dependent shapes, or invalid input, which
    // the synchronous path reports with the CPU kernel's own error).
    if (runtime::config().log_level >= 1)
      std::fprintf(stderr, "[torchneuron] %s runs synchronously: its Meta kernel failed: %s\n",
                   c10::toString(op.operator_name()).c_str(), e.what());
    plan->synchronous = true;
    return plan;
  }

  correct_known_meta_disagreements(op, args, stack);

  std::vector<const at::Tensor*> flat_real;
  for (const auto& a : args) for_each_tensor(a, [&](const at::Tensor& t) { flat_real.push_back(&t); });
  for (size_t j = 0; j < flat_meta.size(); ++j)
    if (flat_written[j] && flat_meta[j].defined() && !Geometry(geometry_of(flat_meta[j])).same_as(*flat_real[j]))
      plan->resized_args.emplace_back(int(j), geometry_of(flat_meta[j]));

  bool any_output = false, all_views = true;
  for (const auto& r : stack) {
    std::vector<OutputSpec> specs;
    for_each_tensor(r, [&](const at::Tensor& t) {
      if (!t.defined()) {
        specs.push_back({OutputSpec::kUndefined, -1, Geometry{c10::ScalarType::Undefined}});
        plan->has_undefined_outputs = true;
        all_views = false;
        return;
      }
      OutputSpec spec{OutputSpec::kNew, -1, geometry_of(t)};
      for (size_t j = 0; j < flat_meta.size(); ++j) {
        if (!flat_meta[j].defined()) continue;
        if (t.unsafeGetTensorImpl() == flat_meta[j].unsafeGetTensorImpl()) {
          spec.kind = OutputSpec::kArgument;
          spec.arg = int(j);
          break;
        }
        if (t.storage().unsafeGetStorageImpl() == flat_meta[j].storage().unsafeGetStorageImpl()) {
          spec.kind = OutputSpec::kView;
          spec.arg = int(j);
          break;
        }
      }
      any_output = true;
      if (spec.kind != OutputSpec::kView) all_views = false;
      if (spec.kind == OutputSpec::kNew) plan->has_new_outputs = true;
      specs.push_back(std::move(spec));
    });
    plan->returns.push_back(std::move(specs));
  }
  int next = 0;
  for (const auto& specs : plan->returns) {
    plan->new_index.emplace_back();
    for (const auto& spec : specs) plan->new_index.back().push_back(spec.kind == OutputSpec::kNew ? next++ : -1);
  }
  bool mutates = std::any_of(flat_written.begin(), flat_written.end(), [](bool w) { return w; });
  plan->views_only = any_output && all_views && !mutates;
  return plan;
}

constexpr size_t kMaxPlansPerOp = 4096;

}  // namespace

bool Geometry::same_as(const at::Tensor& t) const {
  return t.scalar_type() == dtype && t.sizes().equals(c10::IntArrayRef(sizes)) &&
         t.strides().equals(c10::IntArrayRef(strides)) && t.storage_offset() == offset;
}

std::shared_ptr<const OutputPlan> PlanCache::get(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                                  bool scalar_values_matter) {
  Key key;
  // Global state a Meta kernel reads: the default dtype (the result dtype of
  // `uint8_tensor + 5.5`, of `1j * t`), grad and inference mode, deterministic
  // algorithms. A plan made under one must not serve a call under another.
  key.push_back(int64_t(c10::typeMetaToScalarType(c10::get_default_dtype())));
  key.push_back(int64_t(c10::GradMode::is_enabled()) | int64_t(c10::InferenceMode::is_enabled()) << 1 |
                int64_t(at::globalContext().deterministicAlgorithms()) << 2);
  bool cacheable = true;
  for (const auto& a : args) cacheable = cacheable && add_value(key, a, scalar_values_matter);
  if (!cacheable) return compute_plan(op, args);
  size_t h = hash_key(key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(h);
    if (it != entries_.end())
      for (const auto& e : it->second)
        if (e.key.size() == key.size() && std::equal(key.begin(), key.end(), e.key.begin())) return e.plan;
  }
  auto plan = compute_plan(op, args);
  std::lock_guard<std::mutex> lock(mutex_);
  if (size_ >= kMaxPlansPerOp) {
    entries_.clear();
    size_ = 0;
  }
  entries_[h].push_back({std::vector<int64_t>(key.begin(), key.end()), plan});
  ++size_;
  return plan;
}

}  // namespace torchneuron::aten
