"""NKI kernels as PyTorch operators: ``torchneuron.nki_op`` and ``torchneuron.wrap_nki``.

The operator's real implementation calls the kernel (a device task on neuron tensors, the
simulator on CPU tensors); its fake implementation runs only the kernel's check pass, so
``torch.compile`` traces the call into its graph from the kernel's output declarations, without
a graph break. Autograd works through ``op.register_autograd`` with backward kernels.
"""

import ast
import inspect
import itertools
import textwrap
import re
import typing

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torchneuron.nki import typing as nt
from torchneuron.nki._kernel import Kernel, jit

_SCALAR_TYPES = {int: "SymInt", float: "float", bool: "bool", str: "str"}
_counter = itertools.count()
_wrapped = {}


def _type_of(param, annotation):
    if annotation is torch.Tensor or isinstance(annotation, nt.tensor.__class__):  # nt.tensor[...], nt.mutable_tensor
        return "Tensor"
    if annotation in _SCALAR_TYPES:
        return _SCALAR_TYPES[annotation]
    if annotation is not inspect.Parameter.empty:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is typing.Union and type(None) in args:
            inner = [a for a in args if a is not type(None)][0]
            return _type_of(param, inner) + "?"
        if origin is list and args and args[0] in _SCALAR_TYPES:
            return _SCALAR_TYPES[args[0]].replace("SymInt", "int") + "[]"
        raise TypeError(f"nki_op: cannot map the annotation {annotation!r} of parameter {param.name!r} to an "
                        "operator schema type; pass schema=")
    if param.default is inspect.Parameter.empty:
        return "Tensor"
    if param.default is None:
        return "Tensor?"
    for t, name in _SCALAR_TYPES.items():
        if type(param.default) is t:
            return name
    raise TypeError(f"nki_op: cannot infer the schema type of parameter {param.name!r} from its default "
                    f"{param.default!r}; annotate it or pass schema=")


def _default(value):
    if isinstance(value, str):
        return '"' + value + '"'
    return "None" if value is None else str(value)


def _returns_a_value(fn) -> bool:
    """Whether ``fn``'s source has a ``return <value>`` (True when the source is unavailable)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True
    body = tree.body[0]
    nested = {id(n) for node in ast.walk(body) if node is not body and
              isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for n in ast.walk(node)}
    return any(isinstance(n, ast.Return) and n.value is not None and id(n) not in nested for n in ast.walk(body))


def infer_schema(kernel: Kernel, mutates_args) -> str:
    """An operator schema from the kernel's signature: tensors without defaults, scalars from defaults."""
    parts, letters = [], iter("abcdefghijklmnopqrstuvwxyz")
    hints = typing.get_type_hints(kernel.fn) if kernel.fn.__annotations__ else {}
    for param in kernel.signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"nki_op: kernel {kernel.fn.__name__} has *args/**kwargs; an operator needs named "
                            "parameters")
        kind = _type_of(param, hints.get(param.name, inspect.Parameter.empty))
        if param.name in mutates_args:
            if not kind.startswith("Tensor"):
                raise TypeError(f"nki_op: mutates_args names {param.name!r}, which is not a tensor parameter")
            kind = f"Tensor({next(letters)}!)"
        default = "" if param.default is inspect.Parameter.empty else "=" + _default(param.default)
        parts.append(f"{kind} {param.name}{default}")
    ret = hints.get("return", inspect.Parameter.empty)
    if ret is inspect.Parameter.empty and not _returns_a_value(kernel.fn):
        ret = None
    if ret is None or ret is type(None):
        returns = "()"
    elif typing.get_origin(ret) is tuple:
        returns = "(" + ", ".join("Tensor" for _ in typing.get_args(ret)) + ")"
    else:
        returns = "Tensor"
    return f"({', '.join(parts)}) -> {returns}"


def nki_op(name: str, mutates_args=(), *, schema: str | None = None):
    """Decorator: registers an NKI kernel as the operator ``name`` ("namespace::op").

    Returns the operator (a ``torch.library.CustomOpDef``): call it like a function, use it in
    ``torch.compile``d code, give it a backward with ``op.register_autograd(...)``.
    """
    mutates_args = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)

    def decorator(kernel):
        base = kernel if isinstance(kernel, Kernel) else jit(kernel)
        kernel = Kernel(base.fn, tuple(dict.fromkeys(base.mutates_args + mutates_args)), base.grid, base._plans,
                        base.platform_target, strict_inputs=True)
        mutated = kernel.mutates_args  # the decorator's and the kernel's own
        op_schema = schema or infer_schema(kernel, mutated)
        returns_nothing = op_schema.rstrip().endswith("-> ()")
        names = list(kernel.signature.parameters)

        def impl(*args):
            out = kernel(*args)
            return None if returns_nothing else out

        op = torch.library.custom_op(name, impl, mutates_args=mutated, schema=op_schema)

        @op.register_fake
        def fake(*args):
            with unset_fake_temporarily():
                plan, _ = kernel.check(dict(zip(names, args)))
            if returns_nothing:
                return None
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
            outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in plan.outputs]
            return _fake_returns(plan.returns, outs, name)

        op.kernel = kernel
        return op

    return decorator


def _fake_returns(returns, outs, name):
    if isinstance(returns, (tuple, list)) and (not returns or not isinstance(returns[0], str)):
        return tuple(_fake_returns(r, outs, name) for r in returns)
    kind, index = returns
    if kind != "out":
        raise RuntimeError(f"{name}: the kernel returns its input {index!r}; an operator must return new tensors "
                           "(declare the input in mutates_args and return nothing instead)")
    return outs[index]


def wrap_nki(kernel, mutates_args=()):
    """``kernel`` (an nki.jit kernel, optionally ``kernel[grid]``) as an operator with a generated name."""
    key = (id(getattr(kernel, "fn", kernel)), getattr(kernel, "grid", ()), tuple(mutates_args))
    op = _wrapped.get(key)
    if op is None:
        fn = getattr(kernel, "fn", kernel)
        base = re.sub(r"\W", "_", fn.__qualname__)
        grid = "_".join(str(g) for g in getattr(kernel, "grid", ()))
        op = nki_op(f"torchneuron_nki::{base}{'_grid_' + grid if grid else ''}_{next(_counter)}",
                    mutates_args=mutates_args)(kernel)
        _wrapped[key] = op
    return op
