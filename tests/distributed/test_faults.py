"""Failures end in errors that say what happened, within the group's timeout: no hangs.

Each test breaks its own pair of ranks (a group is unusable after a failed
collective), with a short process-group timeout.
"""

import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.distributed.world import RankDied, World

TIMEOUT_S = 3.0


def attempt(fn):
    """(error type, message, seconds) of running fn; type None if it returned."""
    start = time.monotonic()
    try:
        fn()
        return None, "", time.monotonic() - start
    except Exception as e:  # noqa: BLE001 - the tests inspect the type and message
        return type(e).__name__, str(e), time.monotonic() - start


@pytest.fixture
def fresh():
    worlds = []

    def make(**kwargs):
        worlds.append(World(2, timeout_s=TIMEOUT_S, **kwargs))
        return worlds[-1]

    yield make
    for w in worlds:
        w.close()


def on_rank_skip_collective(rank, world_size):
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # collective #1, by both ranks
    t.cpu()
    if rank == 1:
        return None  # never joins collective #2
    work = dist.all_reduce(t, async_op=True)  # #2: rank 1 never joins
    queued = dist.all_reduce(torch.ones(2, device="neuron"), async_op=True)  # #3, behind it
    first = attempt(lambda: (work.wait(), t.cpu()))
    again = attempt(lambda: dist.all_reduce(t))
    synchronized = attempt(torch.neuron.synchronize)
    return first, again, str(queued.exception()), synchronized


def test_timeout_names_the_collective_and_the_missing_rank(fresh):
    (kind, msg, seconds), (again_kind, again_msg, again_s), queued, synced = fresh().run(on_rank_skip_collective)[0]
    assert kind == "DistBackendError", msg
    assert "all_reduce (collective #2 of this group) failed on rank 0 of 2" in msg
    assert "ranks [1] did not reach it (rank 1 is at #1, as published up to 100 ms ago)" in msg
    assert "(group timeout 3 s)" in msg
    assert TIMEOUT_S * 0.8 < seconds < TIMEOUT_S + 20
    # The group refuses further work at once, naming the first failure.
    assert again_kind == "DistBackendError" and "unusable after an earlier failure" in again_msg
    assert again_s < 1.0
    # Work queued behind the failure fails at once instead of waiting out its own timeout...
    assert "all_reduce was skipped: the group is unusable after an earlier failure" in queued
    # ...and the device reports the failure at its next synchronisation.
    assert synced[0] == "DistBackendError" and "did not reach it" in synced[1]


def on_rank_die_or_reduce(rank, world_size):
    if rank == 1:
        os._exit(3)
    time.sleep(0.5)  # let rank 1 go
    t = torch.ones(1 << 16, device="neuron")
    return attempt(lambda: (dist.all_reduce(t), t.cpu()))


def test_a_dead_rank_fails_the_others_within_the_timeout(fresh):
    with pytest.raises(RankDied) as died:
        fresh().run(on_rank_die_or_reduce)
    kind, msg, seconds = died.value.results[0]
    assert kind == "DistBackendError", msg
    assert "all_reduce" in msg and "failed on rank 0 of 2" in msg
    assert seconds < TIMEOUT_S + 20


def on_rank_mismatched_shapes(rank, world_size):
    t = torch.ones(4 if rank == 0 else 8, device="neuron")
    return attempt(lambda: (dist.all_reduce(t), t.cpu()))


def test_mismatched_shapes_raise_with_shape_checks_on(fresh):
    # TORCH_DISTRIBUTED_DEBUG=DETAIL makes c10d wrap the backend in its
    # checking wrapper, which compares collectives across ranks first.
    for kind, msg, _ in fresh(env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}).run(on_rank_mismatched_shapes):
        assert kind == "RuntimeError" and "Detected mismatch between collectives" in msg
        assert "Tensor shapes: 4vs 8" in msg or "Tensor shapes: 8vs 4" in msg


def test_mismatched_shapes_abort_with_a_clear_message(fresh):
    # Gloo itself aborts the process; torchneuron says where and what to do.
    w = fresh(capture_stderr=True)
    with pytest.raises((RankDied, TimeoutError)):
        w.run(on_rank_mismatched_shapes, timeout_s=TIMEOUT_S + 30)
    w.close()
    logs = w.stderr(0) + w.stderr(1)
    assert "torchneuron: aborting during all_reduce #1 on rank" in logs
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in logs
