// torch.accelerator.Graph for neuron: capture the tasks a stream launches and
// replay them as one task (the 2.13 device-neutral graph interface).
//
// Semantics follow CUDA graphs: capture runs on the current stream and records
// instead of executing; memory allocated during capture comes from a graph
// pool and is not reused elsewhere while a graph holding the pool lives;
// synchronising inside a capture is an error; replay runs on the current stream.
#include <ATen/core/GraphImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <unordered_map>

#include "../profiler/Recorder.h"
#include "../runtime/Graph.h"
#include "Allocator.h"
#include "Current.h"

namespace torchneuron::backend {

namespace {

// Pool ids this process hands out. A pool passed back to capture_begin
// (graph.pool()) is shared, as on CUDA: memory freed by one capture may serve
// a later one, so graphs sharing a pool must replay in capture order.
uint64_t pool_key(at::MempoolId_t id) { return id.first ? id.first : (id.second | (uint64_t(1) << 63)); }

at::MempoolId_t new_pool_id() {
  static std::atomic<at::CaptureId_t> next{1};
  return {next++, 0};
}

class NeuronGraph final : public at::GraphImplInterface {
 public:
  explicit NeuronGraph(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}
  ~NeuronGraph() override {
    if (capturing_) runtime_stream(stream_).end_capture();  // the stream must not keep recording into freed memory
    release();
  }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode) override {
    TORCH_CHECK(!captured_ && !capturing_, "neuron graph: capture_begin on a graph that already holds a capture; "
                "call reset() first");
    stream_ = current_stream();
    pool_ = (pool.first == 0 && pool.second == 0) ? new_pool_id() : pool;
    caching_allocator().retain_graph_pool(stream_.device_index(), pool_key(pool_));
    holds_pool_ = true;
    try {
      runtime_stream(stream_).begin_capture(&graph_, pool_key(pool_));
    } catch (const std::logic_error& e) {
      release();
      TORCH_CHECK(false, "neuron graph: ", e.what());
    }
    capturing_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "neuron graph: capture_end without capture_begin");
    TORCH_CHECK(current_stream(stream_.device_index()) == stream_, "neuron graph: capture_end on another stream than "
                "the capturing one (stream ", stream_.id(), "); capture must begin and end on the same stream");
    runtime_stream(stream_).end_capture();
    capturing_ = false;
    captured_ = true;
  }

  // Recorded tasks are directly replayable: nothing to build.
  void instantiate() override { TORCH_CHECK(captured_, "neuron graph: instantiate before a capture ended"); }

  void replay() override {
    TORCH_CHECK(captured_, "neuron graph: replay before a capture ended");
    runtime::Stream& stream = runtime_stream(current_stream(stream_.device_index()));
    std::shared_ptr<runtime::TaskRecord> record =
        profiler::recording()
            ? profiler::record_task("graph replay", stream.device(), stream.id(), {runtime::TaskKind::kGraph})
            : nullptr;
    uint64_t seq = graph_.replay_on(stream, std::move(record));
    replays_[&stream] = seq;
    if (launch_blocking()) stream.synchronize();
  }

  void reset() override {
    TORCH_CHECK(!capturing_, "neuron graph: reset during capture");
    release();
  }

  at::MempoolId_t pool() const override {
    TORCH_CHECK(holds_pool_, "neuron graph: pool() before capture_begin");
    return pool_;
  }

  void enable_debug_mode() override { debug_ = true; }
  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "neuron graph: debug_dump needs enable_debug_mode() before capture");
    TORCH_CHECK(false, "neuron graph: debug_dump(", path, ") is not supported: recorded tasks carry no "
                "printable description");
  }

 private:
  void release() {
    // The pool's memory may only be reused once queued replays are done.
    for (auto& [stream, seq] : replays_) stream->wait_until(seq);
    replays_.clear();
    graph_.clear();
    captured_ = false;
    if (holds_pool_) caching_allocator().release_graph_pool(stream_.device_index(), pool_key(pool_));
    holds_pool_ = false;
  }

  const bool keep_graph_;  // recorded tasks are always kept; nothing to free after instantiation
  runtime::Graph graph_;
  c10::Stream stream_{c10::Stream::DEFAULT, c10::Device(kNeuron, 0)};
  at::MempoolId_t pool_{0, 0};
  bool capturing_ = false, captured_ = false, holds_pool_ = false, debug_ = false;
  std::unordered_map<runtime::Stream*, uint64_t> replays_;  // last replay queued per stream
};

}  // namespace

}  // namespace torchneuron::backend

namespace at {
REGISTER_GRAPH_IMPL(NEURON, torchneuron::backend::NeuronGraph);
}
