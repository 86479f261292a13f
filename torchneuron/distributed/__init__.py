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

from datetime import timedelta

import torch.distributed as dist

from torchneuron import _C

BACKEND_NAME = "neuron"


def _create_backend(store: dist.Store, rank: int, world_size: int, timeout: timedelta):
    # Built through Python so that Gloo honours GLOO_SOCKET_IFNAME and
    # GLOO_DEVICE_TRANSPORT exactly as a plain "gloo" group does.
    gloo = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return _C._ProcessGroupNeuron(store, rank, world_size, timeout, gloo)


def _register() -> None:
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    # A list: a plain string would be taken as a sequence of device names.
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["neuron", "cpu"])


_register()
