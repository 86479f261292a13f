// Host code run as a device task: the entry through which NKI kernels (whose
// bodies the emulated device executes on the host) join a stream's queue.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace torchneuron::aten {

// Enqueues body(views) on the current stream of the tensors' device, where
// views[i] is a CPU tensor over the device memory of tensors[i] (same sizes,
// strides and dtype; writes land in device memory). All tensors must be on
// one neuron device. Returns the task's sequence number on that stream. An
// exception in the body surfaces at the next synchronisation, naming `name`.
uint64_t enqueue_host_task(const std::string& name, const std::vector<at::Tensor>& tensors,
                           std::function<void(const std::vector<at::Tensor>&)> body);

}  // namespace torchneuron::aten
