"""Collectives in a device profile: two ranks profile an all_reduce that
overlaps matmuls, export to Parquet, and the collectives table shows it.

Rank 1 joins the all_reduce late (after a store key says rank 0's matmuls
are queued), and rank 0 queues its matmuls only once its transfer has had
time to start, so the transfer must span them: a known overlap."""

import inspect
import os
import time

import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.distributed

N = 4096


def on_rank_profile_all_reduce(rank, world_size, directory):
    from torch.profiler import ProfilerActivity, profile

    from torchneuron.profiler import export_parquet

    a = torch.randn(192, 192, device="neuron")
    t = torch.full((N,), float(rank + 1), device="neuron")
    store = dist.distributed_c10d._get_default_store()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        if rank == 1:
            store.wait(["profiler/matmuls queued"])
            time.sleep(0.2)  # rank 0's matmuls run while its all_reduce waits for this rank
        work = dist.all_reduce(t, async_op=True)  # the collective
        if rank == 0:
            time.sleep(0.1)  # its transfer has begun (a busy host can start it late) before the matmuls run
        b = a @ a
        for _ in range(4):
            b = b @ a / 192
        if rank == 0:
            store.set("profiler/matmuls queued", "1")
        work.wait()
        torch.neuron.synchronize()
    export_parquet(prof, os.path.join(directory, f"rank{rank}"))
    expected = a.cpu() @ a.cpu()
    for _ in range(4):
        expected = expected @ a.cpu() / 192
    return t.cpu(), torch.allclose(b.cpu(), expected, rtol=1e-3, atol=1e-3)


def test_collectives_are_recorded_on_communication_streams(world, tmp_path):
    lines, first = inspect.getsourcelines(on_rank_profile_all_reduce)
    call_line = first + next(i for i, line in enumerate(lines) if "# the collective" in line)
    results = world.run(on_rank_profile_all_reduce, directory=str(tmp_path))
    for rank, (reduced, matmul_ok) in enumerate(results):
        assert torch.equal(reduced, torch.full((N,), 3.0)) and matmul_ok
        rows = pq.read_table(tmp_path / f"rank{rank}" / "collectives.parquet").to_pylist()
        assert [r["name"] for r in rows] == ["all_reduce"]
        row = rows[0]
        assert row["bytes"] == N * 4
        assert row["stream"] != 0  # a communication stream, not the caller's
        assert row["start_ns"] <= row["end_ns"]
        assert 0 <= row["overlapped_ns"] <= row["end_ns"] - row["start_ns"]
        if rank == 0:  # its transfer waited for rank 1 while its matmuls ran
            assert row["overlapped_ns"] > 0
        assert (os.path.basename(row["source_file"]), row["source_line"]) == ("test_profiler.py", call_line)
        tasks = pq.read_table(tmp_path / f"rank{rank}" / "tasks.parquet").to_pylist()
        assert {("all_reduce", "collective"), ("aten::mm", "kernel")} <= {(t["name"], t["kind"]) for t in tasks}
        # work.wait() holds the caller's stream: recorded, but as idle time.
        assert ("all_reduce", "wait", 0) in {(t["name"], t["kind"], t["stream"]) for t in tasks}
