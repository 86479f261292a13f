"""The ``neuron`` c10d backend for ``torch.distributed``.

Importing torchneuron registers it, so ``dist.init_process_group("neuron")``
works, and so does ``dist.init_process_group()`` with no backend: it picks
the backend of the current accelerator, which is ``neuron``. The backend
also takes CPU tensors (through the same Gloo connections), so one group
serves device and host data. To pair neuron with a separate Gloo group for
CPU tensors instead, pass ``backend="cpu:gloo,neuron:neuron"``.

The transfers are Gloo's; see ``csrc/distributed/ProcessGroupNeuron.h`` for
how they are ordered with device work.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from torchneuron import _C

BACKEND_NAME = "neuron"


def _create_backend(store: dist.Store, rank: int, world_size: int, timeout: timedelta):
    # Built through Python so that Gloo honours GLOO_SOCKET_IFNAME and
    # GLOO_DEVICE_TRANSPORT exactly as a plain "gloo" group does. CPU tensors
    # get their own Gloo group: Gloo pairs collectives by call order, and
    # device collectives reach Gloo later, from the communication stream.
    gloo = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    gloo_cpu = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", store), rank, world_size, timeout)
    return _C._ProcessGroupNeuron(store, rank, world_size, timeout, gloo, gloo_cpu)


def _default_to_neuron(make_group):
    """PyTorch 2.13 trap: a new group's *default* backend (what DDP and
    others ask the group for) is chosen by name, and never a plugin:
    ``init_process_group()`` marks Gloo even though only ``neuron`` was
    created (DDP's constructor then fails: "Could not find backend type 1"),
    and "cpu:gloo,neuron:neuron" marks none. A group whose neuron backend is
    ours gets it as its default."""

    @functools.wraps(make_group)
    def wrapper(*args, **kwargs):
        pg, store = make_group(*args, **kwargs)
        if isinstance(pg, dist.ProcessGroup) and pg.rank() >= 0 and "neuron" in {d.type for d in pg._device_types}:
            if isinstance(pg._get_backend(torch.device("neuron")), _C._ProcessGroupNeuron):
                pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        return pg, store

    return wrapper


def _register() -> None:
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    # A list: a plain string would be taken as a sequence of device names.
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["neuron", "cpu"])
    c10d._new_process_group_helper = _default_to_neuron(c10d._new_process_group_helper)


_register()
