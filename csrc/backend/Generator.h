// One random generator per device, counter-based like CUDA's Philox: the
// state is (seed, offset). Each random op takes the next offset when it is
// launched on the host, so results depend only on the seed and the launch
// order, never on when the device worker gets to the op.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>

namespace torchneuron::backend {

class NeuronGenerator : public c10::GeneratorImpl {
 public:
  explicit NeuronGenerator(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  // State tensor: 16 bytes on CPU, uint8 — the seed then the offset.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // A CPU generator for exactly one random op, advancing the offset.
  at::Generator next_cpu_generator();

 private:
  NeuronGenerator* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
  mutable std::mutex mutex_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace torchneuron::backend
