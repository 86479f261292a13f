// The `neuron` c10d backend: Gloo drives the transfers, on host views of
// device memory, once the device has reached the collective.
//
// A collective launched from the host: checks its tensors, makes the
// device's communication stream wait for the caller's current stream,
// and enqueues a task there that runs the Gloo collective on host views of
// the buffers. It returns at once with a WorkNeuron whose wait() orders the
// caller's current stream after the task (as NCCL does), so compute queued
// meanwhile overlaps the transfer. Point-to-point ops run on two more
// streams (sends, receives), so a rank can post a receive while its send
// waits for the peer. CPU tensors go to Gloo unchanged.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "WorkNeuron.h"

namespace torchneuron::distributed {

class ProcessGroupNeuron : public c10d::Backend {
 public:
  // `gloo` is a ProcessGroupGloo over the same store, rank and size.
  ProcessGroupNeuron(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                     c10::intrusive_ptr<c10d::Backend> gloo);
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
  // True when every tensor is on the CPU (those go straight to Gloo); raises
  // for a mix, for tensors on several neuron devices and for non-dense ones.
  bool on_cpu(const char* op, const std::vector<at::Tensor>& tensors) const;
  // Throws the failure that broke this group, if any.
  void check_usable(const char* op) const;
  std::string describe_failure(const char* op, uint64_t seq, int peer, const std::exception& e) const;
  c10::Stream lane_stream(Lane lane, c10::DeviceIndex device);
  // Publishes `reached_` in the store every 100 ms when it changed, so a
  // rank whose collective times out can tell which ranks never reached it,
  // without a store round trip per collective.
  void publish_progress();

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> issued_{0};   // collectives launched (p2p ops are not numbered)
  std::atomic<uint64_t> reached_{0};  // the last collective this rank's device started
  std::mutex publisher_mutex_;
  std::condition_variable publisher_cv_;
  bool stopping_ = false;
  std::thread publisher_;
  bool coalescing_ = false;
  c10::intrusive_ptr<c10d::Work> last_coalesced_;
  // The first communication failure; the group refuses work after it (as
  // NCCL aborts its communicator), since Gloo's pairs are left mid-transfer.
  mutable std::mutex failure_mutex_;
  std::shared_ptr<const std::string> failure_;
  // Lane streams per device: communication streams, taken on first use, so
  // groups do not share them (ranks may order two groups' work differently).
  std::mutex streams_mutex_;
  std::vector<std::array<int, 3>> lane_streams_;
};

}  // namespace torchneuron::distributed
