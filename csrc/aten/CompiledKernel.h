// Entry point through which Inductor-generated kernels enqueue themselves.
#pragma once

#include <cstdint>

namespace torchneuron::aten {

// Address of `void enqueue_compiled_kernel(const char* name, int device,
// void (*run)(void*), void (*drop)(void*), void* args)`: enqueues run(args) on
// the current stream of `device` (-1: the current device); drop(args) frees
// the arguments once the task is done.
uintptr_t compiled_kernel_launcher();

}  // namespace torchneuron::aten
