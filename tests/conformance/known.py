"""The one list of conformance cases that are not plain comparisons, each with
its reason. The report prints it. Keys are OpInfo names (`name.variant`);
a dtype of None means every dtype.
"""

from __future__ import annotations

import torch

# Results that depend on a random stream (the device's generator is its own
# counter-based stream, as CUDA's is) or on uninitialised memory (empty*):
# values cannot equal CPU's, so only shapes and dtypes are compared.
RANDOM = {
    "bernoulli", "normal", "normal.number_mean", "normal.in_place", "uniform", "cauchy", "exponential", "geometric",
    "log_normal", "multinomial", "rand_like", "randn_like", "randint", "randint_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "native_dropout_backward", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "empty_permuted", "randn",
    # Randomised algorithms: a random projection decides which (equally valid) basis comes out.
    "pca_lowrank", "svd_lowrank",
}

# Ops whose algorithm PyTorch picks by device type: values legitimately
# differ from CPU's, so only shapes and dtypes are compared (as for RANDOM).
_LCE = ("LinearCrossEntropyOptions(acc_policy='auto') accumulates bf16/fp16 in float32 only on the "
        "device types PyTorch lists (cpu, cuda); elsewhere in the input dtype")
DEVICE_DEPENDENT = {
    ("nn.functional.linear_cross_entropy.chunked", torch.bfloat16): _LCE,
    ("nn.functional.linear_cross_entropy.chunked", torch.float16): _LCE,
    ("nn.functional.linear_cross_entropy.chunked_none", torch.bfloat16): _LCE,
    ("nn.functional.linear_cross_entropy.chunked_none", torch.float16): _LCE,
}

# Modules whose forward draws random numbers.
RANDOM_MODULES = {"nn.FractionalMaxPool2d", "nn.FractionalMaxPool3d"}

# Ops defined on the storage rather than on the tensor's elements: their
# noncontiguous twin and a strided view of a larger tensor address other
# memory, so only the samples as given are compared.
STORAGE_OPS = {"as_strided", "as_strided.partial_views", "as_strided_scatter", "as_strided_copy", "resize_",
               "resize_as_"}

# Samples that make an otherwise deterministic op draw random numbers
# (attention with dropout): compared on shapes and dtypes, like RANDOM.
def random_sample(name: str, sample) -> bool:
    kw = sample.kwargs
    if name == "nn.functional.multi_head_attention_forward":
        return bool(kw.get("training", True))  # dropout_p is positional; training=True applies it
    return any(isinstance(kw.get(k), (int, float)) and kw[k] > 0 and kw.get("training", True) is not False
               for k in ("dropout_p", "dropout"))


# Cases the device cannot run, with the reason.
IMPOSSIBLE: dict[tuple[str, torch.dtype | None], str] = {}


def values_not_compared(name: str, dtype) -> bool:
    return name in RANDOM or (name, dtype) in DEVICE_DEPENDENT


def impossible(name: str, dtype) -> str | None:
    return IMPOSSIBLE.get((name, dtype)) or IMPOSSIBLE.get((name, None))


def table() -> list[tuple[str, str, str, str]]:
    """(op, dtype, treatment, reason) rows for the report."""
    def why(name):
        return "uninitialised memory" if "empty" in name else "random stream"

    rows = [(name, "all", "shapes and dtypes only", why(name)) for name in sorted(RANDOM | RANDOM_MODULES)]
    rows += [(n, str(d).replace("torch.", ""), "shapes and dtypes only", r) for (n, d), r in DEVICE_DEPENDENT.items()]
    rows += [(name, "all", "samples as given only", "defined on the storage") for name in sorted(STORAGE_OPS)]
    rows += [(n, "all" if d is None else str(d).replace("torch.", ""), "not run", r) for (n, d), r in IMPOSSIBLE.items()]
    return rows
