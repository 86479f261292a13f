#include "ProcessGroupNeuron.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "../aten/HostArgs.h"
#include "../aten/Launcher.h"
#include "../backend/Allocator.h"
#include "../backend/Current.h"
#include "../runtime/Stream.h"

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

// Rebuilds lists of the given lengths from `views`, starting at `first`.
std::vector<std::vector<at::Tensor>> lists_like(const std::vector<size_t>& lens, const std::vector<at::Tensor>& views,
                                                size_t first) {
  std::vector<std::vector<at::Tensor>> out;
  for (size_t n : lens) {
    out.emplace_back(views.begin() + first, views.begin() + first + n);
    first += n;
  }
  return out;
}

std::vector<at::Tensor> slice(const std::vector<at::Tensor>& v, size_t first, size_t count) {
  return {v.begin() + first, v.begin() + first + count};
}

template <typename... Lists>
std::vector<at::Tensor> concat(const Lists&... lists) {
  std::vector<at::Tensor> out;
  (out.insert(out.end(), lists.begin(), lists.end()), ...);
  return out;
}

// Gloo has no AVG: such reductions run as SUM and divide afterwards.
struct Average {
  bool requested = false;
  int size = 1;
  Average(const char* op, c10d::ReduceOp& reduce_op, const std::vector<at::Tensor>& tensors, int world) : size(world) {
    if (reduce_op.op_ == c10d::ReduceOp::PREMUL_SUM)
      TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ReduceOp.PREMUL_SUM is not supported by the neuron backend");
    if (reduce_op.op_ != c10d::ReduceOp::AVG) return;
    for (const auto& t : tensors)
      TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()), op,
                       ": ReduceOp.AVG needs floating-point tensors, got ", t.scalar_type());
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

// Gloo calls std::terminate when a peer sends more bytes than a collective
// expects (ranks passed different shapes). The process cannot survive that,
// but it can say which collective it was in and how to get an exception.
std::mutex inflight_mutex;
std::string inflight;
std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void on_terminate() {
  std::unique_lock<std::mutex> lock(inflight_mutex, std::try_to_lock);
  if (lock.owns_lock() && !inflight.empty())
    std::fprintf(stderr,
                 "torchneuron: aborting during %s. Gloo aborts the process when ranks pass tensors of different "
                 "sizes to a collective; with TORCH_DISTRIBUTED_DEBUG=DETAIL the ranks compare shapes first and "
                 "raise an error instead.\n",
                 inflight.c_str());
  if (previous_terminate) previous_terminate();
  std::abort();
}

void note_inflight(std::string what) {
  static std::once_flag installed;
  std::call_once(installed, [] { previous_terminate = std::set_terminate(on_terminate); });
  std::lock_guard<std::mutex> lock(inflight_mutex);
  inflight = std::move(what);
}

std::string signature(const char* op, uint64_t seq, int rank, const std::vector<at::Tensor>& views) {
  std::ostringstream s;
  s << op << " #" << seq << " on rank " << rank << " (tensors";
  for (const auto& v : views) s << " " << v.scalar_type() << v.sizes();
  s << ")";
  return s.str();
}

}  // namespace

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                       std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> gloo)
    : c10d::Backend(rank, size), store_(std::move(store)), gloo_(std::move(gloo)), timeout_(timeout) {
  TORCH_CHECK(gloo_, "ProcessGroupNeuron: a Gloo backend is required");
  publisher_ = std::thread([this] { publish_progress(); });
}

ProcessGroupNeuron::~ProcessGroupNeuron() {
  {
    std::lock_guard<std::mutex> lock(publisher_mutex_);
    stopping_ = true;
  }
  publisher_cv_.notify_all();
  publisher_.join();
}

void ProcessGroupNeuron::publish_progress() {
  const std::string key = "neuron_progress/" + std::to_string(getRank());
  uint64_t published = 0;
  std::unique_lock<std::mutex> lock(publisher_mutex_);
  while (!stopping_) {
    publisher_cv_.wait_for(lock, std::chrono::milliseconds(100));
    uint64_t reached = reached_.load();
    if (reached == published) continue;
    lock.unlock();
    try {
      store_->set(key, std::to_string(reached));
      published = reached;
    } catch (const std::exception&) {
      // The store is gone (its host exited): failures will say so.
    }
    lock.lock();
  }
}

void ProcessGroupNeuron::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  gloo_->setTimeout(timeout);
}

c10::Stream ProcessGroupNeuron::lane_stream(Lane lane, c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  if (lane_streams_.size() <= size_t(device)) lane_streams_.resize(device + 1, {-1, -1, -1});
  int& id = lane_streams_[device][int(lane)];
  if (id < 0) id = runtime::communication_stream(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

bool ProcessGroupNeuron::on_cpu(const char* op, const std::vector<at::Tensor>& tensors) const {
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
  return first.is_cpu();
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
  msg << " failed on rank " << getRank() << " of " << getSize() << " after at most "
      << std::chrono::duration<double>(timeout_).count() << " s";
  if (peer >= 0) {
    msg << " talking to rank " << peer;
  } else if (seq) {
    // Ranks publish how far their devices got (publish_progress); those
    // behind never reached this collective.
    std::vector<int> behind;
    std::ostringstream where;
    try {
      for (int r = 0; r < getSize(); ++r) {
        if (r == getRank()) continue;
        std::string key = "neuron_progress/" + std::to_string(r);
        uint64_t reached = 0;
        if (store_->check({key})) {
          auto bytes = store_->get(key);
          reached = std::stoull(std::string(bytes.begin(), bytes.end()));
        }
        if (reached < seq) {
          behind.push_back(r);
          where << (where.tellp() ? ", " : "") << "rank " << r << " is at #" << reached;
        }
      }
      if (!behind.empty()) {
        msg << ": ranks [";
        for (size_t i = 0; i < behind.size(); ++i) msg << (i ? ", " : "") << behind[i];
        msg << "] did not reach it (" << where.str() << ")";
      } else {
        msg << ": every rank reached it (a rank may have exited inside it, or passed mismatched tensors)";
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
  check_usable(op);
  TORCH_CHECK_NOT_IMPLEMENTED(!coalescing_ || lane == Lane::Collective, op,
                              " inside a coalescing region is not supported by the neuron backend; use "
                              "batch_isend_irecv for point-to-point batches");
  const c10::DeviceIndex device = tensors.front().device().index();
  TORCH_CHECK(!runtime::device_capturing(device), op, ": collectives cannot be captured into a neuron graph (",
              tensors.front().device(), " is capturing)");
  const c10::Stream caller = backend::current_stream(device);
  const c10::Stream stream = lane_stream(lane, device);
  runtime::Stream& comm = backend::runtime_stream(stream);
  runtime::Stream& after = backend::runtime_stream(caller);
  const uint64_t caller_tail = &after == &comm ? 0 : after.enqueued();

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

  uint64_t task = comm.enqueue([self, op, seq, peer, caller_tail, &after, outcome,
                                snapshots = std::move(snapshots), body = std::move(body)] {
    after.wait_until(caller_tail);
    aten::HostStorages shared;
    std::vector<at::Tensor> views;
    views.reserve(snapshots.size());
    for (const auto& s : snapshots) views.push_back(s.view(&shared));
    try {
      if (seq) {
        self->reached_.store(seq);
        note_inflight(signature(op, seq, self->getRank(), views));
      }
      body(views);
    } catch (const std::exception& e) {
      std::string what = self->describe_failure(op, seq, peer, e);
      {
        std::lock_guard<std::mutex> lock(self->failure_mutex_);
        if (!self->failure_) self->failure_ = std::make_shared<const std::string>(what);
      }
      try {
        C10_THROW_ERROR(DistBackendError, what);
      } catch (...) {
        outcome->error = std::current_exception();
      }
    }
  });
  aten::detail::after_enqueue(comm);
  c10d::OpType type = lane == Lane::Send   ? c10d::OpType::SEND
                      : lane == Lane::Recv ? c10d::OpType::RECV
                                           : c10d::OpType::UNKNOWN;
  auto work = c10::make_intrusive<WorkNeuron>(getRank(), type, op, stream, task, outcome, std::move(results));
  if (coalescing_) last_coalesced_ = work;
  return work;
}

namespace {
c10::intrusive_ptr<c10d::Work> completed_work() {
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  done->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
  return c10d::Work::create_from_future(done);
}
}  // namespace

void ProcessGroupNeuron::startCoalescing() {
  TORCH_CHECK(!coalescing_, "startCoalescing: the neuron process group is already coalescing");
  coalescing_ = true;
  last_coalesced_.reset();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::endCoalescing() {
  TORCH_CHECK(coalescing_, "endCoalescing: the neuron process group is not coalescing");
  coalescing_ = false;
  auto work = std::move(last_coalesced_);
  return work ? work : completed_work();
}

WorkPtr ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  if (on_cpu("broadcast", tensors)) return gloo_->broadcast(tensors, opts);
  return launch("broadcast", Lane::Collective, tensors, tensors,
                [gloo = gloo_, opts](std::vector<at::Tensor>& v) { finish(gloo->broadcast(v, opts)); });
}

WorkPtr ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  if (on_cpu("all_reduce", tensors)) return gloo_->allreduce(tensors, opts);
  c10d::AllreduceOptions o = opts;
  Average avg("all_reduce", o.reduceOp, tensors, getSize());
  return launch("all_reduce", Lane::Collective, tensors, tensors, [gloo = gloo_, o, avg](std::vector<at::Tensor>& v) {
    finish(gloo->allreduce(v, o));
    avg.apply(v);
  });
}

WorkPtr ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                const c10d::AllreduceCoalescedOptions& opts) {
  if (on_cpu("all_reduce_coalesced", tensors)) return gloo_->allreduce_coalesced(tensors, opts);
  c10d::AllreduceCoalescedOptions o = opts;
  Average avg("all_reduce_coalesced", o.reduceOp, tensors, getSize());
  return launch("all_reduce_coalesced", Lane::Collective, tensors, tensors,
                [gloo = gloo_, o, avg](std::vector<at::Tensor>& v) {
                  finish(gloo->allreduce_coalesced(v, o));
                  avg.apply(v);
                });
}

WorkPtr ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  if (on_cpu("reduce", tensors)) return gloo_->reduce(tensors, opts);
  c10d::ReduceOptions o = opts;
  Average avg("reduce", o.reduceOp, tensors, getSize());
  bool root = o.rootRank == getRank();
  return launch("reduce", Lane::Collective, tensors, tensors,
                [gloo = gloo_, o, avg, root](std::vector<at::Tensor>& v) {
                  finish(gloo->reduce(v, o));
                  if (root) avg.apply(v);
                });
}

WorkPtr ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                      const c10d::AllgatherOptions& opts) {
  auto all = concat(inputs, flat(outputs));
  if (on_cpu("all_gather", all)) return gloo_->allgather(outputs, inputs, opts);
  return launch("all_gather", Lane::Collective, all, flat(outputs),
                [gloo = gloo_, opts, shape = lengths(outputs), n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto in = slice(v, 0, n);
                  auto out = lists_like(shape, v, n);
                  finish(gloo->allgather(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                            const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(), "all_gather_into_tensor: the output has ",
                    output.numel(), " elements but ", getSize(), " ranks x ", input.numel(),
                    " input elements were expected");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "all_gather_into_tensor: output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  if (on_cpu("all_gather_into_tensor", {input, output})) return gloo_->_allgather_base(output, input, opts);
  return launch("all_gather_into_tensor", Lane::Collective, {input, output}, {output},
                [gloo = gloo_, opts](std::vector<at::Tensor>& v) { finish(gloo->_allgather_base(v[1], v[0], opts)); });
}

WorkPtr ProcessGroupNeuron::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto all = concat(inputs, flat(outputs));
  if (on_cpu("all_gather_coalesced", all)) return gloo_->allgather_coalesced(outputs, inputs, opts);
  return launch("all_gather_coalesced", Lane::Collective, all, flat(outputs),
                [gloo = gloo_, opts, shape = lengths(outputs), n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto in = slice(v, 0, n);
                  auto out = lists_like(shape, v, n);
                  finish(gloo->allgather_coalesced(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  auto all = concat(inputs, outputs);
  if (on_cpu("all_gather_into_tensor_coalesced", all))
    return gloo_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  return launch("all_gather_into_tensor_coalesced", Lane::Collective, all, outputs,
                [gloo = gloo_, opts, n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto in = slice(v, 0, n);
                  auto out = slice(v, n, n);
                  finish(gloo->allgather_into_tensor_coalesced(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                   const c10d::GatherOptions& opts) {
  auto all = concat(inputs, flat(outputs));
  if (on_cpu("gather", all)) return gloo_->gather(outputs, inputs, opts);
  return launch("gather", Lane::Collective, all, flat(outputs),
                [gloo = gloo_, opts, shape = lengths(outputs), n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto in = slice(v, 0, n);
                  auto out = lists_like(shape, v, n);
                  finish(gloo->gather(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                    const c10d::ScatterOptions& opts) {
  auto all = concat(outputs, flat(inputs));
  if (on_cpu("scatter", all)) return gloo_->scatter(outputs, inputs, opts);
  return launch("scatter", Lane::Collective, all, outputs,
                [gloo = gloo_, opts, shape = lengths(inputs), n = outputs.size()](std::vector<at::Tensor>& v) {
                  auto out = slice(v, 0, n);
                  auto in = lists_like(shape, v, n);
                  finish(gloo->scatter(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ReduceScatterOptions& opts) {
  auto all = concat(outputs, flat(inputs));
  if (on_cpu("reduce_scatter", all)) return gloo_->reduce_scatter(outputs, inputs, opts);
  c10d::ReduceScatterOptions o = opts;
  Average avg("reduce_scatter", o.reduceOp, all, getSize());
  return launch("reduce_scatter", Lane::Collective, all, outputs,
                [gloo = gloo_, o, avg, shape = lengths(inputs), n = outputs.size()](std::vector<at::Tensor>& v) {
                  auto out = slice(v, 0, n);
                  auto in = lists_like(shape, v, n);
                  finish(gloo->reduce_scatter(out, in, o));
                  avg.apply(out);
                });
}

WorkPtr ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(), "reduce_scatter_tensor: the input has ",
                    input.numel(), " elements but ", getSize(), " ranks x ", output.numel(),
                    " output elements were expected");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "reduce_scatter_tensor: output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  if (on_cpu("reduce_scatter_tensor", {input, output})) return gloo_->_reduce_scatter_base(output, input, opts);
  c10d::ReduceScatterOptions o = opts;
  Average avg("reduce_scatter_tensor", o.reduceOp, {input}, getSize());
  return launch("reduce_scatter_tensor", Lane::Collective, {input, output}, {output},
                [gloo = gloo_, o, avg](std::vector<at::Tensor>& v) {
                  finish(gloo->_reduce_scatter_base(v[1], v[0], o));
                  avg.apply({v[1]});
                });
}

WorkPtr ProcessGroupNeuron::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  auto all = concat(inputs, outputs);
  if (on_cpu("reduce_scatter_tensor_coalesced", all))
    return gloo_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  c10d::ReduceScatterOptions o = opts;
  Average avg("reduce_scatter_tensor_coalesced", o.reduceOp, all, getSize());
  return launch("reduce_scatter_tensor_coalesced", Lane::Collective, all, outputs,
                [gloo = gloo_, o, avg, n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto in = slice(v, 0, n);
                  auto out = slice(v, n, n);
                  finish(gloo->reduce_scatter_tensor_coalesced(out, in, o));
                  avg.apply(out);
                });
}

WorkPtr ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                          std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  if (on_cpu("all_to_all_single", {input, output}))
    return gloo_->alltoall_base(output, input, output_splits, input_splits, opts);
  return launch("all_to_all_single", Lane::Collective, {input, output}, {output},
                [gloo = gloo_, opts, output_splits, input_splits](std::vector<at::Tensor>& v) mutable {
                  finish(gloo->alltoall_base(v[1], v[0], output_splits, input_splits, opts));
                });
}

WorkPtr ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                     const c10d::AllToAllOptions& opts) {
  auto all = concat(inputs, outputs);
  if (on_cpu("all_to_all", all)) return gloo_->alltoall(outputs, inputs, opts);
  return launch("all_to_all", Lane::Collective, all, outputs,
                [gloo = gloo_, opts, n = inputs.size()](std::vector<at::Tensor>& v) {
                  auto in = slice(v, 0, n);
                  auto out = slice(v, n, v.size() - n);
                  finish(gloo->alltoall(out, in, opts));
                });
}

WorkPtr ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  if (on_cpu("send", tensors)) return gloo_->send(tensors, dst, tag);
  return launch(
      "send", Lane::Send, tensors, {},
      [gloo = gloo_, dst, tag](std::vector<at::Tensor>& v) { finish(gloo->send(v, dst, tag)); }, dst);
}

WorkPtr ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  if (on_cpu("recv", tensors)) return gloo_->recv(tensors, src, tag);
  return launch(
      "recv", Lane::Recv, tensors, tensors,
      [gloo = gloo_, src, tag](std::vector<at::Tensor>& v) { finish(gloo->recv(v, src, tag)); }, src);
}

WorkPtr ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK_NOT_IMPLEMENTED(on_cpu("recv", tensors),
                              "recv: receiving from any source is not supported for neuron tensors; name the source");
  return gloo_->recvAnysource(tensors, tag);
}

WorkPtr ProcessGroupNeuron::barrier(const c10d::BarrierOptions& opts) {
  check_usable("barrier");
  // Everything this rank queued, communication included, finishes first; the
  // host then blocks in Gloo's barrier, so no rank passes it early.
  size_t devices = 0;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    devices = lane_streams_.size();
  }
  for (size_t d = 0; d < devices; ++d) backend::synchronize_device(c10::DeviceIndex(d));
  if (backend::is_initialized()) backend::synchronize_device(backend::current_device());
  check_usable("barrier");
  c10d::BarrierOptions o = opts;
  o.device_ids.clear();
  o.device.reset();
  gloo_->barrier(o)->wait();
  return completed_work();
}

void ProcessGroupNeuron::shutdown() {
  std::vector<std::array<int, 3>> lanes;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    lanes = lane_streams_;
  }
  for (size_t d = 0; d < lanes.size(); ++d)
    for (int id : lanes[d])
      if (id >= 0) runtime::get_stream(int(d), id).wait_until(runtime::get_stream(int(d), id).enqueued());
  gloo_->shutdown();
}

}  // namespace torchneuron::distributed
