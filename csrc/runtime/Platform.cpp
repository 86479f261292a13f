#include "Platform.h"

#include <stdexcept>

#include "Config.h"

namespace torchneuron::runtime {

namespace {
constexpr size_t GiB = size_t(1) << 30;
constexpr size_t KiB = size_t(1) << 10;

const Platform kTrn2{
    "trn2", "NeuronCore-v3", 8, 96 * GiB, 2.9, 79.0, 667.0, 1299.0,
    128, 224 * KiB, 16 * KiB, 8, 128, 128, 512, 512,
    1.0, 1.2, 2.4, 0.96, 1.2};

const Platform kTrn3{
    "trn3", "NeuronCore-v4", 8, 144 * GiB, 4.7, 79.0, 671.0, 2517.0,
    128, 256 * KiB, 16 * KiB, 8, 128, 128, 512, 512,
    1.0, 1.2, 2.4, 0.96, 1.2};
}  // namespace

const Platform& platform_by_name(const std::string& target) {
  if (target == "trn2") return kTrn2;
  if (target == "trn3") return kTrn3;
  throw std::invalid_argument(
      "unknown platform target '" + target +
      "' (NEURON_PLATFORM_TARGET_OVERRIDE accepts trn2 or trn3)");
}

const Platform& platform() { return platform_by_name(config().platform_target); }

}  // namespace torchneuron::runtime
