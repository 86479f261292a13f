#include "HostTask.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <set>

#include "HostArgs.h"
#include "Launcher.h"

namespace torchneuron::aten {

namespace {
// Task names must outlive their tasks; kernels are few, so names are kept.
std::string_view interned(const std::string& name) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return *names.insert(name).first;
}
}  // namespace

uint64_t enqueue_host_task(const std::string& name, const std::vector<at::Tensor>& tensors,
                           std::function<void(const std::vector<at::Tensor>&)> body) {
  TORCH_CHECK(!tensors.empty(), name, ": a host task needs at least one neuron tensor to pick its device");
  c10::Device device = tensors.front().device();
  std::vector<TensorSnapshot> snapshots;
  snapshots.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    TORCH_CHECK(t.device() == device, name, ": expected all tensors on ", device, ", but tensor ", i, " is on ",
                t.device());
    TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, name, ": expected neuron tensors, got ", device);
    snapshots.emplace_back(t);
  }
  return enqueue(device.index(), interned(name),
                 [snapshots = std::move(snapshots), body = std::move(body)] {
                   HostStorages shared;
                   std::vector<at::Tensor> views;
                   views.reserve(snapshots.size());
                   for (const auto& s : snapshots) views.push_back(s.view(&shared));
                   body(views);
                 });
}

}  // namespace torchneuron::aten
