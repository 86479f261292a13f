// Launching kernels compiled by Inductor for neuron.
//
// A generated kernel library does not link against torch or torchneuron; its
// Python binding packs the kernel's arguments and hands them here through a
// plain C function pointer (its address reaches the library through an
// environment variable, as Inductor does for its own helpers). The kernel then
// runs as one task on the device's current stream, like any eager op.
#include "CompiledKernel.h"

#include "Launcher.h"

namespace torchneuron::aten {

namespace {

extern "C" void enqueue_compiled_kernel(const char* name, int device, void (*run)(void*), void (*drop)(void*),
                                        void* args) {
  // The library owns `args` until the task has run; `drop` frees them. `name`
  // is a literal of the library, which is never unloaded.
  struct Payload {
    void (*run)(void*);
    void (*drop)(void*);
    void* args;
    Payload(void (*r)(void*), void (*d)(void*), void* a) : run(r), drop(d), args(a) {}
    Payload(Payload&& o) noexcept : run(o.run), drop(o.drop), args(o.args) { o.args = nullptr; }
    ~Payload() {
      if (args) drop(args);
    }
  };
  auto dev = device < 0 ? backend::current_device() : c10::DeviceIndex(device);
  enqueue(dev, name, [p = std::make_shared<Payload>(run, drop, args)] { p->run(p->args); });
}

}  // namespace

uintptr_t compiled_kernel_launcher() { return reinterpret_cast<uintptr_t>(&enqueue_compiled_kernel); }

}  // namespace torchneuron::aten
