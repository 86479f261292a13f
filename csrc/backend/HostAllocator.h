// Pinned (page-locked) host memory for pin_memory() and asynchronous copies.
// A block that an asynchronous copy still reads is not reused until the
// copy's stream has passed the event recorded for it.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torchneuron::backend {

at::HostAllocator& pinned_allocator();
bool is_pinned_ptr(const void* ptr);

}  // namespace torchneuron::backend
