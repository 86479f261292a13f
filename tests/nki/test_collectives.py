"""nki.collectives over rank-lists of one rank (the only ones a kernel on one emulated device can
run): each collective against what it means over one rank, computed here with NumPy; rank-lists
of several ranks are refused."""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.collectives as ncc
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

ALONE = ncc.ReplicaGroup([[0]])


@nki.jit
def every_collective(a, b, group):
    """Runs each collective on [a] (and b) over ``group``; returns their results in order."""
    outs = [nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm) for _ in range(7)]
    ncc.all_reduce(srcs=[a], dsts=[outs[0]], replica_group=group, op=nl.add)
    ncc.all_gather(srcs=[a], dsts=[outs[1]], replica_group=group, collective_dim=0)
    ncc.reduce_scatter(srcs=[a], dsts=[outs[2]], replica_group=group, collective_dim=0, op=nl.maximum)
    ncc.all_to_all(srcs=[a], dsts=[outs[3]], replica_group=group, collective_dim=0)
    ncc.collective_permute(srcs=[a], dsts=[outs[4]], source_target_pairs=[(0, 0), (3, 5)])
    ncc.collective_permute_implicit(srcs_by_channel=[[a]], dsts_by_channel=[[outs[5]]], replica_group=group)
    ncc.collective_permute_implicit_reduce(srcs0_by_channel=[[a]], srcs1_by_channel=[[b]],
                                           dsts_by_channel=[[outs[6]]], replica_group=group, op=nl.minimum)
    return tuple(outs)


@pytest.mark.parametrize("kind", ["numpy", "neuron"])
def test_collectives_over_one_rank(kind):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(64, 32)).astype(np.float32), rng.normal(size=(64, 32)).astype(np.float32)
    args = (a, b) if kind == "numpy" else (torch.from_numpy(a).to("neuron"), torch.from_numpy(b).to("neuron"))
    outs = every_collective(*args, ALONE)
    outs = [np.asarray(o.cpu() if isinstance(o, torch.Tensor) else o) for o in outs]
    for o in outs[:6]:  # reduced, gathered, scattered, exchanged or passed around a ring of one: a itself
        np.testing.assert_array_equal(o, a)
    np.testing.assert_array_equal(outs[6], np.minimum(a, b))  # the rank's own reduced result comes back


def test_sbuf_all_gather_and_rank_id_as_a_scalar_offset():
    @nki.jit
    def kernel(table, group):
        out = nl.ndarray(table.shape[1:], dtype=table.dtype, buffer=nl.shared_hbm)
        mine = nl.ndarray(table.shape[1:], dtype=table.dtype, buffer=nl.sbuf)
        rows, cols = table.shape[1:]
        nisa.dma_copy(dst=mine, src=table.ap(pattern=[[cols, rows], [1, cols]], scalar_offset=ncc.rank_id(),
                                             indirect_dim=0))
        gathered = nl.ndarray(mine.shape, dtype=mine.dtype, buffer=nl.sbuf)
        ncc.all_gather(srcs=[mine], dsts=[gathered], replica_group=group, collective_dim=1)
        nisa.dma_copy(dst=out, src=gathered)
        return out

    table = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4)
    np.testing.assert_array_equal(nki.simulate(kernel)(table, ALONE), table[0])  # rank 0 picks slice 0


def test_replica_groups_from_partition_ops():
    op = ncc.rg_partition_op
    assert ncc.ReplicaGroup.from_partition_op(8, op.bitwise_and, 0) == ncc.ReplicaGroup([list(range(8))])
    assert ncc.ReplicaGroup.from_partition_op(8, op.div, 4) == ncc.ReplicaGroup([[0, 1, 2, 3], [4, 5, 6, 7]])
    assert ncc.ReplicaGroup.from_partition_op(8, op.mod, 4) == ncc.ReplicaGroup([[0, 4], [1, 5], [2, 6], [3, 7]])
    with pytest.raises(nki.NKIError, match="at most one rank-list"):
        ncc.ReplicaGroup([[0, 1], [1, 2]])


def test_collectives_across_ranks_are_refused():
    a = np.ones((8, 4), np.float32)
    with pytest.raises(nki.NKIError, match=r"\[collectives\] nki.collectives.all_reduce: the rank-list \[0, 1\] "
                       r"spans 2 ranks.*torch.distributed") as e:
        nki.simulate(every_collective)(a, a, ncc.ReplicaGroup([[0, 1]]))
    assert "ncc.all_reduce(" in e.value.line[2]

    @nki.jit
    def swap(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ncc.collective_permute(srcs=[x], dsts=[out], source_target_pairs=[(0, 1), (1, 0)])
        return out

    with pytest.raises(nki.NKIError, match=r"collective_permute: the pairs \[\(0, 1\), \(1, 0\)\] move data "
                       r"between rank 0"):
        nki.simulate(swap)(a)

    @nki.jit
    def mixed(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ncc.all_reduce(srcs=[t], dsts=[out], replica_group=ALONE, op=nl.add)
        return out

    with pytest.raises(nki.NKIError, match=r"\[collective-memory\].*must all be in HBM or all in SBUF, not a mix"):
        nki.simulate(mixed)(a)


def test_the_alias_serves_nki_collectives():
    import importlib

    served = nki.install_alias()
    try:
        assert "nki" in served
        assert importlib.import_module("nki.collectives") is ncc
    finally:
        nki.uninstall_alias()
