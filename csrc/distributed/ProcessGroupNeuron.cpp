#include "ProcessGroupNeuron.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "../aten/HostArgs.h"
#include "../aten/Launcher.h"
#include "../backend/Allocator.h"
#include "../backend/Current.h"
#include "../profiler/Recorder.h"
#include "../runtime/Stream.h"
#include "Diagnostics.h"

namespace torchneuron::distributed {

namespace {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

std::string message_of(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

// Tasks capture list lengths, never the caller's tensors: a task's captures
// die on the stream's thread, and a tensor with a Python object would need
// the GIL there (which the host may hold while it waits for that stream).
std::vector<size_t> lengths(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<size_t> out;
  for (const auto& l : lists) out.push_back(l.size());
  return out;
}

// Splits `views` into the first `n` and lists of the given lengths after them.
using SplitViews = std::pair<std::vector<at::Tensor>, std::vector<std::vector<at::Tensor>>>;
SplitViews split_views(const std::vector<at::Tensor>& views, size_t n, const std::vector<size_t>& lens) {
  std::vector<at::Tensor> head(views.begin(), views.begin() + n);
  std::vector<std::vector<at::Tensor>> lists;
  for (size_t len : lens) {
    lists.emplace_back(views.begin() + n, views.begin() + n + len);
    n += len;
  }
  return {head, lists};
}

template <typename... Lists>
std::vector<at::Tensor> concat(const Lists&... lists) {
  std::vector<at::Tensor> out;
  (out.insert(out.end(), lists.begin(), lists.end()), ...);
  return out;
}

// --- checks Gloo would make inside the task, made at the call ---------------

void check_root(const char* op, int64_t root, int size) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, op, ": invalid root rank ", root, " for a group of ", size, " ranks");
}

void check_like(const char* op, const char* what, const at::Tensor& t, const at::Tensor& like) {
  TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), op, ": ", what, " has dtype ", t.scalar_type(),
                   " but the input has ", like.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == like.numel(), op, ": ", what, " has ", t.numel(), " elements but the input has ",
                    like.numel());
}

// One list of `size` tensors, each like `like`.
void check_list(const char* op, const char* what, const std::vector<std::vector<at::Tensor>>& lists, int size,
                const at::Tensor& like) {
  TORCH_CHECK_VALUE(lists.size() == 1, op, ": expected one ", what, " list, got ", lists.size());
  TORCH_CHECK_VALUE(int(lists[0].size()) == size, op, ": the ", what, " list has ", lists[0].size(),
                    " tensors; the group has ", size, " ranks");
  for (const auto& t : lists[0]) check_like(op, what, t, like);
}

// `whole` holds one `part` per rank: an all-gather's output, a reduce-scatter's input.
void check_whole(const char* op, const char* whole_name, const at::Tensor& whole, const char* part_name,
                 const at::Tensor& part, int size) {
  TORCH_CHECK_VALUE(whole.numel() == part.numel() * size, op, ": the ", whole_name, " has ", whole.numel(),
                    " elements but ", size, " ranks x ", part.numel(), " ", part_name, " elements were expected");
  TORCH_CHECK_TYPE(whole.scalar_type() == part.scalar_type(), op, ": ", whole_name, " dtype ", whole.scalar_type(),
                   " differs from ", part_name, " dtype ", part.scalar_type());
}

void check_single(const char* op, const char* what, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 1, op, ": expected one ", what, " tensor, got ", tensors.size());
}

void check_reduce_op(const char* op, const c10d::ReduceOp& reduce_op, const std::vector<at::Tensor>& tensors) {
  auto kind = reduce_op.op_;
  TORCH_CHECK_NOT_IMPLEMENTED(kind != c10d::ReduceOp::PREMUL_SUM, op,
                              ": ReduceOp.PREMUL_SUM is not supported by the neuron backend");
  bool bitwise = kind == c10d::ReduceOp::BAND || kind == c10d::ReduceOp::BOR || kind == c10d::ReduceOp::BXOR;
  for (const auto& t : tensors) {
    TORCH_CHECK_TYPE(kind != c10d::ReduceOp::AVG || at::isFloatingType(t.scalar_type()) ||
                         at::isComplexType(t.scalar_type()),
                     op, ": ReduceOp.AVG needs floating-point tensors, got ", t.scalar_type());
    TORCH_CHECK_TYPE(!bitwise || at::isIntegralType(t.scalar_type(), /*includeBool=*/true), op,
                     ": bitwise reductions need integer or bool tensors, got ", t.scalar_type());
  }
}

void check_splits(const char* op, const char* what, const std::vector<int64_t>& splits, const at::Tensor& t,
                  int size) {
  if (splits.empty()) {
    TORCH_CHECK_VALUE(t.dim() > 0 && t.size(0) % size == 0, op, ": the ", what, " (sizes ", t.sizes(),
                      ") does not split evenly into ", size, " ranks along dim 0");
    return;
  }
  TORCH_CHECK_VALUE(int(splits.size()) == size, op, ": ", splits.size(), " ", what, " split sizes for ", size,
                    " ranks");
  int64_t sum = 0;
  for (int64_t s : splits) {
    TORCH_CHECK_VALUE(s >= 0, op, ": negative ", what, " split size ", s);
    sum += s;
  }
  TORCH_CHECK_VALUE(t.dim() > 0 && sum == t.size(0), op, ": the ", what, " split sizes add up to ", sum,
                    " but the ", what, " has ", t.dim() ? t.size(0) : 0, " rows");
}

// Gloo has no AVG: such reductions run as SUM and divide afterwards.
struct Average {
  bool requested = false;
  int size = 1;
  Average(c10d::ReduceOp& reduce_op, int world) : size(world) {
    if (reduce_op.op_ != c10d::ReduceOp::AVG) return;
    requested = true;
    reduce_op = c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
  void apply(const std::vector<at::Tensor>& results) const {
    if (requested)
      for (const auto& t : results) t.div_(size);
  }
};

void finish(const WorkPtr& work) {
  if (work) work->wait();
}

std::string signature(const char* op, uint64_t seq, int rank, const std::vector<at::Tensor>& views) {
  std::ostringstream s;
  s << op << " #" << seq << " on rank " << rank << " (tensors";
  for (const auto& v : views) s << " " << v.scalar_type() << v.sizes();
  s << ")";
  return s.str();
}

WorkPtr completed_work() {
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  done->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
  return c10d::Work::create_from_future(done);
}

}  // namespace

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                       std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> gloo,
                                       c10::intrusive_ptr<c10d::Backend> gloo_cpu)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      gloo_(std::move(gloo)),
      gloo_cpu_(std::move(gloo_cpu)),
      timeout_ms_(timeout.count()),
      progress_(std::make_shared<ProgressPublisher>(store_, rank)) {
  TORCH_CHECK(gloo_ && gloo_cpu_, "ProcessGroupNeuron: two Gloo backends are required");
}

ProcessGroupNeuron::~ProcessGroupNeuron() {
  // Tasks hold the group, so none is pending here: the streams are free.
  std::lock_guard<std::mutex> lock(streams_mutex_);
  if (device_ < 0) return;
  if (collective_stream_ >= 0) runtime::release_communication_stream(device_, collective_stream_);
  for (const auto* lanes : {&send_streams_, &recv_streams_})
    for (const auto& [peer, id] : *lanes) runtime::release_communication_stream(device_, id);
}

void ProcessGroupNeuron::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ms_ = timeout.count();
  gloo_->setTimeout(timeout);
  gloo_cpu_->setTimeout(timeout);
}

c10::Stream ProcessGroupNeuron::lane_stream(Lane lane, int peer) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  int* id = lane == Lane::Collective ? &collective_stream_
            : lane == Lane::Send     ? &send_streams_.try_emplace(peer, -1).first->second
                                     : &recv_streams_.try_emplace(peer, -1).first->second;
  if (*id < 0) *id = runtime::acquire_communication_stream(device_);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_), *id);
}

void ProcessGroupNeuron::wait_for_lanes() {
  std::vector<int> ids;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    if (device_ < 0) return;
    if (collective_stream_ >= 0) ids.push_back(collective_stream_);
    for (const auto* lanes : {&send_streams_, &recv_streams_})
      for (const auto& [peer, id] : *lanes) ids.push_back(id);
  }
  for (int id : ids) {
    auto& s = runtime::get_stream(device_, id);
    s.wait_until(s.enqueued());
  }
}

bool ProcessGroupNeuron::on_cpu(const char* op, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(!tensors.empty(), op, ": no tensors given");
  const c10::Device first = tensors.front().device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    TORCH_CHECK_VALUE(t.device() == first, op, ": all tensors must be on one device; tensor 0 is on ", first,
                      " but tensor ", i, " is on ", t.device());
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided, op, ": tensor ", i,
                      " is not dense; the neuron backend communicates strided tensors only");
    TORCH_CHECK_VALUE(t.is_contiguous() || t.is_contiguous(c10::MemoryFormat::ChannelsLast), op, ": tensor ", i,
                      " on ", t.device(), " is not contiguous (sizes ", t.sizes(), ", strides ", t.strides(),
                      "); call .contiguous() first");
  }
  TORCH_CHECK_VALUE(first.is_cpu() || first.type() == c10::DeviceType::PrivateUse1, op,
                    ": the neuron backend takes neuron or CPU tensors, got ", first);
  check_usable(op);
  if (first.is_cpu()) return true;
  std::lock_guard<std::mutex> lock(streams_mutex_);
  if (device_ < 0) device_ = first.index();  // bound by its first device collective, as NCCL
  TORCH_CHECK_VALUE(first.index() == device_, op, ": this process group communicates for neuron:", int(device_),
                    ", got tensors on ", first, " (one device per rank: torch.neuron.set_device(LOCAL_RANK))");
  return false;
}

void ProcessGroupNeuron::check_usable(const char* op) const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (failure_)
    C10_THROW_ERROR(DistBackendError, std::string(op) + ": the neuron process group (rank " +
                                          std::to_string(getRank()) + ") is unusable after an earlier failure: " +
                                          *failure_);
}

std::string ProcessGroupNeuron::describe_failure(const char* op, uint64_t seq, int peer,
                                                 const std::exception& e) const {
  std::ostringstream msg;
  msg << op;
  if (seq) msg << " (collective #" << seq << " of this group)";
  msg << " failed on rank " << getRank() << " of " << getSize() << " (group timeout "
      << double(timeout_ms_.load()) / 1000 << " s)";
  if (peer >= 0) {
    msg << " talking to rank " << peer;
  } else if (seq) {
    try {
      auto behind = progress_->behind(seq, getSize());
      if (behind.empty()) {
        msg << ": every rank reached it (a rank may have exited inside it)";
      } else {
        msg << ": ranks [";
        for (size_t i = 0; i < behind.size(); ++i) msg << (i ? ", " : "") << behind[i].first;
        msg << "] did not reach it (";
        for (size_t i = 0; i < behind.size(); ++i)
          msg << (i ? ", " : "") << "rank " << behind[i].first << " is at #" << behind[i].second;
        msg << ", as published up to 100 ms ago)";
      }
    } catch (const std::exception&) {
      msg << " (the store is unreachable, so the missing ranks are unknown)";
    }
  }
  msg << ". Gloo: " << message_of(e);
  return msg.str();
}

WorkPtr ProcessGroupNeuron::launch(const char* op, Lane lane, const std::vector<at::Tensor>& tensors,
                                   std::vector<at::Tensor> results, Body body, int peer) {
  TORCH_CHECK_NOT_IMPLEMENTED(!coalescing_ || lane == Lane::Collective, op,
                              " inside a coalescing region is not supported by the neuron backend; use "
                              "batch_isend_irecv for point-to-point batches");
  TORCH_CHECK(!runtime::device_capturing(device_), op, ": collectives cannot be captured into a neuron graph (",
              tensors.front().device(), " is capturing)");
  const c10::Stream caller = backend::current_stream(device_);
  const c10::Stream stream = lane_stream(lane, peer);
  runtime::Stream& comm = backend::runtime_stream(stream);
  runtime::Stream& after = backend::runtime_stream(caller);
  const uint64_t caller_tail = after.enqueued();

  std::vector<aten::TensorSnapshot> snapshots;
  snapshots.reserve(tensors.size());
  for (const auto& t : tensors) {
    snapshots.emplace_back(t);
    // The caller may free these before the transfer ran: keep the memory.
    if (t.storage().data()) backend::caching_allocator().recordStream(t.storage().data_ptr(), stream);
  }
  const uint64_t seq = lane == Lane::Collective ? ++issued_ : 0;
  auto outcome = std::make_shared<TaskOutcome>();
  auto self = c10::intrusive_ptr<ProcessGroupNeuron>::unsafe_reclaim_from_nonowning(this);

  std::shared_ptr<runtime::TaskRecord> record;
  if (profiler::recording()) {
    int64_t bytes = 0;
    for (const auto& t : tensors) bytes += int64_t(t.numel()) * int64_t(t.itemsize());
    record = profiler::record_task(op, device_, int(stream.id()), {runtime::TaskKind::kCollective, bytes, bytes, 0});
  }
  uint64_t task = comm.enqueue([self, op, seq, peer, caller_tail, &after, outcome, record = record.get(),
                                snapshots = std::move(snapshots), body = std::move(body)] {
    after.wait_until(caller_tail);
    // The transfer starts once the caller's stream got here.
    if (record) record->start_ns.store(runtime::trace_clock_ns(), std::memory_order_relaxed);
    std::shared_ptr<const std::string> earlier;
    {
      std::lock_guard<std::mutex> lock(self->failure_mutex_);
      earlier = self->failure_;
    }
    if (earlier) {
      // Queued behind a failure: fail at once, not after another timeout.
      outcome->error = std::string(op) + " was skipped: the group is unusable after an earlier failure: " + *earlier;
    } else {
      try {
        aten::HostStorages shared;
        std::vector<at::Tensor> views;
        views.reserve(snapshots.size());
        for (const auto& s : snapshots) views.push_back(s.view(&shared));
        if (seq) self->progress_->reached(seq);
        InFlight running(signature(op, seq, self->getRank(), views));
        body(views);
      } catch (const std::exception& e) {
        outcome->error = self->describe_failure(op, seq, peer, e);
        std::lock_guard<std::mutex> lock(self->failure_mutex_);
        if (!self->failure_) self->failure_ = std::make_shared<const std::string>(outcome->error);
      }
    }
    // The stream keeps the error too, so torch.neuron.synchronize() reports it.
    if (outcome->failed()) outcome->raise();
  }, std::move(record));
  aten::detail::after_enqueue(comm);
  c10d::OpType type = lane == Lane::Send   ? c10d::OpType::SEND
                      : lane == Lane::Recv ? c10d::OpType::RECV
                                           : c10d::OpType::UNKNOWN;
  auto work = c10::make_intrusive<WorkNeuron>(getRank(), type, op, stream, task, outcome, std::move(results));
  if (coalescing_) last_coalesced_ = work;
  return work;
}

void ProcessGroupNeuron::startCoalescing() {
  TORCH_CHECK(!coalescing_, "startCoalescing: the neuron process group is already coalescing");
  coalescing_ = true;
  last_coalesced_.reset();
}

WorkPtr ProcessGroupNeuron::endCoalescing() {
  TORCH_CHECK(coalescing_, "endCoalescing: the neuron process group is not coalescing");
  coalescing_ = false;
  auto work = std::move(last_coalesced_);
  return work ? work : completed_work();
}

WorkPtr ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  check_root("broadcast", opts.rootRank, getSize());
  if (on_cpu("broadcast", tensors)) return gloo_cpu_->broadcast(tensors, opts);
  return launch("broadcast", Lane::Collective, tensors, tensors,
                [gloo = gloo_, opts](std::vector<at::Tensor>& v) { finish(gloo->broadcast(v, opts)); });
}

WorkPtr ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  check_reduce_op("all_reduce", opts.reduceOp, tensors);
  if (on_cpu("all_reduce", tensors)) return gloo_cpu_->allreduce(tensors, opts);
  c10d::AllreduceOptions o = opts;
  Average avg(o.reduceOp, getSize());
  return launch("all_reduce", Lane::Collective, tensors, tensors, [gloo = gloo_, o, avg](std::vector<at::Tensor>& v) {
    finish(gloo->allreduce(v, o));
    avg.apply(v);
  });
}

WorkPtr ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                const c10d::AllreduceCoalescedOptions& opts) {
  check_reduce_op("all_reduce_coalesced", opts.reduceOp, tensors);
  for (const auto& t : tensors)
    TORCH_CHECK_TYPE(t.scalar_type() == tensors[0].scalar_type(), "all_reduce_coalesced: tensors of dtypes ",
                     tensors[0].scalar_type(), " and ", t.scalar_type());
  if (on_cpu("all_reduce_coalesced", tensors)) return gloo_cpu_->allreduce_coalesced(tensors, opts);
  c10d::AllreduceCoalescedOptions o = opts;
  Average avg(o.reduceOp, getSize());
  return launch("all_reduce_coalesced", Lane::Collective, tensors, tensors,
                [gloo = gloo_, o, avg](std::vector<at::Tensor>& v) {
                  finish(gloo->allreduce_coalesced(v, o));
                  avg.apply(v);
                });
}

WorkPtr ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_root("reduce", opts.rootRank, getSize());
  check_reduce_op("reduce", opts.reduceOp, tensors);
  check_single("reduce", "input", tensors);
  if (on_cpu("reduce", tensors)) return gloo_cpu_->reduce(tensors, opts);
  c10d::ReduceOptions o = opts;
  Average avg(o.reduceOp, getSize());
  bool root = o.rootRank == getRank();
  return launch("reduce", Lane::Collective, tensors, tensors,
                [gloo = gloo_, o, avg, root](std::vector<at::Tensor>& v) {
                  finish(gloo->reduce(v, o));
                  if (root) avg.apply(v);
                });
}

WorkPtr ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                      const c10d::AllgatherOptions& opts) {
  check_single("all_gather", "input", inputs);
  check_list("all_gather", "output", outputs, getSize(), inputs[0]);
  auto all = concat(inputs, flat(outputs));
  if (on_cpu("all_gather", all)) return gloo_cpu_->allgather(outputs, inputs, opts);
  return launch("all_gather", Lane::Collective, all, flat(outputs),
                [gloo = gloo_, opts, lens = lengths(outputs)](std::vector<at::Tensor>& v) {
                  auto [in, out] = split_views(v, 1, lens);
                  finish(gloo->allgather(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                            const c10d::AllgatherOptions& opts) {
  check_whole("all_gather_into_tensor", "output", output, "input", input, getSize());
  if (on_cpu("all_gather_into_tensor", {input, output})) return gloo_cpu_->_allgather_base(output, input, opts);
  return launch("all_gather_into_tensor", Lane::Collective, {input, output}, {output},
                [gloo = gloo_, opts](std::vector<at::Tensor>& v) { finish(gloo->_allgather_base(v[1], v[0], opts)); });
}

WorkPtr ProcessGroupNeuron::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == size_t(getSize()), "all_gather_coalesced: ", outputs.size(),
                    " output lists for ", getSize(), " ranks");
  for (const auto& list : outputs) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), "all_gather_coalesced: an output list has ", list.size(),
                      " tensors but there are ", inputs.size(), " inputs");
    for (size_t i = 0; i < list.size(); ++i) check_like("all_gather_coalesced", "an output", list[i], inputs[i]);
  }
  auto all = concat(inputs, flat(outputs));
  if (on_cpu("all_gather_coalesced", all)) return gloo_cpu_->allgather_coalesced(outputs, inputs, opts);
  return launch("all_gather_coalesced", Lane::Collective, all, flat(outputs),
                [gloo = gloo_, opts, lens = lengths(outputs), n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto [in, out] = split_views(v, n, lens);
                  finish(gloo->allgather_coalesced(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "all_gather_into_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i)
    check_whole("all_gather_into_tensor_coalesced", "output", outputs[i], "input", inputs[i], getSize());
  auto all = concat(inputs, outputs);
  if (on_cpu("all_gather_into_tensor_coalesced", all))
    return gloo_cpu_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  return launch("all_gather_into_tensor_coalesced", Lane::Collective, all, outputs,
                [gloo = gloo_, opts, n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto [in, out] = split_views(v, n, {n});
                  finish(gloo->allgather_into_tensor_coalesced(out[0], in, opts));
                });
}

WorkPtr ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                   const c10d::GatherOptions& opts) {
  check_root("gather", opts.rootRank, getSize());
  check_single("gather", "input", inputs);
  if (opts.rootRank == getRank())
    check_list("gather", "output", outputs, getSize(), inputs[0]);
  else
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                      "gather: only the destination rank passes output tensors");
  auto all = concat(inputs, flat(outputs));
  if (on_cpu("gather", all)) return gloo_cpu_->gather(outputs, inputs, opts);
  return launch("gather", Lane::Collective, all, flat(outputs),
                [gloo = gloo_, opts, lens = lengths(outputs)](std::vector<at::Tensor>& v) {
                  auto [in, out] = split_views(v, 1, lens);
                  finish(gloo->gather(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                    const c10d::ScatterOptions& opts) {
  check_root("scatter", opts.rootRank, getSize());
  check_single("scatter", "output", outputs);
  if (opts.rootRank == getRank())
    check_list("scatter", "input", inputs, getSize(), outputs[0]);
  else
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                      "scatter: only the source rank passes input tensors");
  auto all = concat(outputs, flat(inputs));
  if (on_cpu("scatter", all)) return gloo_cpu_->scatter(outputs, inputs, opts);
  return launch("scatter", Lane::Collective, all, outputs,
                [gloo = gloo_, opts, lens = lengths(inputs)](std::vector<at::Tensor>& v) {
                  auto [out, in] = split_views(v, 1, lens);
                  finish(gloo->scatter(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ReduceScatterOptions& opts) {
  check_single("reduce_scatter", "output", outputs);
  check_list("reduce_scatter", "input", inputs, getSize(), outputs[0]);
  auto all = concat(outputs, flat(inputs));
  check_reduce_op("reduce_scatter", opts.reduceOp, all);
  if (on_cpu("reduce_scatter", all)) return gloo_cpu_->reduce_scatter(outputs, inputs, opts);
  c10d::ReduceScatterOptions o = opts;
  Average avg(o.reduceOp, getSize());
  return launch("reduce_scatter", Lane::Collective, all, outputs,
                [gloo = gloo_, o, avg, lens = lengths(inputs)](std::vector<at::Tensor>& v) {
                  auto [out, in] = split_views(v, 1, lens);
                  finish(gloo->reduce_scatter(out, in, o));
                  avg.apply(out);
                });
}

WorkPtr ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::ReduceScatterOptions& opts) {
  check_whole("reduce_scatter_tensor", "input", input, "output", output, getSize());
  check_reduce_op("reduce_scatter_tensor", opts.reduceOp, {input});
  if (on_cpu("reduce_scatter_tensor", {input, output})) return gloo_cpu_->_reduce_scatter_base(output, input, opts);
  c10d::ReduceScatterOptions o = opts;
  Average avg(o.reduceOp, getSize());
  return launch("reduce_scatter_tensor", Lane::Collective, {input, output}, {output},
                [gloo = gloo_, o, avg](std::vector<at::Tensor>& v) {
                  finish(gloo->_reduce_scatter_base(v[1], v[0], o));
                  avg.apply({v[1]});
                });
}

WorkPtr ProcessGroupNeuron::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "reduce_scatter_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i)
    check_whole("reduce_scatter_tensor_coalesced", "input", inputs[i], "output", outputs[i], getSize());
  auto all = concat(inputs, outputs);
  check_reduce_op("reduce_scatter_tensor_coalesced", opts.reduceOp, all);
  if (on_cpu("reduce_scatter_tensor_coalesced", all))
    return gloo_cpu_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  c10d::ReduceScatterOptions o = opts;
  Average avg(o.reduceOp, getSize());
  return launch("reduce_scatter_tensor_coalesced", Lane::Collective, all, outputs,
                [gloo = gloo_, o, avg, n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto [in, out] = split_views(v, n, {n});
                  finish(gloo->reduce_scatter_tensor_coalesced(out[0], in, o));
                  avg.apply(out[0]);
                });
}

WorkPtr ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                          std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "all_to_all_single: output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  check_splits("all_to_all_single", "input", input_splits, input, getSize());
  check_splits("all_to_all_single", "output", output_splits, output, getSize());
  if (on_cpu("all_to_all_single", {input, output}))
    return gloo_cpu_->alltoall_base(output, input, output_splits, input_splits, opts);
  return launch("all_to_all_single", Lane::Collective, {input, output}, {output},
                [gloo = gloo_, opts, output_splits, input_splits](std::vector<at::Tensor>& v) mutable {
                  finish(gloo->alltoall_base(v[1], v[0], output_splits, input_splits, opts));
                });
}

WorkPtr ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                     const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(int(inputs.size()) == getSize() && int(outputs.size()) == getSize(), "all_to_all: ",
                    inputs.size(), " inputs and ", outputs.size(), " outputs for ", getSize(), " ranks");
  auto all = concat(inputs, outputs);
  for (const auto& t : all)
    TORCH_CHECK_TYPE(t.scalar_type() == all[0].scalar_type(), "all_to_all: tensors of dtypes ", all[0].scalar_type(),
                     " and ", t.scalar_type());
  if (on_cpu("all_to_all", all)) return gloo_cpu_->alltoall(outputs, inputs, opts);
  return launch("all_to_all", Lane::Collective, all, outputs,
                [gloo = gloo_, opts, n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto [in, out] = split_views(v, n, {n});
                  finish(gloo->alltoall(out[0], in, opts));
                });
}

WorkPtr ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  TORCH_CHECK_VALUE(dst >= 0 && dst < getSize() && dst != getRank(), "send: invalid destination rank ", dst,
                    " (this is rank ", getRank(), " of ", getSize(), ")");
  check_single("send", "source", tensors);
  if (on_cpu("send", tensors)) return gloo_cpu_->send(tensors, dst, tag);
  return launch(
      "send", Lane::Send, tensors, {},
      [gloo = gloo_, dst, tag](std::vector<at::Tensor>& v) { finish(gloo->send(v, dst, tag)); }, dst);
}

WorkPtr ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  TORCH_CHECK_VALUE(src >= 0 && src < getSize() && src != getRank(), "recv: invalid source rank ", src,
                    " (this is rank ", getRank(), " of ", getSize(), ")");
  check_single("recv", "destination", tensors);
  if (on_cpu("recv", tensors)) return gloo_cpu_->recv(tensors, src, tag);
  return launch(
      "recv", Lane::Recv, tensors, tensors,
      [gloo = gloo_, src, tag](std::vector<at::Tensor>& v) { finish(gloo->recv(v, src, tag)); }, src);
}

WorkPtr ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK_NOT_IMPLEMENTED(on_cpu("recv", tensors),
                              "recv: receiving from any source is not supported for neuron tensors; name the source");
  return gloo_cpu_->recvAnysource(tensors, tag);
}

WorkPtr ProcessGroupNeuron::barrier(const c10d::BarrierOptions& opts) {
  check_usable("barrier");
  // This rank's queued work (its current stream and this group's transfers)
  // finishes first; the host then blocks in Gloo's barrier, so no rank
  // passes it early. Other groups' transfers are not waited for: they may
  // wait for a peer that is itself in this barrier.
  if (backend::is_initialized()) {
    auto& current = backend::runtime_stream(backend::current_stream(device_ >= 0 ? device_ : -1));
    current.wait_until(current.enqueued());
  }
  wait_for_lanes();
  check_usable("barrier");
  c10d::BarrierOptions o = opts;
  o.device_ids.clear();
  o.device.reset();
  gloo_->barrier(o)->wait();
  return completed_work();
}

void ProcessGroupNeuron::shutdown() {
  wait_for_lanes();
  gloo_->shutdown();
  gloo_cpu_->shutdown();
}

}  // namespace torchneuron::distributed
