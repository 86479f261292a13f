// Per-thread current device and current stream per device, as in CUDA, plus
// the lazy-initialisation and fork checks every device entry point passes.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "../runtime/Runtime.h"

namespace torchneuron::backend {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// First device use: validates the environment, refuses use in a child forked
// after initialisation (like CUDA), and arms the fork check.
void lazy_init();
bool is_initialized();
bool is_in_bad_fork();

c10::DeviceIndex device_count() noexcept;
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex device);
// Raises c10::Error naming the index and the number of devices.
void check_device_index(c10::DeviceIndex device);

c10::Stream current_stream(c10::DeviceIndex device = -1);
c10::Stream default_stream(c10::DeviceIndex device = -1);
void set_current_stream(c10::Stream stream);
c10::Stream stream_from_pool(c10::DeviceIndex device, int priority);
runtime::Stream& runtime_stream(c10::Stream stream);

// Whether launches synchronise after each task (NEURON_LAUNCH_BLOCKING=1).
bool launch_blocking();
// Synchronises `stream` and converts a task error into the right c10::Error.
void synchronize_stream(c10::Stream stream);
void synchronize_device(c10::DeviceIndex device);

}  // namespace torchneuron::backend
