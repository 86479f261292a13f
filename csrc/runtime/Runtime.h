// The runtime interface: the seam between PyTorch glue and the device.
//
// Everything the glue needs from the device goes through here: device
// discovery, memory, streams of tasks, events. No PyTorch type crosses it, so
// a hardware runtime can replace the emulated one without touching the glue.
// Only kernel bodies (tasks) may treat device memory as host memory, through
// host_address().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "Config.h"
#include "Event.h"
#include "Platform.h"
#include "Stream.h"

namespace torchneuron::runtime {

// Devices ------------------------------------------------------------------
int device_count();
// The physical NeuronCore id behind a logical device (NEURON_RT_VISIBLE_CORES).
int physical_core(int device);
// Throws std::out_of_range with a readable message for a bad index.
void check_device(int device);

// Memory -------------------------------------------------------------------
// Returns nullptr when the device's capacity would be exceeded.
void* device_malloc(int device, size_t nbytes);
void device_free(int device, void* ptr, size_t nbytes);
size_t device_capacity(int device);
size_t device_bytes_in_use(int device);
// Device that owns ptr (inside any live allocation), or -1.
int device_of_pointer(const void* ptr);
// Where a kernel body reads and writes device memory. Emulation: identity.
inline void* host_address(void* device_ptr) { return device_ptr; }
inline const void* host_address(const void* device_ptr) { return device_ptr; }

}  // namespace torchneuron::runtime
