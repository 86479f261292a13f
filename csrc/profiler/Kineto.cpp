// torch.profiler's view of the device: a Kineto activity profiler registered
// for PrivateUse1. Kineto asks it for a session whenever a profile includes
// ProfilerActivity.PrivateUse1; the session turns the recorder on and off and
// hands the recorded tasks to Kineto, each linked to the host op that
// launched it (so key_averages() can charge device time to that op).
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>
#include <output_base.h>

#include <map>
#include <set>
#include <string>

#include "../runtime/Runtime.h"
#include "Recorder.h"

namespace torchneuron::profiler {

namespace {

using libkineto::ActivityType;

// Kineto charges only these types to the device in its tables.
ActivityType activity_type(runtime::TaskKind kind) {
  return kind == runtime::TaskKind::kCopy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL;
}

std::string stream_name(int stream) {
  if (stream == 0) return "stream 0 (default)";
  if (stream >= runtime::kFirstCommunicationStream) return "stream " + std::to_string(stream) + " (communication)";
  return "stream " + std::to_string(stream);
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    start_session();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    trace_ = stop_session();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_activity,
                    int64_t, int64_t) override {
    if (!trace_) return;
    for (const auto& task : trace_->tasks) {
      int64_t end = task.end_ns.load(std::memory_order_acquire);  // first: it publishes start_ns
      int64_t start = task.start_ns.load(std::memory_order_relaxed);
      if (end == 0) continue;  // never ran (captured into a graph, or still queued)
      // A stream held for a collective is idle: key_averages() would count it
      // as device time (the Parquet export keeps it, as kind "wait").
      if (task.kind == runtime::TaskKind::kWait) continue;
      libkineto::GenericTraceActivity a;
      a.activityType = activity_type(task.kind);
      a.activityName = escape(std::string(task.name));  // kernel names come from users too
      a.startTime = start;
      a.endTime = end;
      // Kineto's ids are 32-bit; torch.profiler's correlation ids count host
      // ops from 1 per profile, far below that.
      a.id = int32_t(task.correlation);
      a.device = task.device;
      a.resource = task.stream;
      if (task.correlation && linked_activity) a.linked = linked_activity(int32_t(task.correlation));
      a.addMetadataQuoted("kind", runtime::task_kind_name(task.kind));
      a.addMetadata("stream", task.stream);
      a.addMetadata("queued us", double(start - task.enqueue_ns) / 1e3);
      if (task.bytes_read || task.bytes_written) {
        a.addMetadata("bytes read", task.bytes_read);
        a.addMetadata("bytes written", task.bytes_written);
      }
      if (task.flops) a.addMetadata("flops", task.flops);
      if (!task.replaced.empty()) a.addMetadataQuoted("replaced ops", escape(task.replaced));
      if (task.frame >= 0 && size_t(task.frame) < trace_->frames.size()) {
        const Frame& f = trace_->frames[task.frame];
        a.addMetadataQuoted("source", escape(f.file) + ":" + std::to_string(f.line));
      }
      logger.handleGenericActivity(a);
      lanes_[task.device].insert(task.stream);
    }
    // Lanes of devices after the first (which getDeviceInfo() names).
    for (const auto& [device, streams] : lanes_)
      if (device != first_device()) logger.handleDeviceInfo(device_info(device), trace_->start_ns);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(device_info(first_device()));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> infos;
    for (const auto& [device, streams] : lanes_)
      for (int s : streams) infos.push_back({s, s, device, stream_name(s)});
    return infos;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { push_correlation(id, false); }
  void popCorrelationId() override { pop_correlation(false); }
  void pushUserCorrelationId(uint64_t id) override { push_correlation(id, true); }
  void popUserCorrelationId() override { pop_correlation(true); }

 private:
  static libkineto::DeviceInfo device_info(int device) {
    // Past Kineto's largest process id, so device rows sort after the host's.
    return {device, device + libkineto::kExceedMaxPid, "neuron:" + std::to_string(device),
            "neuron:" + std::to_string(device) + " (" + runtime::platform().core_name + ")"};
  }
  int first_device() const { return lanes_.empty() ? 0 : lanes_.begin()->first; }
  // Kineto writes names and arguments into the Chrome trace's JSON as they are.
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (static_cast<unsigned char>(c) < 0x20) continue;  // control characters
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out;
  }

  std::shared_ptr<const Trace> trace_;
  std::map<int, std::set<int>> lanes_;  // device -> streams with tasks
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    static const std::string name = "neuron";
    return name;
  }

  const std::set<ActivityType>& availableActivities() const override {
    static const std::set<ActivityType> types = {ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY};
    return types;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // Kineto asks every plugin; record only when the profile wants device work.
    if (!types.count(ActivityType::CONCURRENT_KERNEL) && !types.count(ActivityType::GPU_MEMCPY)) return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }
};

}  // namespace

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace torchneuron::profiler
