"""The programs of a launch grid as cores: ``core_barrier``, ``sendrecv``, and races between them.

A kernel launched on a grid (``kernel[2](...)``: a logical NeuronCore of two physical cores)
runs one program per core. Programs share HBM (inputs and ``shared_hbm`` tensors) but not
SBUF/PSUM, and meet at ``nisa.core_barrier`` and ``nisa.sendrecv``. Each program runs in a thread
of its own, but only one runs at a time: a program runs until it waits for another (at a barrier
or a receive), and the scheduler then resumes one that can go on. The order is deterministic,
and a program that waits for one that has finished (or that waits itself) is a deadlock,
reported as such rather than hanging.

That order would hide a missing barrier (program 0 always finishing its writes first), so in
the check pass every HBM access of a multi-program call is checked against the others' with
vector clocks: an access by one program to an element another program wrote (or read, for a
write) without a barrier or a sendrecv between them is an ``NKIError`` ("lnc-race"), as the
hardware would give a result that depends on timing.
"""

from __future__ import annotations

import threading

import torch

from torchneuron.nki import _context
from torchneuron.nki._batch import Unbatchable
from torchneuron.nki._errors import NKIError, kernel_line
from torchneuron.nki._tile import NkiTensor

# Per-program fields of the call context, swapped in and out as programs take turns.
_PROGRAM_FIELDS = ("program", "cursor", "engine_state")


class _Abort(BaseException):
    """Unwinds a waiting program's thread when the call fails elsewhere (not a user error)."""


class Cores:
    """The programs of one call and what they share (``ctx.lnc`` while they run)."""

    def __init__(self, ctx, programs: list[tuple]):
        self.ctx, self.programs = ctx, programs
        self.saved = [{"program": p, "cursor": 0, "engine_state": None} for p in programs]
        self.turn = threading.Condition()
        self.running: int | None = None
        self.waiting: dict[int, tuple] = {}     # rank -> (what, line, ready predicate)
        self.finished: set[int] = set()
        self.error: BaseException | None = None
        self.barriers: dict[tuple, list] = {}   # cores -> arrivals of the current generation
        self.generation: dict[tuple, int] = {}
        self.mail: dict[tuple, list] = {}       # (sender, receiver, pipe) -> values in flight
        self.clocks = [[0] * len(programs) for _ in programs]
        self.shadows: dict[int, _Shadow] = {}

    # -- scheduling -------------------------------------------------------------------------
    def run(self, body) -> list:
        """Runs ``body()`` once per program; returns their results in program order."""
        results = [None] * len(self.programs)
        threads = [threading.Thread(target=self._program, args=(rank, body, results), daemon=True,
                                    name=f"nki-core-{rank}") for rank in range(len(self.programs))]
        with self.turn:
            for t in threads:
                t.start()
            while len(self.finished) < len(self.programs) and self.error is None:
                rank = self._next_runnable()
                if rank is None:
                    self.error = self._deadlock()
                    break
                self._switch_to(rank)
                while self.running is not None and self.error is None:
                    self.turn.wait()
            self.running = -1  # wakes every waiting thread to unwind
            self.turn.notify_all()
        for t in threads:
            t.join()
        if self.error is not None:
            raise self.error.with_traceback(self.error.__traceback__)
        return results

    def _program(self, rank, body, results):
        with self.turn:
            while self.running != rank:
                if self.running == -1:
                    return
                self.turn.wait()
        try:
            with _context.active(self.ctx):
                results[rank] = body()
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the launching thread
            with self.turn:
                self.error = self.error or e
        with self.turn:
            self.finished.add(rank)
            self.saved[rank] = self._save()
            self.running = None
            self.turn.notify_all()

    def _next_runnable(self):
        for rank in range(len(self.programs)):
            if rank in self.finished:
                continue
            wait = self.waiting.get(rank)
            if wait is None or wait[2]():
                return rank
        return None

    def _switch_to(self, rank):
        self._restore(rank)
        self.running = rank
        self.turn.notify_all()

    def _save(self):
        return {f: getattr(self.ctx, f) for f in _PROGRAM_FIELDS}

    def _restore(self, rank):
        for f, v in self.saved[rank].items():
            setattr(self.ctx, f, v)

    def block(self, rank, what, ready):
        """Called by program ``rank`` (holding its turn): waits until ``ready()``."""
        if ready():
            return
        if self.ctx.frame:
            raise Unbatchable(self.ctx.frame, f"{what} inside a batched loop")
        with self.turn:
            self.waiting[rank] = (what, kernel_line(), ready)
            self.saved[rank] = self._save()
            self.running = None
            self.turn.notify_all()
            while self.running != rank:
                if self.running == -1:
                    raise _Abort()
                self.turn.wait()
            del self.waiting[rank]

    def _deadlock(self):
        waits = "; ".join(f"program {r} waits at {what}" + (f" (line {line[1]}: {line[2]})" if line else "")
                          for r, (what, line, _) in sorted(self.waiting.items()))
        done = sorted(self.finished)
        return NKIError("lnc-deadlock", f"the kernel's programs can never go on: {waits}"
                        + (f"; program(s) {done} finished" if done else ""))

    # -- synchronisation ----------------------------------------------------------------------
    def rank(self):
        program = self.ctx.program
        return self.programs.index(program)

    def barrier(self, cores):
        me = self.rank()
        cores = tuple(sorted(set(cores)))
        if me not in cores:
            raise NKIError("core-barrier", f"nisa.core_barrier: program {me} is not one of the cores {list(cores)}")
        if any(not 0 <= c < len(self.programs) for c in cores):
            raise NKIError("core-barrier", f"nisa.core_barrier: cores {list(cores)} are not all in the launch "
                           f"(programs 0 to {len(self.programs) - 1})")
        arrivals = self.barriers.setdefault(cores, [])
        generation = self.generation.get(cores, 0)
        arrivals.append(me)
        if len(arrivals) == len(cores):  # the last to arrive releases the others
            for r in cores:  # each starts a new epoch, having seen everyone's previous one
                self.clocks[r][r] += 1
            merged = [max(c) for c in zip(*(self.clocks[r] for r in cores))]
            for r in cores:
                self.clocks[r] = list(merged)
            self.barriers[cores] = []
            self.generation[cores] = generation + 1
            return
        self.block(me, f"core_barrier{list(cores)}", lambda: self.generation.get(cores, 0) > generation)

    def sendrecv(self, values, send_to, recv_from, pipe):
        me = self.rank()
        for role, r in (("send_to_rank", send_to), ("recv_from_rank", recv_from)):
            if not 0 <= r < len(self.programs):
                raise NKIError("sendrecv", f"nisa.sendrecv: {role}={r} is not a program of the launch "
                               f"(0 to {len(self.programs) - 1})")
        self.clocks[me][me] += 1  # what it did before sending is visible to the receiver
        self.mail.setdefault((me, send_to, pipe), []).append((values, list(self.clocks[me])))
        box = (recv_from, me, pipe)
        self.block(me, f"sendrecv from program {recv_from} (pipe {pipe})", lambda: bool(self.mail.get(box)))
        received, clock = self.mail[box].pop(0)
        self.clocks[me] = [max(a, b) for a, b in zip(self.clocks[me], clock)]
        return received

    # -- races on HBM ---------------------------------------------------------------------------
    def observe(self, tensor, write: bool, what: str):
        """Checks an access of the running program to HBM ``tensor`` against the other programs'."""
        me = self.rank()
        shadow = self.shadows.get(id(tensor.alloc))
        if shadow is None:
            shadow = self.shadows[id(tensor.alloc)] = _Shadow(tensor.alloc.root)
        index = tensor._shadow_index().reshape(-1)  # the allocation's elements under the access
        clock = torch.tensor(self.clocks[me])
        checks = [("wrote", shadow.writer, shadow.written)]
        if write:
            checks.append(("read", shadow.reader, shadow.read))
        for did, who, when in checks:
            other = who[index]
            theirs = (other >= 0) & (other != me)
            if not bool(theirs.any()):
                continue
            # An access of another program this one has not synchronised with since.
            unordered = when[index][theirs] >= clock[other[theirs].long()]
            if bool(unordered.any()):
                first = int(other[theirs][unordered][0])
                raise NKIError("lnc-race", f"{what}: program {me} {'writes' if write else 'reads'} "
                               f"{tensor.describe()} where program {first} {did} it with no nisa.core_barrier or "
                               "nisa.sendrecv between them; on hardware the result depends on timing")
        who, when = (shadow.writer, shadow.written) if write else (shadow.reader, shadow.read)
        who[index] = me
        when[index] = clock[me]


class _Shadow:
    """Per element of an HBM allocation: the program that last wrote it and the one that last read
    it, with their clocks then (-1: nobody). One writer suffices: a write unordered with the
    previous one is reported. Reads keep only the last reader, so a write racing with an earlier
    reader of another program than the last one goes unseen (grids of more than two programs)."""

    def __init__(self, root):
        span = root.untyped_storage().nbytes() // root.element_size()
        self.writer = torch.full((span,), -1, dtype=torch.int32)
        self.written = torch.zeros(span, dtype=torch.int64)
        self.reader = torch.full((span,), -1, dtype=torch.int32)
        self.read = torch.zeros(span, dtype=torch.int64)


def core_barrier(data, cores, engine=None, name=None):
    """Waits until every program in ``cores`` reaches a barrier over the same cores (``data`` is the
    tensor the hardware synchronises through; here the barrier needs none)."""
    group = _group()
    if isinstance(cores, int):
        cores = (cores,)
    if group is None:  # one program: a barrier with itself
        if tuple(cores) not in ((0,), ()):
            raise NKIError("core-barrier", f"nisa.core_barrier over cores {list(cores)} in a kernel launched "
                           "without a grid (one program); launch it as kernel[2](...)")
        return
    group.barrier(cores)


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id=0, dma_engine=None, name=None):
    """Sends ``src`` to program ``send_to_rank`` and receives ``dst`` from ``recv_from_rank``."""
    for role, t in (("src", src), ("dst", dst)):
        if not isinstance(t, NkiTensor):
            raise NKIError("operand", f"nisa.sendrecv: {role} must be a tensor or tile, got {type(t).__name__}")
    group = _group()
    raw = src.packed is not None or dst.packed is not None  # packed MX bits travel unchanged, to the same dtype
    if raw and src.packed is not dst.packed:
        raise NKIError("dtype", f"nisa.sendrecv: src {src.describe()} and dst {dst.describe()} must have the same "
                       "dtype: packed MX values are moved unchanged, never converted")
    values = src.read(what="nisa.sendrecv src", raw=raw).clone()
    if group is None:
        if send_to_rank != 0 or recv_from_rank != 0:
            raise NKIError("sendrecv", "nisa.sendrecv between programs in a kernel launched without a grid (one "
                           "program); launch it as kernel[2](...)")
        received = values
    else:
        received = group.sendrecv(values, int(send_to_rank), int(recv_from_rank), pipe_id)
    if int(received.numel()) != int(torch.Size(dst.shape).numel()):
        raise NKIError("shape-mismatch", f"nisa.sendrecv: received {tuple(received.shape)} but dst is "
                       f"{dst.describe()}")
    dst.write(received.reshape(dst.shape), what="nisa.sendrecv dst", raw=raw)


def _group():
    """The running programs, or None for a one-program launch. Programs batched into one run
    (a grid without barriers runs that way) cannot meet: the grid then runs program by program."""
    ctx = _context.current()
    if ctx.lnc is None and any(not isinstance(p, int) for p in ctx.program):
        raise Unbatchable(ctx.frame, "programs that synchronise (core_barrier, sendrecv) run one per core")
    return ctx.lnc
