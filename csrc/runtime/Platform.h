// Public NeuronCore figures, selected by NEURON_PLATFORM_TARGET_OVERRIDE.
// Every other part of the project reads hardware numbers from here.
#pragma once

#include <cstddef>
#include <string>

namespace torchneuron::runtime {

struct Platform {
  std::string target;          // "trn2" | "trn3"
  std::string core_name;       // "NeuronCore-v3" | "NeuronCore-v4"
  int cores_per_chip;
  size_t hbm_per_chip_bytes;
  double hbm_bandwidth_tbps;   // per chip
  double core_bf16_tflops;     // tensor engine, per core
  double chip_bf16_tflops;
  double chip_fp8_tflops;
  int partitions;              // SBUF/PSUM partition count
  size_t sbuf_partition_bytes;
  size_t psum_partition_bytes;
  int psum_banks;
  int pmax;                    // partition dim limit of a tile
  int matmul_stationary_fmax;  // stationary free size limit
  int matmul_moving_fmax;      // moving free size limit
  int psum_bank_fp32;          // fp32 elements per partition per bank
  double vector_tflops, scalar_tflops;
  double tensor_clock_ghz, vector_clock_ghz, scalar_clock_ghz;

  size_t hbm_per_core_bytes() const { return hbm_per_chip_bytes / cores_per_chip; }
};

// The platform chosen by the environment (trn2 unless overridden).
const Platform& platform();
// Looks a target up by name; throws std::invalid_argument for unknown names.
const Platform& platform_by_name(const std::string& target);

}  // namespace torchneuron::runtime
