"""Inductor code generation for the ``neuron`` device.

Inductor's C++ kernel generator writes loops over raw pointers, which is what a
NeuronCore program is in the emulator: kernel bodies may treat device memory
as host memory. What changes for neuron is how a kernel is *launched*. A CPU
kernel runs when the wrapper calls it; a neuron kernel is enqueued as one task
on the current stream of its device, exactly like an eager op, so compiled and
eager work interleave in stream order and the host never waits.

Three pieces do this:
- ``NeuronScheduling`` (Inductor's C++ scheduling) marks the kernels it
  defines, so a graph that mixes CPU and neuron tensors keeps the two apart;
- ``NeuronWrapperCodegen`` loads marked kernels with ``load_kernel`` and
  passes the device index first in every call;
- ``load_kernel`` compiles the kernel with a binding that packs the
  arguments and hands them to the runtime (``_C._compiled_kernel_launcher``).
"""

from __future__ import annotations

import os

import torch
from torch._inductor.async_compile import AsyncCompile, get_compile_threads
from torch._inductor.codecache import CppPythonBindingsCodeCache, LambdaFuture
from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.scheduler import BaseSchedulerNode

from .. import _C

DEVICE = "neuron"
_MARK = "// torchneuron: neuron kernel\n"
_PYBINDING = "async_compile.cpp_pybinding("


class NeuronScheduling(CppScheduling):
    """Inductor's C++ scheduling; kernel sources carry a neuron mark."""

    def define_kernel(self, src_code, nodes, kernel_args=None):
        return super().define_kernel(_MARK + src_code, nodes, kernel_args)


class _NeuronKernelCalls:
    """Wrapper-codegen behaviour shared by the graph and subgraph wrappers."""

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from torchneuron.compile.inductor import load_kernel as load_neuron_kernel")

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=True, cpp_definition=None):
        if _MARK in kernel_body and kernel_body.startswith(_PYBINDING):
            kernel_body = f"load_neuron_kernel({kernel_name!r}, " + kernel_body[len(_PYBINDING):]
        super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or torch._inductor.virtualized.V.graph.get_current_device_or_throw()
        if device.type != DEVICE or triton:
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
        index = -1 if device.index is None else device.index
        graph = torch._inductor.virtualized.V.graph
        target = f"{DEVICE}:{index}" if index >= 0 else DEVICE
        args = []
        for arg in call_args:
            buffer = graph.try_get_buffer(arg) if isinstance(arg, str) else None
            arg_device = getattr(buffer, "get_device", lambda: None)()
            if arg_device is not None and arg_device.type == "cpu":
                # A host scalar read by a device kernel: the task reads memory
                # later, so the value is copied to the device at launch, as an
                # eager op snapshots its host arguments.
                arg = f"{arg}.to({target!r})"
            args.append(arg)
        self.writeline(self.wrap_kernel_call(kernel_name, [str(index), *args]))


class NeuronWrapperCodegen(_NeuronKernelCalls, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()


class NeuronSubgraphWrapperCodegen(_NeuronKernelCalls, SubgraphPythonWrapperCodegen):
    def write_header(self) -> None:
        pass  # the parent graph's header has the import


class NeuronCppWrapperUnsupported:
    """``cpp_wrapper=True`` would call kernels directly from C++, bypassing the stream."""

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError(
            "torch.compile on neuron: Inductor's cpp_wrapper is not supported; "
            "remove the option 'cpp_wrapper' (kernels are launched on neuron streams from the Python wrapper)"
        )


# The binding: parse the Python arguments as Inductor's own binding does, but
# instead of calling kernel() now, pack the arguments and enqueue the call.
_BINDING = """
// Python binding: enqueue kernel() on a neuron stream.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

static void* (*_torchinductor_pyobject_tensor_data_ptr)(PyObject* obj);
static void (*_torchneuron_enqueue)(const char*, int, void (*)(void*), void (*)(void*), void*);

template <typename T> static inline T parse_arg(PyObject* args, size_t n) {{
    static_assert(std::is_pointer_v<T>, "arg type must be pointer or long");
    return static_cast<T>(_torchinductor_pyobject_tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
}}
template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {{
    auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
    if (result == -1 && PyErr_Occurred()) throw std::runtime_error("expected int arg");
    return result;
}}
template <> inline float parse_arg<float>(PyObject* args, size_t n) {{
    auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
    if (result == -1.0 && PyErr_Occurred()) throw std::runtime_error("expected float arg");
    return static_cast<float>(result);
}}

struct kernel_args {{ {fields} }};
static void kernel_run(void* p) {{ auto* a = static_cast<kernel_args*>(p); kernel({members}); }}
static void kernel_drop(void* p) {{ delete static_cast<kernel_args*>(p); }}

static PyObject* kernel_py(PyObject* self, PyObject* args) {{
    try {{
        if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != {nargs})
            throw std::runtime_error("{name}: expected a device index and {nkernel} kernel arguments");
        int device = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(args, 0)));
        auto* packed = new kernel_args{{ {parsed} }};
        _torchneuron_enqueue("{name}", device, kernel_run, kernel_drop, packed);
        Py_RETURN_NONE;
    }} catch (std::exception const& e) {{
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }}
}}

static PyMethodDef py_methods[] = {{{{"kernel", kernel_py, METH_VARARGS, ""}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef py_module = {{PyModuleDef_HEAD_INIT, "kernel", NULL, -1, py_methods}};

static uintptr_t address_from_env(const char* name) {{
    const char* text = std::getenv(name);
    return text ? std::strtoull(text, nullptr, 10) : 0;
}}

PyMODINIT_FUNC PyInit_kernel(void) {{
    _torchinductor_pyobject_tensor_data_ptr = reinterpret_cast<decltype(_torchinductor_pyobject_tensor_data_ptr)>(
        address_from_env("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"));
    _torchneuron_enqueue = reinterpret_cast<decltype(_torchneuron_enqueue)>(
        address_from_env("_TORCHNEURON_COMPILED_KERNEL_LAUNCHER"));
    if (!_torchinductor_pyobject_tensor_data_ptr || !_torchneuron_enqueue) {{
        PyErr_SetString(PyExc_RuntimeError, "neuron kernel library loaded without its launcher addresses");
        return nullptr;
    }}
    return PyModule_Create(&py_module);
}}
"""


class NeuronKernelCodeCache(CppPythonBindingsCodeCache):
    """Compiled neuron kernels, cached in memory and on disk like Inductor's CPU kernels."""

    cache: dict = {}

    @classmethod
    def _load_library_inner(cls, path, key):
        os.environ["_TORCHNEURON_COMPILED_KERNEL_LAUNCHER"] = str(_C._compiled_kernel_launcher())
        return super()._load_library_inner(path, key)

    @classmethod
    def load_kernel(cls, name: str, argtypes: list[str], source: str):
        types = [t.replace("const ", "") for t in argtypes]
        binding = _BINDING.format(
            name=name,
            nargs=len(types) + 1,
            nkernel=len(types),
            fields=" ".join(f"{t} a{i};" for i, t in enumerate(types)),
            members=", ".join(f"a->a{i}" for i in range(len(types))),
            parsed=", ".join(f"parse_arg<{t}>(args, {i + 1})" for i, t in enumerate(types)),
        )
        # Compiled on Inductor's compile threads, as its own C++ kernels are: the
        # generated module's async_compile.wait(globals()) resolves the future.
        # (Compiling each kernel as the module defines it made a 48-kernel
        # program wait for 48 compiles one after another.)
        if get_compile_threads() <= 1:
            # Inline: load_async calls submit_fn under the kernel's file lock, and a
            # one-thread AsyncCompile.submit compiles there and takes the same lock
            # again (filelock does not re-enter: a 600 s hang, then Timeout).
            return cls.load_async(source + binding, "cpu")().kernel
        get_result = cls.load_async(source + binding, "cpu", submit_fn=AsyncCompile.submit)
        return LambdaFuture(lambda: get_result().kernel)


def load_kernel(name: str, argtypes: list[str], source: str):
    """Compiles (or fetches from the caches) a neuron kernel; returns its launcher, or a
    future of it when Inductor compiles on several threads."""
    return NeuronKernelCodeCache.load_kernel(name, argtypes, source)


# Inductor takes a device it does not know for a GPU in two questions it asks
# of the device type. Neuron code comes from the C++ backend, so both must
# answer as for CPU: which kernel language generates a node (dtype
# propagation and index types depend on it), and whether a scheduler node is
# C++-generated (loop reordering otherwise assumes Triton iteration groups).
_stock_get_current_backend = torch._inductor.utils.get_current_backend


def _get_current_backend(device_type: str | None = None) -> str:
    if device_type is None:
        device_type = torch._inductor.virtualized.V.graph.get_current_device_or_throw().type
    return "cpp" if device_type == DEVICE else _stock_get_current_backend(device_type)


def _scheduler_node_is_cpu(node) -> bool:
    device = node.get_device()
    return device is not None and device.type in ("cpu", DEVICE)


def _answer_for_neuron_as_for_cpu() -> None:
    # Modules that imported get_current_backend by name hold their own binding.
    for module in (torch._inductor.utils, torch._inductor.codegen.common, torch._inductor.scheduler):
        module.get_current_backend = _get_current_backend
    BaseSchedulerNode.is_cpu = _scheduler_node_is_cpu


def register() -> None:
    """Makes Inductor generate code for neuron tensors (idempotent)."""
    from .flex_attention import DenseFlexAttention

    register_backend_for_device(
        DEVICE,
        NeuronScheduling,
        NeuronWrapperCodegen,
        NeuronCppWrapperUnsupported,
        device_custom_pass=DenseFlexAttention(),
    )
    register_device_op_overrides(DEVICE, _NeuronDeviceOps())
    _answer_for_neuron_as_for_cpu()


class _NeuronDeviceOps(torch._inductor.codegen.common.DeviceOpOverrides):
    """What Inductor's wrapper writes for device-level calls on neuron."""

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"
