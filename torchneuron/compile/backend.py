"""``torch.compile(backend="neuron")``.

Dynamo hands each captured graph to ``neuron_backend``, which runs Inductor's
``compile_fx``: AOTAutograd (forward and backward for training) with
Inductor's decompositions (they keep matmuls and convolutions whole, as extern
kernels, which is what runs fastest here), then Inductor's passes plus ours for
neuron graphs (``flex_attention.py``), then code generation for the neuron
device (``inductor.py``). Passing no decomposition table of our own keeps the
graphs cacheable: Inductor cannot hash a custom table, and would bypass its
FX graph cache. Options and modes are checked here, so a mistake
fails at the call that made it. A graph that fails to compile runs eagerly on
the device with one warning naming the graph and the reason, unless
``TORCHNEURON_COMPILE_STRICT=1`` asks for the error.
"""

from __future__ import annotations

import functools
import os
import re
import time
import warnings

import torch
from torch._dynamo.exc import RestartAnalysis, SkipFrame
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch._inductor.output_code import OutputCode

from .. import _C
from . import metrics
from .graphs import ReplayPolicy

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Inductor options that only mean something for GPU code generation.
_GPU_ONLY_PREFIXES = ("triton.", "cuda.", "rocm.", "xpu.", "halide.")


class CompileSettings:
    """What ``mode=`` and ``options=`` ask for, checked."""

    def __init__(self, mode: str | None, options: dict | None):
        mode = mode or "default"
        if mode not in MODES:
            raise RuntimeError(f"torch.compile(backend='neuron'): unrecognized mode={mode!r}, should be one of: "
                               f"{', '.join(MODES)}")
        self.replay = mode in ("reduce-overhead", "max-autotune")
        if mode.startswith("max-autotune"):
            warnings.warn(f"torch.compile(backend='neuron', mode={mode!r}): neuron has no kernel variants to "
                          f"autotune; compiling as mode={'reduce-overhead' if self.replay else 'default'!r}",
                          stacklevel=4)
        self.inductor_options: dict = {}
        known = torch._inductor.config.get_config_copy()
        for key, value in (options or {}).items():
            if key == "triton.cudagraphs":  # what Inductor's reduce-overhead sets: graph replay
                self.replay = bool(value)
            elif key not in known:
                raise RuntimeError(f"torch.compile(backend='neuron'): unexpected optimization option {key!r}; "
                                   f"options are Inductor config keys (torch._inductor.config)")
            elif key == "cpp_wrapper" and value:
                raise RuntimeError("torch.compile(backend='neuron'): option 'cpp_wrapper' is not supported: "
                                   "neuron kernels are launched on streams from the Python wrapper")
            elif key.startswith(_GPU_ONLY_PREFIXES):
                warnings.warn(f"torch.compile(backend='neuron'): option {key!r} only affects GPU code "
                              "generation and is ignored on neuron", stacklevel=4)
            else:
                self.inductor_options[key] = value


def _graph_name(gm: torch.fx.GraphModule) -> str:
    compile_id = torch._guards.CompileContext.current_compile_id()
    name = f"graph {compile_id}" if compile_id is not None else "graph"
    torch_dir = os.path.dirname(torch.__file__)
    for node in gm.graph.nodes:
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', node.meta.get("stack_trace") or "")
        if frames:
            # The innermost frame of user code (the model), not of torch's own functions.
            user = [f for f in frames if not f[0].startswith(torch_dir)]
            file, line, function = (user or frames)[-1]
            return f"{name} of {function} ({file}:{line})"
    return name


def _note_recompile(graph_name: str) -> None:
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is None or not compile_id.frame_compile_id or compile_id.compiled_autograd_id is not None:
        return
    # Dynamo keeps the reason in its metrics context (private, pinned torch).
    context = torch._dynamo.utils.get_metrics_context()
    reason = getattr(context, "_metrics", {}).get("recompile_reason") or "unknown"
    metrics.record(recompiles={"graph": graph_name, "reason": reason})


def _fallback_warning(graph_name: str, error: BaseException) -> str:
    reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    metrics.record(fallbacks={"graph": graph_name, "reason": reason})
    warnings.warn(f"torch.compile(backend='neuron'): {graph_name} failed to compile ({reason}); it runs eagerly "
                  "on the device. Set TORCHNEURON_COMPILE_STRICT=1 to raise the error instead.", stacklevel=3)
    return reason


def _strict() -> bool:
    return bool(_C._config()["compile_strict"])


class EagerGraph(OutputCode):
    """An ATen graph that failed to compile, run op by op (AOTAutograd's boxed convention)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__()
        self.gm = gm
        self._boxed_call = True

    def __call__(self, inputs):
        args = list(inputs)
        inputs.clear()
        return self.gm(*args)

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        pass

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


# Raised on purpose inside compilation to steer Dynamo; never a compile failure.
# (Not ShortenTraceback: Inductor's own failures, InductorError, derive from it.)
_CONTROL_FLOW = (RestartAnalysis, SkipFrame)


def _inner_compile(gm, example_inputs, *, graph_name: str, failed: list, **kwargs):
    """Inductor's per-graph compile (forward, backward or inference) with the eager fallback."""
    start = time.perf_counter()
    try:
        return compile_fx_inner(gm, example_inputs, **kwargs)
    except _CONTROL_FLOW:
        raise
    except Exception as error:
        if _strict():
            raise
        part = "backward" if kwargs.get("is_backward") else "forward"
        failed.append(part)
        _fallback_warning(f"the {part} of {graph_name}", error)
        return EagerGraph(gm)
    finally:
        if kwargs.get("is_backward"):  # forward compile time is counted by neuron_backend
            metrics.record(compile_seconds=time.perf_counter() - start)


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None,
                   options: dict | None = None, **unknown):
    """The ``neuron`` Dynamo backend (see the module docstring)."""
    if unknown:
        raise RuntimeError(f"torch.compile(backend='neuron'): unexpected arguments {sorted(unknown)}")
    from . import register

    register()
    settings = CompileSettings(mode, options)
    graph_name = _graph_name(gm)
    _note_recompile(graph_name)
    patches = dict(settings.inductor_options)
    if settings.replay:
        patches["cudagraph_policy"] = ReplayPolicy(graph_name)
    start = time.perf_counter()
    failed: list[str] = []
    try:
        compiled = compile_fx(
            gm,
            example_inputs,
            inner_compile=functools.partial(_inner_compile, graph_name=graph_name, failed=failed),
            config_patches=patches,
        )
    except _CONTROL_FLOW:
        raise
    except Exception as error:
        if _strict():
            raise
        _fallback_warning(graph_name, error)
        return gm.forward
    finally:
        metrics.record(compile_seconds=time.perf_counter() - start)
    if "forward" not in failed:
        metrics.record(compiled_graphs=1)
    return compiled
