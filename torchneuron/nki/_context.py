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
from dataclasses import dataclass, field

import numpy as np
import torch

from torchneuron import _C
from torchneuron.nki._errors import NKIError

_local = threading.local()


# What each NeuronCore generation can do, as the public NKI reference states it ("Available only on
# NeuronCore-v4 and newer"): capability -> the first generation that has it. Instructions ask
# Platform.has / isa._common.require for a name listed here; nothing else compares generations.
FIRST_GENERATION = {
    "nisa.exponential": 4,
    "nisa.rand2": 4,
    "nisa.quantize_mx": 4,                      # MX quantisation on the vector engine
    "nisa.nc_matmul_mx": 4,                     # MX matmul on the tensor engine
    "nisa.activation on the gpsimd engine": 4,
    "nisa.activate2": 4,
    "random state on the vector engine": 4,     # rand_set_state / rand_get_state on the vector engine
    "dma priority": 4,                          # the QoS priority= of DMA instructions
    "bf16 matmul results": 4,                   # nc_matmul writing a bf16 PSUM tile
    "any tensor_scalar op on the scalar engine": 4,  # NeuronCore-v3's scalar engine: multiply and add only
}


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

    @property
    def generation(self) -> int:
        """The NeuronCore generation (3 for trn2's NeuronCore-v3, 4 for trn3's NeuronCore-v4)."""
        return int(self.figures["core_name"].rsplit("-v", 1)[1])

    @property
    def core_name(self) -> str:
        return self.figures["core_name"]

    def has(self, capability: str) -> bool:
        """Whether this platform has ``capability`` (a key of FIRST_GENERATION)."""
        return self.generation >= FIRST_GENERATION[capability]


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
    # on-chip memory, per program (a grid's programs are cores with SBUF and PSUM of their own)
    ledgers: dict = field(default_factory=dict)     # program -> Ledger (check pass)
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

    def ledger(self) -> "Ledger":
        """The current program's on-chip memory accounting."""
        ledger = self.ledgers.get(self.program)
        if ledger is None:
            ledger = self.ledgers[self.program] = Ledger(self)
        return ledger

    def allocate(self, label, buffer_name: str, shape, itemsize: int, partition_dim: int = 0) -> "Live":
        """Accounts a new on-chip tile (``label``: its name, allocation line, shape and dtype, for
        messages); it takes memory from its first write to its last use (see Ledger). A tile that
        could never fit is refused here. ``partition_dim``: dims before it are block dims, each
        block a (partition, free) tile with a live range of its own."""
        per_partition = itemsize
        for n in shape[partition_dim + 1:]:
            per_partition *= n
        blocks = 1
        for n in shape[:partition_dim]:
            blocks *= n
        what = "a block of a tile" if partition_dim else "a tile"
        if buffer_name == "psum":
            bank = self.platform.psum_bank_bytes
            if per_partition > bank:
                raise NKIError("psum-bank", f"{what} of shape {tuple(shape)} in PSUM needs {per_partition} bytes per "
                               f"partition, but a PSUM bank holds {bank} bytes ({self.platform.psum_bank_fp32} fp32) "
                               f"per partition on {self.platform.target}; split the free dimension")
            size = 1  # a bank
        else:
            capacity = self.platform.sbuf_partition_bytes
            if per_partition > capacity:
                raise NKIError("sbuf-capacity", f"{what} of shape {tuple(shape)} in SBUF needs {per_partition} bytes "
                               f"per partition, but SBUF has {capacity} bytes ({capacity // 1024} KiB) per partition "
                               f"on {self.platform.target}")
            size = per_partition
        return Live(self.ledger(), buffer_name == "psum", size, blocks, label)


class Live:
    """The live range of an on-chip tile (of each of its blocks): the write events of its first write
    and of its last use so far (-1: not written yet)."""

    __slots__ = ("ledger", "psum", "size", "blocks", "first", "last", "label", "elided", "into")

    def __init__(self, ledger, psum, size, blocks, label):
        self.ledger, self.psum, self.size, self.blocks, self.label = ledger, psum, size, blocks, label
        # `t[...] = op(...)`: the event of op, whose result went straight into t (see Ledger.elide), and
        # the blocks of t's Live that were first written there
        self.elided, self.into = -1, None
        if blocks == 1:
            self.first = self.last = -1
        else:
            self.first, self.last = np.full(blocks, -1, np.int64), np.full(blocks, -1, np.int64)
        ledger.tiles.append(self)

    def live_at(self, event):
        """How many of its blocks are live at ``event``."""
        if self.blocks == 1:
            return int(0 <= self.first <= event <= self.last)
        return int(((self.first >= 0) & (self.first <= event) & (event <= self.last)).sum())

    def describe(self):
        name, line, shape, dtype = self.label
        where = f" (allocated at line {line[1]})" if line else ""
        return f"{name}{where} of shape {tuple(shape)} {dtype}"


class Ledger:
    """One program's SBUF and PSUM, as the Neuron compiler allocates them: a tile holds memory from
    its first write to its last use (NKI's linear-scan allocation "assigns an address to a tile at
    its first write and releases the address after its last read"; graph colouring packs the same
    live ranges). A tile the kernel still holds in a variable but does not use again is free, so
    the tiles of one loop iteration do not overlap the next iteration's.

    Time counts write events: each write of a tile or an HBM tensor is one instruction, and a read
    belongs to the instruction whose write comes next (an instruction reads its operands, then
    writes its result), so operands and results of one instruction are live together. When a tile
    is used again, it was live at every instruction since its previous use: the memory in use at
    those instructions grows then, and a capacity violation found that way is reported at the use
    that proves it. SBUF is counted in bytes per partition, PSUM in banks (one per tile or block)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.now = 0                                   # the next write event
        self.sbuf = np.zeros(1024, np.int64)           # bytes per partition live at each event
        self.psum = np.zeros(1024, np.int64)           # banks live at each event
        self.written = []                              # per event: the label of what it wrote
        self.tiles = []                                # every Live, for messages

    def _room(self):
        if self.now >= len(self.sbuf):
            grow = np.zeros(len(self.sbuf), np.int64)
            self.sbuf, self.psum = np.concatenate([self.sbuf, grow]), np.concatenate([self.psum, grow.copy()])

    def tick(self, label):
        """A write event (after the touches of its instruction)."""
        self._room()
        self.written.append(label)
        self.now += 1

    def touch(self, live, write, blocks=None):
        """``live`` (its ``blocks``, an index array; None: all) is used by the current instruction;
        a write ends the instruction."""
        n = self.now
        self._room()
        usage = self.psum if live.psum else self.sbuf
        low = n
        if live.blocks == 1:
            if live.first < 0 and live.elided >= 0:  # used after all: a tile of its own, then copied
                self._materialise(live)
                low, live.first, live.last = live.elided, live.elided, n
                usage[low:n + 1] += live.size
            elif live.first < 0:
                live.first = live.last = n
                usage[n] += live.size
            elif live.last < n:
                low = live.last + 1
                usage[low:n + 1] += live.size
                live.last = n
        else:
            index = np.arange(live.blocks) if blocks is None else blocks
            first, last = live.first[index], live.last[index]
            new = first < 0
            if new.any():
                usage[n] += int(new.sum()) * live.size
                live.first[index[new]] = n
            old = ~new & (last < n)
            if old.any():
                lasts, counts = np.unique(last[old], return_counts=True)
                for previous, count in zip(lasts.tolist(), counts.tolist()):
                    usage[previous + 1:n + 1] += count * live.size
                low = int(lasts[0]) + 1
            live.last[index] = n
        capacity = self.ctx.platform.psum_banks if live.psum else self.ctx.platform.sbuf_partition_bytes
        if usage[n] > capacity or (low < n and usage[low:n].max() > capacity):
            self._overflow(live, usage, low, capacity)
        if write:
            self.tick(live.label)

    def elide(self, live):
        """``t[...] = op(...)`` reads ``live``, the result of the latest instruction: NKI writes an
        instruction's output through the assignment's access pattern, so op wrote t and its result
        takes no memory (see ``into``). Returns whether the result qualifies (not used since)."""
        n = self.now - 1
        if n < 0 or live.blocks != 1 or not live.first == live.last == n or self.written[n] is not live.label:
            return False
        (self.psum if live.psum else self.sbuf)[n] -= live.size
        live.first = live.last = -1
        live.elided = n
        return True

    def into(self, result, target, blocks=None):
        """After ``elide(result)``, the assignment wrote ``target`` (its ``blocks``): the parts of
        target first written by it were written by the result's instruction, one event earlier."""
        k = result.elided
        usage = self.psum if target.psum else self.sbuf
        if target.blocks == 1:
            if target.first != k + 1:
                return
            target.first, started = k, None
            usage[k] += target.size
        else:
            index = np.arange(target.blocks) if blocks is None else blocks
            started = index[target.first[index] == k + 1]
            if not len(started):
                return
            target.first[started] = k
            usage[k] += len(started) * target.size
        result.into = (target, started)
        self.written[k] = target.label
        capacity = self.ctx.platform.psum_banks if target.psum else self.ctx.platform.sbuf_partition_bytes
        if usage[k] > capacity:
            self._overflow(target, usage, k, capacity, event=k, direct=True)

    def _materialise(self, result):
        """An elided result is used again: it was a tile after all, copied into the target by the
        assignment (one event later), so the target does not start at the result's instruction."""
        if result.into is None:
            return
        (target, started), k = result.into, result.elided
        self.written[k] = result.label
        usage = self.psum if target.psum else self.sbuf
        if target.blocks == 1:
            if target.first == k:
                target.first = k + 1
                usage[k] -= target.size
        else:
            moved = started[target.first[started] == k]
            target.first[moved] = k + 1
            usage[k] -= len(moved) * target.size
        result.into = None

    def _overflow(self, live, usage, low, capacity, event=None, direct=False):
        n = self.now
        if event is None:
            event = low + int(np.argmax(usage[low:n + 1]))
        unit = (lambda k: f"{k} bank{'s' if k != 1 else ''}") if live.psum else (lambda k: f"{k} bytes per partition")
        platform = self.ctx.platform
        room = (f"the {platform.psum_banks} PSUM banks of {platform.target}" if live.psum else
                f"the {capacity} bytes ({capacity // 1024} KiB) per partition of SBUF on {platform.target}")
        held = {}
        for t in self.tiles:
            if t.psum == live.psum and t.live_at(event):
                count, amount = held.get(t.describe(), (0, 0))
                held[t.describe()] = (count + 1, amount + t.live_at(event) * t.size)
        listed = [f"{f'{count} x ' if count > 1 else ''}{what} ({unit(amount)})"
                  for what, (count, amount) in sorted(held.items(), key=lambda kv: -kv[1][1])]
        written = self.written[event] if event < len(self.written) else None
        at = (f"the instruction that wrote {written[0]} (allocated at line {written[1][1]})"
              if written and written[1] else "an earlier instruction")
        if event == n:
            head = f"{live.describe()} needs {unit(live.size)} here, but the tiles live at this instruction"
        elif direct:
            head = (f"{live.describe()} is assigned an instruction's result here, which that instruction writes "
                    f"into it directly; at {at} the tiles live")
        else:
            head = (f"{live.describe()} is used again here, so it held {unit(live.size)} since its previous use; "
                    f"at {at} the tiles live")
        raise NKIError("psum-capacity" if live.psum else "sbuf-capacity",
                       f"{head} need {unit(int(usage[event]))}, more than {room}. Live there: "
                       f"{'; '.join(listed[:6])}{'; ...' if len(listed) > 6 else ''}. A tile holds memory from its "
                       "first write to its last use: use tiles for the last time before others are written, or make "
                       "them smaller")


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
