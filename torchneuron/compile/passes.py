"""The decompositions and FX passes the neuron backend applies before Inductor."""

from __future__ import annotations

import torch
from torch._inductor.decomposition import select_decomp_table


def decompositions() -> dict:
    """Inductor's table: it already keeps matmuls and convolutions whole (extern kernels)."""
    return select_decomp_table()


def config_patches() -> dict:
    """Inductor settings the neuron backend starts from (user options override them)."""
    return {}
