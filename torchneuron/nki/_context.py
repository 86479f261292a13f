"""The state of one kernel call: which pass is running, on which platform, and what is allocated.

A call runs the kernel body twice. The *check* pass runs it on scratch host tensors (random
values; the first call of each argument signature only; its plan is cached): every rule is
checked and the output declarations and the cost model's counts are collected, so a broken
kernel fails before any real data is written. The *run* pass executes the same body on the real
data (host views of device memory when the call targets a neuron device). Kernel control flow
cannot depend on tile data, so both passes take the same path. (Meta tensors would avoid the
arithmetic, but most of their element-wise shape functions run in Python in PyTorch 2.13 and
are slower than computing 128-partition tiles.)
"""

import functools
import threading
import weakref
from dataclasses import dataclass, field

import torch

from torchneuron import _C
from torchneuron.nki._errors import NKIError

_local = threading.local()


@dataclass
class Platform:
    """The NKI-relevant figures of a platform target, read from the runtime's platform table."""

    target: str
    pmax: int
    sbuf_partition_bytes: int
    psum_partition_bytes: int
    psum_banks: int
    psum_bank_fp32: int
    stationary_fmax: int
    moving_fmax: int
    figures: dict

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def named(target=None) -> "Platform":
        p = _C._platform() if target is None else _C._platform_by_name(target)
        return Platform(p["target"], p["pmax"], p["sbuf_partition_bytes"], p["psum_partition_bytes"],
                        p["psum_banks"], p["psum_bank_fp32"], p["matmul_stationary_fmax"],
                        p["matmul_moving_fmax"], p)

    @property
    def psum_bank_bytes(self) -> int:
        return self.psum_partition_bytes // self.psum_banks


@dataclass
class CallContext:
    platform: Platform
    checking: bool                      # True: the check pass on scratch tensors
    trial: bool = False                 # True: a batching trial on scratch tensors (see _kernel)
    batchable: bool = False             # the check pass met an affine_range or grid that could batch
    borrowing: bool = False             # loads may share an input's memory (the kernel writes no input)
    engine_state: object = None         # per core: accumulation registers, random generators (isa._state)
    grid: tuple = ()
    program: tuple = ()
    outputs: list = field(default_factory=list)         # shared_hbm tensors, in allocation order
    cursor: int = 0                     # declarations of shared_hbm tensors by the current program
    preset_outputs: list | None = None  # run pass: the buffers the check pass declared
    cost: object = None                 # a CostRecorder in the check pass when estimating
    sbuf_in_use: int = 0                # bytes per partition held by live tiles
    psum_in_use: int = 0                # banks held by live PSUM tiles
    written_inputs: tuple = ()         # the inputs the kernel wrote (names), after a run
    lnc: object = None                  # the programs of a multi-program grid (_lnc.Cores) while they run
    # batched execution (see _batch): the loops running batched, outermost first
    batching: bool = False
    unbatchable: set = field(default_factory=set)   # loop sites that run sequentially
    frame: tuple = ()                               # ids of the active batched loops
    loop_sizes: dict = field(default_factory=dict)  # loop id -> iterations
    loop_sites: dict = field(default_factory=dict)  # loop id -> site

    def push_loop(self, site, n: int) -> int:
        loop = len(self.loop_sizes)
        self.loop_sizes[loop], self.loop_sites[loop] = n, site
        self.frame = self.frame + (loop,)
        return loop

    def pop_loop(self, loop: int) -> None:
        self.frame = tuple(f for f in self.frame if f != loop)

    def allocate(self, owner, buffer_name: str, shape, itemsize: int) -> None:
        """Accounts a new on-chip tile until ``owner`` is garbage; raises when the buffer is full."""
        per_partition = itemsize
        for n in shape[1:]:
            per_partition *= n
        if buffer_name == "psum":
            bank = self.platform.psum_bank_bytes
            if per_partition > bank:
                raise NKIError("psum-bank", f"a PSUM tile of shape {tuple(shape)} needs {per_partition} bytes per "
                               f"partition, but a PSUM bank holds {bank} bytes ({self.platform.psum_bank_fp32} fp32) "
                               f"per partition on {self.platform.target}; split the free dimension")
            if self.psum_in_use + 1 > self.platform.psum_banks:
                raise NKIError("psum-capacity", f"a PSUM tile of shape {tuple(shape)} needs a bank, but all "
                               f"{self.platform.psum_banks} PSUM banks of {self.platform.target} are held by live "
                               "tiles; reuse a tile or let one go out of scope")
            self.psum_in_use += 1
            weakref.finalize(owner, self._release_psum)
        else:
            capacity = self.platform.sbuf_partition_bytes
            if self.sbuf_in_use + per_partition > capacity:
                raise NKIError("sbuf-capacity", f"an SBUF tile of shape {tuple(shape)} needs {per_partition} bytes "
                               f"per partition, but {self.sbuf_in_use} of the {capacity} bytes ({capacity // 1024} KiB) "
                               f"per partition of {self.platform.target} are held by live tiles")
            self.sbuf_in_use += per_partition
            weakref.finalize(owner, self._release_sbuf, per_partition)

    def _release_psum(self):
        self.psum_in_use -= 1

    def _release_sbuf(self, n):
        self.sbuf_in_use -= n


def inside_kernel() -> bool:
    return getattr(_local, "ctx", None) is not None


def current() -> CallContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise NKIError("outside-kernel", "NKI language functions can only be used inside a kernel called through "
                       "nki.jit (or nki.simulate)")
    return ctx


class active:
    """Makes ``ctx`` the current call context of this thread for a ``with`` block."""

    def __init__(self, ctx: CallContext):
        self.ctx = ctx

    def __enter__(self):
        self.prev = getattr(_local, "ctx", None)
        _local.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        _local.ctx = self.prev


_scratch_generator = torch.Generator().manual_seed(0)


def scratch(shape, dtype, stride=None):
    """Check-pass stand-in data: random values (so batched and sequential runs can be compared);
    integers from 1 to 7, so integer division stays defined."""
    t = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype) if stride is not None else \
        torch.empty(tuple(shape), dtype=dtype)
    if dtype.is_floating_point and dtype.itemsize > 1:
        return t.normal_(generator=_scratch_generator)
    if dtype.is_floating_point:  # float8: no random kernel
        return t.copy_(torch.randn(t.shape, generator=_scratch_generator))
    if dtype == torch.bool:
        return t.fill_(True)
    return t.copy_(torch.randint(1, 8, t.shape, generator=_scratch_generator))
