#include "Generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorImpl.h>

#include <random>
#include <vector>

#include "Current.h"

namespace torchneuron::backend {

namespace {
// splitmix64: decorrelates neighbouring (seed, offset) pairs.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

NeuronGenerator::NeuronGenerator(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGenerator::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}
uint64_t NeuronGenerator::current_seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}
uint64_t NeuronGenerator::seed() {
  uint64_t s = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  set_current_seed(s);
  return s;
}
void NeuronGenerator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  offset_ = offset;
}
uint64_t NeuronGenerator::get_offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}

void NeuronGenerator::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.device().is_cpu() && new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.numel() == 16,
              "RNG state for neuron must be a CPU torch.uint8 tensor of 16 elements (seed, offset), got ",
              new_state.numel(), " elements of ", new_state.dtype());
  const auto* data = static_cast<const uint64_t*>(new_state.data());
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = data[0];
  offset_ = data[1];
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGenerator::get_state() const {
  auto state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  auto* data = static_cast<uint64_t*>(state.data_ptr());
  std::lock_guard<std::mutex> lock(mutex_);
  data[0] = seed_;
  data[1] = offset_;
  return state.getIntrusivePtr();
}

at::Generator NeuronGenerator::next_cpu_generator() {
  uint64_t s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = mix(seed_ ^ mix(offset_++));
  }
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

NeuronGenerator* NeuronGenerator::clone_impl() const {
  auto* g = new NeuronGenerator(device().index(), current_seed());
  g->set_offset(get_offset());
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::vector<at::Generator>* generators = [] {
    auto* v = new std::vector<at::Generator>();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) v->push_back(at::make_generator<NeuronGenerator>(d));
    return v;
  }();
  if (device < 0) device = current_device();
  check_device_index(device);
  return (*generators)[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<NeuronGenerator>(device);
}

}  // namespace torchneuron::backend
