"""``nki.collectives``: collectives between ranks inside a kernel, for rank-lists of one rank.

In NKI the ranks of a collective are the logical NeuronCores of a job, each running the kernel;
a collective exchanges data with the other ranks' kernels while they run. Here a kernel is one
task on one emulated device, with no channel to other ranks' kernels (``torch.distributed`` moves
data between ranks between device tasks), so this module runs exactly the collectives whose
rank-list holds only the calling rank: over one rank, all-reduce, all-gather, reduce-scatter and
all-to-all leave the data as it is, a ring's successor and predecessor are the rank itself, and
the rank whose data a ring iteration processes is the rank's own. A rank-list of several ranks is
an error that says so: nothing is pretended. The calling rank is ``torch.distributed``'s rank when
a process group is initialised, else 0. Supporting more would need the runtime to let a device
task wait for other ranks' tasks mid-kernel (a collective engine), which it does not have.
"""

import enum
import math

import torch

from torchneuron.nki._errors import NKIError
from torchneuron.nki._ops import lead, record
from torchneuron.nki._tile import NkiTensor, psum, sbuf
from torchneuron.nki.isa._common import op_name, packed_move, require
from torchneuron.nki.isa._registers import VirtualRegister

__all__ = ["ReplicaGroup", "rg_partition_op", "rank_id", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
           "all_to_all_v", "collective_permute", "collective_permute_implicit", "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id"]

_REDUCE_OPS = {"add": torch.add, "minimum": torch.minimum, "maximum": torch.maximum}


class rg_partition_op(enum.Enum):  # noqa: N801 - NKI's name
    """How ``ReplicaGroup.from_partition_op`` maps a rank to the id of its rank-list."""

    bitwise_and = "bitwise_and"
    div = "div"
    mod = "mod"


class ReplicaGroup:
    """The ranks a collective runs on, as a list of disjoint rank-lists (the collective runs within
    each rank-list, on all of them in parallel): ``ReplicaGroup([[0, 1], [2, 3]])``."""

    def __init__(self, replica_groups=None):
        groups = [[int(r) for r in ranks] for ranks in (replica_groups or [])]
        seen = [r for ranks in groups for r in ranks]
        if len(seen) != len(set(seen)):
            raise NKIError("collectives", f"ReplicaGroup {groups}: a rank belongs to at most one rank-list")
        self.replica_groups = groups

    @staticmethod
    def from_partition_op(world_size, op, operand):
        """Ranks 0 .. world_size - 1, in rank-lists by ``op(rank, operand)``."""
        op = rg_partition_op(op)
        key = {rg_partition_op.bitwise_and: lambda r: r & operand, rg_partition_op.div: lambda r: r // operand,
               rg_partition_op.mod: lambda r: r % operand}[op]
        lists = {}
        for r in range(int(world_size)):
            lists.setdefault(key(r), []).append(r)
        return ReplicaGroup([lists[k] for k in sorted(lists)])

    def __eq__(self, other):
        return isinstance(other, ReplicaGroup) and other.replica_groups == self.replica_groups

    def __hash__(self):
        return hash(tuple(map(tuple, self.replica_groups)))

    def __repr__(self):
        return f"ReplicaGroup({self.replica_groups})"


def _rank():
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _alone(replica_group, what):
    """Checks that the calling rank's rank-list in ``replica_group`` is the rank alone."""
    if not isinstance(replica_group, ReplicaGroup):
        raise NKIError("operand", f"{what}: replica_group must be an nki.collectives.ReplicaGroup, got "
                       f"{type(replica_group).__name__}")
    rank = _rank()
    mine = next((ranks for ranks in replica_group.replica_groups if rank in ranks), None)
    if mine is None:
        raise NKIError("collectives", f"{what}: rank {rank} (this kernel's) is in no rank-list of {replica_group}")
    if len(mine) > 1:
        raise NKIError("collectives", f"{what}: the rank-list {mine} spans {len(mine)} ranks, but a kernel here runs "
                       "on one emulated device and cannot exchange data with other ranks' kernels while it runs; "
                       "only rank-lists of the calling rank alone are supported (exchange data between ranks with "
                       "torch.distributed around the kernel)")


def _tensors(what, srcs, dsts, sbuf_ok=True):
    """The (src, dst) pairs of a collective, with the reference's memory rules checked."""
    if not isinstance(srcs, (list, tuple)) or not isinstance(dsts, (list, tuple)) or len(srcs) != len(dsts) or \
            not srcs:
        raise NKIError("operand", f"{what}: srcs and dsts are lists of as many tensors")
    tensors = list(srcs) + list(dsts)
    for t in tensors:
        if not isinstance(t, NkiTensor):
            raise NKIError("operand", f"{what}: expected tensors, got {type(t).__name__}")
        if t.buffer is psum:
            raise NKIError("collective-memory", f"{what}: {t.describe()} is in PSUM; collectives use HBM or SBUF")
    on_sbuf = {t.buffer is sbuf for t in tensors}
    if len(on_sbuf) > 1:
        raise NKIError("collective-memory", f"{what}: the tensors must all be in HBM or all in SBUF, not a mix")
    if True in on_sbuf and (not sbuf_ok or len(srcs) > 1):
        raise NKIError("collective-memory", f"{what}: " + ("its tensors must be in HBM" if not sbuf_ok else
                       "several tensors (coalesced) must be in HBM"))
    return list(zip(srcs, dsts))


def _priority(priority, what):
    if priority is not None:
        require("dma priority", f"{what} priority=")


def _copy(what, src, dst, combine=None, other=None):
    """``dst = src`` (or ``combine(src, other)``) for a collective over one rank."""
    raw = combine is None and packed_move(what, dst, src)
    values = src.read(what=f"{what} src", raw=raw)
    if combine is not None:
        values = combine(values.float(), other.read(what=f"{what} src").float())
    n = lead()
    if math.prod(values.shape[n:]) != math.prod(dst.shape):
        raise NKIError("shape-mismatch", f"{what}: over one rank, dst {dst.describe()} receives src "
                       f"{src.describe()} as it is, so they need the same number of elements")
    record("dma", what.rsplit(".", 1)[-1], dst.shape, dst.dtype, src=src.buffer.name, dst=dst.buffer.name)
    dst.write(values.reshape(list(values.shape[:n]) + list(dst.shape)), what=f"{what} dst", raw=raw)


def _reduce_op(op, what):
    name = op_name(op)
    if name not in _REDUCE_OPS:
        raise NKIError("reduce-op", f"{what}: op must be nl.add, nl.minimum or nl.maximum, got {op!r}")
    return _REDUCE_OPS[name]


def _collective_dim(dim, what, allowed=(0,)):
    if dim not in allowed:
        raise NKIError("collectives", f"{what}: collective_dim must be {' or '.join(map(str, allowed))}, got {dim!r}")


def rank_id():
    """The calling rank, in a register (usable as a ``scalar_offset`` and with ``register_store``)."""
    return VirtualRegister(_rank())


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None, **kwargs):
    what = "nki.collectives.all_reduce"
    _reduce_op(op, what)
    _priority(priority, what)
    pairs = _tensors(what, srcs, dsts)
    _alone(replica_group, what)
    for src, dst in pairs:  # the reduction of one rank's values is those values
        if src.packed is not None:
            src.read(what=f"{what} src")  # (reducing packed MX values is an error; read() says so)
        _copy(what, src, dst)


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None, **kwargs):
    what = "nki.collectives.all_gather"
    _priority(priority, what)
    pairs = _tensors(what, srcs, dsts)
    _collective_dim(collective_dim, what, (0, 1) if pairs[0][0].buffer is sbuf else (0,))
    _alone(replica_group, what)
    for src, dst in pairs:  # the concatenation of one rank's tensor
        _copy(what, src, dst)


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None, **kwargs):
    what = "nki.collectives.reduce_scatter"
    _reduce_op(op, what)
    _priority(priority, what)
    pairs = _tensors(what, srcs, dsts)
    _collective_dim(collective_dim, what)
    _alone(replica_group, what)
    for src, dst in pairs:  # reduced over one rank, split into one chunk
        if src.packed is not None:
            src.read(what=f"{what} src")
        _copy(what, src, dst)


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None, **kwargs):
    what = "nki.collectives.all_to_all"
    _priority(priority, what)
    pairs = _tensors(what, srcs, dsts, sbuf_ok=False)
    _collective_dim(collective_dim, what)
    _alone(replica_group, what)
    for src, dst in pairs:  # one chunk, sent to the rank itself
        _copy(what, src, dst)


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None, **kwargs):
    raise NKIError("collectives", "nki.collectives.all_to_all_v: the reference runs it only across devices (LNC=2 "
                   "rank-lists covering whole devices on NeuronSwitch instances, or inter-node rank-lists), which a "
                   "kernel on one emulated device cannot reach")


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None, **kwargs):
    what = "nki.collectives.collective_permute"
    _priority(priority, what)
    pairs = _tensors(what, srcs, dsts, sbuf_ok=False)
    if len(pairs) != 1:
        raise NKIError("collectives", f"{what}: srcs and dsts hold exactly one tensor each")
    rank = _rank()
    moves = [(int(s), int(t)) for s, t in source_target_pairs]
    crossing = [(s, t) for s, t in moves if (s == rank) != (t == rank)]
    if crossing:
        raise NKIError("collectives", f"{what}: the pairs {crossing} move data between rank {rank} (this kernel's) "
                       "and other ranks, which a kernel on one emulated device cannot reach")
    if (rank, rank) in moves:
        _copy(what, *pairs[0])


def _by_channel(what, *lists):
    if len({len(x) for x in lists}) != 1 or any(len(inner) != 1 for x in lists for inner in x):
        raise NKIError("collectives", f"{what}: one list per channel, each holding exactly one tensor")
    return [[inner[0] for inner in x] for x in lists]


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None,
                                name=None, **kwargs):
    what = "nki.collectives.collective_permute_implicit"
    _priority(priority, what)
    srcs, dsts = _by_channel(what, srcs_by_channel, dsts_by_channel)
    pairs = _tensors(what, srcs, dsts)
    _alone(replica_group, what)
    for src, dst in pairs:  # a ring of one: the successor and the predecessor are the rank itself
        _copy(what, src, dst)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group, op,
                                       channel_ids=(0,), priority=None, name=None, **kwargs):
    what = "nki.collectives.collective_permute_implicit_reduce"
    fn = _reduce_op(op, what)
    _priority(priority, what)
    srcs0, srcs1, dsts = _by_channel(what, srcs0_by_channel, srcs1_by_channel, dsts_by_channel)
    _tensors(what, srcs0 + srcs1, dsts + dsts)
    _alone(replica_group, what)
    for a, b, dst in zip(srcs0, srcs1, dsts):  # the rank's own reduced result comes back to it
        _copy(what, a, dst, combine=fn, other=b)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0, **kwargs):
    """The rank whose data a ring iteration processes: in a ring of one, the calling rank's."""
    _alone(replica_group, "nki.collectives.collective_permute_implicit_current_processing_rank_id")
    return VirtualRegister(_rank())
