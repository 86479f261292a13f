#include "Launcher.h"

#include <algorithm>
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/op_registration/op_registration.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "../adaptive/Adaptive.h"
#include "../backend/Allocator.h"
#include "../backend/Current.h"
#include "../backend/Generator.h"
#include "../backend/TaskWarnings.h"
#include "../profiler/OpCost.h"
#include "HostArgs.h"
#include "OpTracking.h"
#include "OutputPlan.h"

namespace torchneuron::backend {
void resize_bytes(const c10::Storage& storage, size_t new_size);  // aten/Storage.cpp
}  // namespace torchneuron::backend

namespace torchneuron::aten {

using backend::kNeuron;

namespace {

// ---- per-op facts, resolved once ---------------------------------------------

struct OpInfo {
  std::string name;
  PlanCache plans;
  OpCounters* counters;
  std::optional<c10::OperatorHandle> out_variant;  // writes straight into device memory
  std::atomic<bool> out_variant_failed{false};      // its CPU kernel refused our outputs once
  // Output shapes cannot be planned (data-dependent, or a Meta kernel that
  // disagrees with the CPU kernel): run synchronously.
  std::atomic<bool> synchronous{false};
  std::vector<bool> written;  // per schema argument: the op writes it (in-place, out=)
  bool writes = false;
  // It writes an argument that is not an out= argument (self of an in-place
  // op, running statistics): running it twice would apply that twice.
  bool writes_inputs = false;
  bool has_generator = false;
  // Its output geometry follows its tensors alone: pointwise ops broadcast
  // them, _foreach_* ops mirror them; scalars change values, not shapes.
  bool scalars_shape_free = false;
};

bool same_argument(const c10::Argument& a, const c10::Argument& b) {
  bool aw = a.alias_info() && a.alias_info()->isWrite();
  bool bw = b.alias_info() && b.alias_info()->isWrite();
  return a.name() == b.name() && *a.type() == *b.type() && aw == bw;
}

// The out= overload of a functional op: the same arguments followed by one
// keyword-only written argument per return.
std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& op) {
  static auto* by_name = [] {
    auto* m = new std::unordered_map<std::string, std::vector<c10::OperatorName>>();
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) (*m)[name.name].push_back(name);
    return m;
  }();
  const auto& schema = op.schema();
  if (schema.is_mutable() || schema.returns().empty()) return std::nullopt;
  for (const auto& r : schema.returns())
    if (r.alias_info()) return std::nullopt;
  auto it = by_name->find(schema.name());
  if (it == by_name->end()) return std::nullopt;
  for (const auto& name : it->second) {
    if (name.overload_name == schema.overload_name()) continue;
    auto candidate = c10::Dispatcher::singleton().findSchema(name);
    if (!candidate) continue;
    const auto& cs = candidate->schema();
    const auto& fa = schema.arguments();
    const auto& ca = cs.arguments();
    if (ca.size() != fa.size() + schema.returns().size()) continue;
    bool match = true;
    for (size_t i = 0; i < fa.size() && match; ++i) match = same_argument(fa[i], ca[i]);
    for (size_t i = 0; i < schema.returns().size() && match; ++i) {
      const auto& out = ca[fa.size() + i];
      match = out.kwarg_only() && out.alias_info() && out.alias_info()->isWrite() &&
              *out.type() == *schema.returns()[i].type();
    }
    if (match) return candidate;
  }
  return std::nullopt;
}

OpInfo& op_info_slow(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* infos = new std::unordered_map<const void*, std::unique_ptr<OpInfo>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*infos)[&op.schema()];
  if (!slot) {
    slot = std::make_unique<OpInfo>();
    const auto& schema = op.schema();
    slot->name = schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
    slot->counters = &op_counters(slot->name);
    // max()/min() check for empty input only in the functional kernel; batch
    // norm's out= kernels assume the output has the input's layout.
    static const std::unordered_set<std::string> functional_only = {
        "aten::max", "aten::min", "aten::native_batch_norm", "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit.no_stats", "aten::_batch_norm_with_update"};
    if (!functional_only.count(slot->name)) slot->out_variant = find_out_variant(op);
    slot->scalars_shape_free = schema.name().rfind("aten::_foreach_", 0) == 0 || op.hasTag(at::Tag::pointwise);
    // Its Meta kernel resizes the statistics' out= arguments in inference,
    // which the CPU kernel leaves as they are: the first-call check of the
    // plan cannot see that, so the op always runs synchronously.
    static const std::unordered_set<std::string> meta_disagrees = {"aten::native_batch_norm.out"};
    slot->synchronous = meta_disagrees.count(slot->name) > 0;
    for (const auto& a : schema.arguments()) {
      if (a.type()->kind() == c10::TypeKind::OptionalType && a.type()->containedType(0)->kind() == c10::TypeKind::GeneratorType)
        slot->has_generator = true;
      slot->written.push_back(a.alias_info() && a.alias_info()->isWrite());
      slot->writes = slot->writes || slot->written.back();
      slot->writes_inputs = slot->writes_inputs || (slot->written.back() && !a.is_out());
    }
  }
  return *slot;
}

// Per-thread cache in front of the shared table: no lock on the launch path.
OpInfo& op_info(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const void*, OpInfo*> cache;
  OpInfo*& info = cache[&op.schema()];
  if (!info) info = &op_info_slow(op);
  return *info;
}

// ---- devices ------------------------------------------------------------------

// The device every tensor argument must be on. CPU 0-dim tensors are
// accepted (as CUDA accepts them for scalars); anything else on another
// device is the caller's error.
c10::DeviceIndex common_device(const c10::OperatorHandle& op, const OpInfo& info, c10::ArrayRef<c10::IValue> args) {
  const auto& schema = op.schema();
  std::optional<at::Device> device;
  for (size_t i = 0; i < args.size(); ++i) {
    // Index lists (Tensor?[]) may hold CPU tensors, as CUDA allows for indexing.
    bool index_list = args[i].isList() && !args[i].isTensorList() && !args[i].isIntList() &&
                      !args[i].isDoubleList() && !args[i].isBoolList();
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      at::Device d = t.device();
      if (d.type() == c10::DeviceType::CPU && (t.dim() == 0 || index_list) && !info.written[i]) return;
      if (!device && d.type() == kNeuron) {
        device = d;
        return;
      }
      if (device && d == *device) return;
      at::Device other = device ? *device : at::Device(kNeuron, backend::current_device());
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", schema.arguments()[i].name(),
                  " is on ", d, ", different from other tensors on ", other,
                  " (when checking argument in method ", info.name, ")");
    });
  }
  if (device) return device->index();
  for (const auto& a : args)
    if (a.isDevice() && a.toDevice().type() == kNeuron && a.toDevice().has_index()) return a.toDevice().index();
  return backend::current_device();
}

// The kernels see each argument through its own CPU view, so they cannot
// detect aliasing between arguments: check written arguments here, on the
// device tensors, as TensorIterator does on CPU and CUDA.
void check_overlap(const OpInfo& info, c10::ArrayRef<c10::IValue> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (!info.written[i]) continue;
    for_each_tensor(args[i], [&](const at::Tensor& out) {
      if (!out.defined()) return;
      at::assert_no_internal_overlap(out);
      for (size_t k = 0; k < args.size(); ++k) {
        if (info.written[k]) continue;
        for_each_tensor(args[k], [&](const at::Tensor& in) {
          if (in.defined() && in.device() == out.device()) at::assert_no_partial_overlap(out, in);
        });
      }
    });
  }
}

// An out= argument the plan resizes while it shares memory with an input:
// resizing first would hide the aliasing the CPU kernel checks for (cat
// rejects an out= that is one of its inputs), so such a call runs
// synchronously, on the arguments as the user passed them.
bool resizes_an_alias(const OutputPlan& plan, const OpInfo& info, c10::ArrayRef<c10::IValue> args) {
  if (plan.resized_args.empty()) return false;
  c10::SmallVector<const at::Tensor*, 4> written, read;
  for (size_t i = 0; i < args.size(); ++i)
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) (info.written[i] ? written : read).push_back(&t);
    });
  for (const at::Tensor* w : written)
    for (const at::Tensor* r : read)
      if (w->storage().is_alias_of(r->storage())) return true;
  return false;
}

// ---- argument translation -------------------------------------------------------

at::Generator cpu_generator_for(const c10::IValue& g, c10::DeviceIndex device) {
  at::Generator gen = g.isGenerator() ? g.toGenerator() : backend::default_generator(device);
  TORCH_CHECK(gen.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
              gen.device().type(), "'");
  return gen.get<backend::NeuronGenerator>()->next_cpu_generator();
}

bool is_generator(const c10::Argument& arg) {
  return arg.type()->kind() == c10::TypeKind::OptionalType &&
         arg.type()->containedType(0)->kind() == c10::TypeKind::GeneratorType;
}

// The arguments as the CPU kernel takes them: tensors as snapshots of device
// memory, the device generator as a CPU generator for this op, neuron devices
// as the CPU device.
HostArgs host_arguments(const c10::OperatorHandle& op, const OpInfo& info, c10::ArrayRef<c10::IValue> args,
                        c10::DeviceIndex device) {
  HostArgs host;
  const auto& schema_args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (info.has_generator && is_generator(schema_args[i])) host.push(cpu_generator_for(args[i], device));
    else if (args[i].isDevice() && args[i].toDevice().type() == kNeuron) host.push(at::Device(at::kCPU));
    else host.push(args[i]);
  }
  return host;
}

at::Tensor make_view(const at::Tensor& base, const Geometry& g) {
  auto view = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                       base.key_set(), c10::scalarTypeToTypeMeta(g.dtype));
  view.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  return view;
}

const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);

// Gives a written argument the layout an op produces for it (out= resizing).
// `t` shares the caller's TensorImpl, so the caller's tensor changes.
void set_geometry(at::Tensor t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  t.resize_(sizes);
  if (t.strides().equals(strides) && t.storage_offset() == offset) return;
  // A strided layout (e.g. a padded leading dimension) may need more storage.
  size_t needed = at::detail::computeStorageNbytes(sizes, strides, t.itemsize(), offset);
  if (needed > t.storage().nbytes()) backend::resize_bytes(t.storage(), needed);
  t.as_strided_(sizes, strides, offset);
}

// Runs an op whose outputs cannot be known in advance: waits for the stream,
// runs the kernel as a task, and uploads new results (a host round trip).
void launch_synchronous(const c10::OperatorHandle& op, OpInfo& info, std::vector<c10::IValue>& args,
                        torch::jit::Stack* stack, c10::DeviceIndex device) {
  struct Run {
    torch::jit::Stack inputs, outputs;
  };
  if (adaptive::Collector* collector = adaptive::t_collector) {
    collector->aborted = true;
    throw adaptive::ReplayAborted("a synchronous op in a fused program");
  }
  auto run = std::make_shared<Run>();
  auto failure = std::make_shared<std::exception_ptr>();  // raised at the call, like a CPU kernel's error
  profiler::SyncScope sync(info.name, device);
  runtime::wait_device_idle(device, /*include_communication=*/false);  // as a blocking copy to the host
  enqueue(device, info.name,
          detail::keeping_error(info.name, backend::current_stream(device), failure,
                                [op, host = host_arguments(op, info, args, device), run] {
                                  at::AutoDispatchBelowADInplaceOrView below_autograd;
                                  run->inputs = host.materialize();
                                  run->outputs = run->inputs;
                                  op.redispatchBoxed(kCPUKeys, &run->outputs);
                                }));
  backend::synchronize_stream(backend::current_stream(device));
  backend::deliver_task_warnings();
  if (*failure) std::rethrow_exception(*failure);

  std::vector<const at::Tensor*> flat_args;
  std::vector<at::Tensor> flat_views;
  for (const auto& a : args) for_each_tensor(a, [&](const at::Tensor& t) { flat_args.push_back(&t); });
  for (const auto& a : run->inputs) for_each_tensor(a, [&](const at::Tensor& t) { flat_views.push_back(t); });

  bool uploaded = false;
  auto to_device = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined()) return r;
    check_not_quantized(info.name, r.scalar_type());
    for (size_t j = 0; j < flat_views.size(); ++j) {
      if (!flat_views[j].defined() || flat_args[j]->device().type() != kNeuron) continue;
      if (r.unsafeGetTensorImpl() == flat_views[j].unsafeGetTensorImpl()) {
        // An out= argument the kernel resized (e.g. nonzero(out=)): give the
        // device tensor the new geometry and the data the kernel produced.
        at::Tensor dev = *flat_args[j];
        if (!r.sizes().equals(dev.sizes()) || !r.strides().equals(dev.strides()) ||
            r.data_ptr() != runtime::host_address(dev.data_ptr())) {
          set_geometry(dev, r.sizes(), r.strides(), 0);
          enqueue(device, info.name, [src = r, dst = TensorSnapshot(dev)] { dst.view().copy_(src); });
        }
        return dev;
      }
      const at::Tensor& base = *flat_args[j];
      auto* start = static_cast<char*>(base.storage().data_ptr().get());
      auto* p = static_cast<char*>(r.data_ptr());
      if (start && p >= start && p < start + base.storage().nbytes()) {
        Geometry g{r.scalar_type()};
        g.sizes.assign(r.sizes().begin(), r.sizes().end());
        g.strides.assign(r.strides().begin(), r.strides().end());
        g.offset = (p - start) / int64_t(r.itemsize());
        return make_view(base, g);
      }
    }
    uploaded = true;
    at::Tensor src = r.contiguous();
    std::vector<int64_t> strides(src.strides().begin(), src.strides().end());
    // nonzero's indices are laid out column by column on devices (CUDA, and
    // the fake tensors torch.compile plans with); CPU lays them out by row.
    if (info.name == "aten::nonzero" && src.dim() == 2) strides = {1, src.size(0)};
    at::Tensor out = empty_neuron(src.sizes(), strides, src.scalar_type(), device);
    enqueue(device, info.name, [src, dst = TensorSnapshot(out)] { dst.view().copy_(src); });
    return out;
  };

  for (auto& r : run->outputs) {
    if (r.isTensor()) {
      stack->push_back(to_device(r.toTensor()));
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : r.toTensorList()) list.push_back(to_device(t));
      stack->push_back(std::move(list));
    } else {
      stack->push_back(std::move(r));
    }
  }
  if (uploaded) info.counters->fallback.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// ---- public helpers ---------------------------------------------------------------

at::Tensor host_view(const at::Tensor& t) { return TensorSnapshot(t).view(); }

void check_not_quantized(std::string_view what, c10::ScalarType dtype) {
  if (!c10::isQIntType(dtype)) return;
  std::string name = c10::toString(dtype);  // QUInt8 -> torch.quint8, as Python prints it
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  TORCH_CHECK_NOT_IMPLEMENTED(false, what, ": neuron does not support quantized tensors (torch.", name,
                              "): PyTorch's quantized tensors run on the CPU only. Quantize with TorchAO, whose "
                              "quantized weights are plain tensors and run on neuron, or keep the quantized "
                              "tensor on the CPU.");
}

namespace detail {

void rethrow_task_error(std::string_view what, c10::Stream stream, bool asynchronous) {
  try {
    throw;
  } catch (c10::Error& e) {
    std::string where = "while running " + std::string(what) + " on " + stream.device().str() + " stream " +
                        std::to_string(stream.id());
    if (asynchronous && !backend::launch_blocking())
      where += " (an asynchronous task; the error surfaces at the next synchronization, set "
               "NEURON_LAUNCH_BLOCKING=1 to raise it at the launching line)";
    e.add_context(where);
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, what, " failed on ", stream.device().str(), ": ", e.what());
  }
}

void after_enqueue(runtime::Stream& stream) {
  if (backend::launch_blocking()) stream.synchronize();
}

}  // namespace detail

at::Tensor empty_neuron(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                        c10::DeviceIndex device) {
  size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, c10::elementSize(dtype));
  auto data = backend::caching_allocator().allocate_on(device, nbytes);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &backend::caching_allocator(), true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

void launch(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpInfo& info = op_info(op);
  info.counters->executed.fetch_add(1, std::memory_order_relaxed);
  backend::deliver_task_warnings();  // from asynchronous tasks since the last launch
  const size_t nargs = op.schema().arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - nargs), std::make_move_iterator(stack->end()));
  torch::jit::drop(*stack, nargs);

  c10::DeviceIndex device = common_device(op, info, args);
  backend::check_device_index(device);
  backend::lazy_init();
  if (info.writes) check_overlap(info, args);

  if (info.synchronous.load(std::memory_order_relaxed)) return launch_synchronous(op, info, args, stack, device);
  auto plan = info.plans.get(op, args, !info.scalars_shape_free);
  if (plan->synchronous || plan->cpu_disagrees.load(std::memory_order_relaxed) || resizes_an_alias(*plan, info, args))
    return launch_synchronous(op, info, args, stack, device);
  // The first call of a signature runs while the host waits, and its error
  // and warnings are raised here, at the call. CUDA validates arguments on
  // the host before it launches; here the CPU kernel's checks run in the
  // task, and a signature that passed them once passes them again, so later
  // calls run asynchronously and only value-dependent errors (an index out of
  // range) surface at the next synchronisation, as CUDA's device asserts do.
  // The first call is also checked against the CPU kernel and, if the plan
  // was wrong, run again synchronously: only for ops that running twice
  // cannot harm (ops that update an input keep the run-time error below).
  // In a graph capture nothing runs now: the recorded task raises instead
  // (warm up before capturing, as on CUDA).
  runtime::Stream& stream = backend::runtime_stream(backend::current_stream(device));
  // Nor inside a fused program (adaptive eager), whose tasks run later as
  // one: errors surface there as for any asynchronous task.
  const bool first = (!plan->checked.load(std::memory_order_acquire) || plan->warns.load(std::memory_order_relaxed)) &&
                     !stream.capturing() && !adaptive::t_collector;
  const bool check_plan = first && !info.writes_inputs;

  c10::SmallVector<const at::Tensor*, 8> flat;
  for (const auto& a : args) for_each_tensor(a, [&](const at::Tensor& t) { flat.push_back(&t); });
  for (const auto& [j, g] : plan->resized_args) set_geometry(*flat[j], g.sizes, g.strides, g.offset);

  // Outputs: new tensors from the allocator, views of arguments, or the
  // (written) arguments themselves.
  std::vector<at::Tensor> new_outputs;
  for (const auto& specs : plan->returns) {
    bool is_list = op.schema().returns()[&specs - plan->returns.data()].type()->kind() == c10::TypeKind::ListType;
    c10::List<at::Tensor> list;
    for (const auto& spec : specs) {
      at::Tensor out;
      if (spec.kind == OutputSpec::kNew) {
        out = empty_neuron(spec.geometry.sizes, spec.geometry.strides, spec.geometry.dtype, device);
        new_outputs.push_back(out);
      } else if (spec.kind == OutputSpec::kArgument) {
        out = *flat[spec.arg];
      } else if (spec.kind == OutputSpec::kUndefined) {
        out = at::Tensor();
      } else {
        out = make_view(*flat[spec.arg], spec.geometry);
      }
      if (is_list) list.push_back(out);
      else stack->push_back(out);
    }
    if (is_list) stack->push_back(std::move(list));
  }
  if (plan->views_only) return;

  // The task: the out= overload writes new results straight into device
  // memory; without one (or if it refuses, as a few out= kernels do when
  // they want to resize), the functional kernel runs and its results are
  // copied into the device buffers.
  HostArgs outputs;
  for (const auto& t : new_outputs) outputs.push_tensor(t);
  bool use_out = plan->has_new_outputs && !plan->has_undefined_outputs && info.out_variant &&
                 !info.out_variant_failed.load(std::memory_order_relaxed);
  profiler::TaskFacts facts;
  if (profiler::recording()) facts = profiler::op_cost(info.name, args, info.written, new_outputs);
  auto body = [op, &info, use_out, first, check_plan, host = host_arguments(op, info, args, device),
               outputs = std::move(outputs), plan] {
            const auto& new_index = plan->new_index;
            at::AutoDispatchBelowADInplaceOrView below_autograd;
            auto stack = host.materialize();
            auto out_views = outputs.materialize();
            if (use_out) {
              auto with_out = stack;
              for (size_t r = 0, next = 0; r < new_index.size(); ++r) {
                if (op.schema().returns()[r].type()->kind() != c10::TypeKind::ListType) {
                  with_out.push_back(out_views[next++]);
                  continue;
                }
                c10::List<at::Tensor> list;
                for (size_t k = 0; k < new_index[r].size(); ++k) list.push_back(out_views[next++].toTensor());
                with_out.emplace_back(std::move(list));
              }
              try {
                backend::TentativeWarnings warnings;
                info.out_variant->redispatchBoxed(kCPUKeys, &with_out);
                // An out= kernel that grew an output used it as scratch; some
                // (binary_cross_entropy) then return a wrong reduction, so
                // only untouched outputs are trusted.
                if (outputs.restore(out_views, /*allow_moved=*/false)) {
                  warnings.keep();
                  if (first) plan->checked.store(true, std::memory_order_release);
                  return;
                }
              } catch (const c10::Error&) {
              }
              out_views = outputs.materialize();  // fresh views: the failed kernel may have changed them
            }
            auto inputs = stack;  // written arguments (out=, in-place) to restore afterwards
            op.redispatchBoxed(kCPUKeys, &stack);
            // The functional kernel succeeded where the out= one did not: the
            // input was fine, the out= kernel is the problem; stop using it.
            if (use_out) info.out_variant_failed.store(true, std::memory_order_relaxed);
            if (!host.restore(inputs)) {
              if (check_plan) return plan->cpu_disagrees.store(true, std::memory_order_relaxed);
              TORCH_CHECK(false, info.name, ": the CPU kernel gave an output argument another layout than the one "
                          "planned from the op's Meta kernel");
            }
            for (size_t r = 0; r < new_index.size() && r < stack.size(); ++r) {
              size_t k = 0;
              for_each_tensor(stack[r], [&](const at::Tensor& t) {
                int idx = k < new_index[r].size() ? new_index[r][k] : -1;
                ++k;
                if (idx < 0) return;
                const at::Tensor& out = out_views[idx].toTensor();
                if (!t.sizes().equals(out.sizes()) || t.scalar_type() != out.scalar_type() || t.is_quantized()) {
                  if (check_plan) return plan->cpu_disagrees.store(true, std::memory_order_relaxed);
                  // The Meta kernel disagrees with the CPU kernel: from now on
                  // this op runs synchronously, with shapes from the CPU kernel.
                  info.synchronous.store(true, std::memory_order_relaxed);
                  TORCH_CHECK(false, info.name, ": the CPU kernel returned an output of shape ", t.sizes(), " and dtype ",
                              t.scalar_type(), " where the Meta kernel planned ", out.sizes(), " and ",
                              out.scalar_type(), "; the op now runs synchronously");
                }
                out.copy_(t);
              });
            }
            if (first && !plan->cpu_disagrees.load(std::memory_order_relaxed))
              plan->checked.store(true, std::memory_order_release);
          };
  const size_t nreturns = op.schema().returns().size();
  if (!first) {
    // Random ops draw from eager's generator, so they are never deferred.
    if (info.has_generator) enqueue(device, info.name, std::move(body), facts);
    else
      enqueue_or_defer(device, op, info.name, args,
                       c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - nreturns, nreturns), std::move(body),
                       facts);
    return;
  }
  // The task keeps its error for this call instead of leaving it on the
  // stream; the plan stays unchecked, so the next call waits and raises too.
  auto failure = std::make_shared<std::exception_ptr>();
  uint64_t seq =
      enqueue(device, info.name, detail::keeping_error(info.name, backend::current_stream(device), failure, std::move(body)),
              facts);
  {
    profiler::SyncScope sync("first call of an op signature (validates it)", device);
    stream.wait_until(seq);
  }
  // A kernel that warned may warn again (one that warns once stops waiting
  // at its next call).
  plan->warns.store(backend::deliver_task_warnings(), std::memory_order_relaxed);
  if (*failure) std::rethrow_exception(*failure);
  if (plan->cpu_disagrees.load(std::memory_order_relaxed)) {
    torch::jit::drop(*stack, nreturns);
    return launch_synchronous(op, info, args, stack, device);
  }
}

}  // namespace torchneuron::aten

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torchneuron::aten::launch>());
}

namespace {
// Every op that would create or use a quantized neuron tensor (a quantized
// dtype requested for a neuron factory dispatches here).
void refuse_quantized(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  c10::ScalarType dtype = c10::ScalarType::QInt8;
  for (const auto& v : torch::jit::last(*stack, op.schema().arguments().size())) {
    if (v.isTensor() && c10::isQIntType(v.toTensor().scalar_type())) dtype = v.toTensor().scalar_type();
    if (v.isInt() && v.toInt() >= 0 && v.toInt() < int64_t(c10::ScalarType::NumOptions) &&
        c10::isQIntType(c10::ScalarType(v.toInt())))
      dtype = c10::ScalarType(v.toInt());
  }
  torchneuron::aten::check_not_quantized(c10::toString(op.operator_name()), dtype);
}
}  // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_quantized>());
}

namespace {
// Ops that would otherwise reach neuron through a composite kernel, launched
// directly instead, each call one task running the CPU kernel:
// - structured ops (add.Tensor, mm, ...): their composite wrapper runs the
//   C++ meta function, allocates, then dispatches the out= op; launching the
//   op itself skips that hop (the output plan is cached) and lets the device
//   check name the op;
// - the _foreach_* family, whose composite kernel loops over the list;
// - ops whose composite form is a decomposition although a CPU kernel exists
//   (layer_norm's goes through batch_norm plus reshapes, for example);
// - composite kernels that call device-specific code (a DispatchStub, a
//   device-type check) with the tensors they are given: they run whole in
//   the task, on the CPU views.
struct DirectLaunchRegistration {
  DirectLaunchRegistration() {
    static const std::unordered_set<std::string> decomposed = {
        "aten::native_layer_norm", "aten::native_group_norm", "aten::_stack", "aten::addr", "aten::all", "aten::any"};
    static const std::unordered_set<std::string> host_composite = {"aten::conj_physical_", "aten::mode.values"};
    static const std::unordered_set<std::string> keep_composite = {"aten::copy_"};  // -> _copy_from
    auto& dispatcher = c10::Dispatcher::singleton();
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0 || keep_composite.count(name.name)) continue;
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
      bool foreach = name.name.rfind("aten::_foreach_", 0) == 0;
      bool cpu = op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
      bool structured = cpu && op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
      std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      if (!foreach && !structured && !(cpu && decomposed.count(name.name)) && !host_composite.count("aten::" + qualified))
        continue;
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&torchneuron::aten::launch>());
    }
  }
} direct_launch_registration;
}  // namespace
