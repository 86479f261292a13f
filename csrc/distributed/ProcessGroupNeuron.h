// The `neuron` c10d backend: Gloo drives the transfers, on host views of
// device memory, once the device has reached the collective.
//
// A collective launched from the host checks its tensors (Gloo's own checks
// would only run later, inside the task), makes the group's communication
// stream wait for the caller's current stream, and enqueues a task there
// that runs the Gloo collective on host views of the buffers. It returns at
// once with a WorkNeuron whose wait() orders the caller's current stream
// after the task (as NCCL does), so compute queued meanwhile overlaps the
// transfer. Point-to-point ops run on a send and a receive stream per peer,
// so a rank can post a receive while its send waits for the peer. CPU
// tensors go to a second Gloo group, whose order cannot mix with the device's.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "WorkNeuron.h"

namespace torchneuron::distributed {

class ProgressPublisher;

class ProcessGroupNeuron : public c10d::Backend {
 public:
  // `gloo` and `gloo_cpu` are ProcessGroupGloo over the same ranks: one for
  // device tensors, one for CPU tensors.
  ProcessGroupNeuron(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                     c10::intrusive_ptr<c10d::Backend> gloo, c10::intrusive_ptr<c10d::Backend> gloo_cpu);
  ~ProcessGroupNeuron() override;

  const std::string getBackendName() const override { return "neuron"; }
  bool supportsSplitting() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Old-style coalescing (`_coalescing_manager(device=...)`): the collectives
  // inside run as they are issued; the region's Work is its last one, since
  // one stream runs them in order.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }
  // Waits for every communication task of this group, then stops Gloo.
  void shutdown() override;

 private:
  enum class Lane { Collective, Send, Recv };
  // Runs `body` on host views of `tensors` (flattened in the order the body
  // expects) in a task on the lane's stream, after the caller's current
  // stream; the body runs the Gloo op and waits for it.
  using Body = std::function<void(std::vector<at::Tensor>& views)>;
  c10::intrusive_ptr<c10d::Work> launch(const char* op, Lane lane, const std::vector<at::Tensor>& tensors,
                                        std::vector<at::Tensor> results, Body body, int peer = -1);
  // True when every tensor is on the CPU (those go to the CPU Gloo group);
  // raises for a mix, for another device than the group's, for non-dense ones.
  bool on_cpu(const char* op, const std::vector<at::Tensor>& tensors);
  // Throws the failure that broke this group, if any.
  void check_usable(const char* op) const;
  std::string describe_failure(const char* op, uint64_t seq, int peer, const std::exception& e) const;
  c10::Stream lane_stream(Lane lane, int peer);
  // Waits (without raising) until this group's streams have run their tasks.
  void wait_for_lanes();

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> gloo_, gloo_cpu_;
  std::atomic<int64_t> timeout_ms_;
  std::atomic<uint64_t> issued_{0};  // collectives launched (p2p ops are not numbered)
  std::shared_ptr<ProgressPublisher> progress_;
  bool coalescing_ = false;
  c10::intrusive_ptr<c10d::Work> last_coalesced_;
  // The first communication failure; the group refuses work after it (as
  // NCCL aborts its communicator), since Gloo's pairs are left mid-transfer.
  mutable std::mutex failure_mutex_;
  std::shared_ptr<const std::string> failure_;
  // The device this group communicates for (one device per rank, as NCCL),
  // and the communication streams it leased there: one for collectives,
  // one per peer for sends and for receives.
  std::mutex streams_mutex_;
  c10::DeviceIndex device_ = -1;
  int collective_stream_ = -1;
  std::map<int, int> send_streams_, recv_streams_;
};

}  // namespace torchneuron::distributed
