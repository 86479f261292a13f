"""Every collective of the neuron backend in two ranks, against the same reduction computed on CPU here.

The functions prefixed ``on_rank`` run inside the ranks (see world.py);
the tests compute the expected values from the same per-rank inputs.
"""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from tests.distributed.world import World

WORLD = 2


def data(rank: int, n: int = 6, dtype=torch.float32) -> torch.Tensor:
    """Rank-dependent input, built the same way in the ranks and here."""
    return (torch.arange(n, dtype=torch.float64) * (rank + 2) - 3 * rank).to(dtype)


def neuron(t: torch.Tensor) -> torch.Tensor:
    return t.to("neuron")


# --- reductions -------------------------------------------------------------

REDUCE_OPS = {
    "SUM": lambda ts: sum(ts),
    "AVG": lambda ts: sum(ts) / len(ts),
    "PRODUCT": lambda ts: ts[0] * ts[1],
    "MIN": lambda ts: torch.minimum(*ts),
    "MAX": lambda ts: torch.maximum(*ts),
}


def on_rank_all_reduce(rank, world_size, op, dtype):
    t = neuron(data(rank, dtype=dtype))
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t.cpu()


@pytest.mark.parametrize("op", list(REDUCE_OPS))
def test_all_reduce(world, op):
    expected = REDUCE_OPS[op]([data(r) for r in range(WORLD)])
    for got in world.run(on_rank_all_reduce, op=op, dtype=torch.float32):
        torch.testing.assert_close(got, expected)


def test_all_reduce_integers_and_bf16(world):
    for dtype in (torch.int64, torch.bfloat16):
        expected = REDUCE_OPS["SUM"]([data(r, dtype=dtype) for r in range(WORLD)])
        for got in world.run(on_rank_all_reduce, op="SUM", dtype=dtype):
            assert got.dtype == dtype
            torch.testing.assert_close(got, expected)


def on_rank_reduce(rank, world_size, op):
    t = neuron(data(rank))
    dist.reduce(t, dst=1, op=getattr(dist.ReduceOp, op))
    return t.cpu()


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_reduce(world, op):
    got = world.run(on_rank_reduce, op=op)
    torch.testing.assert_close(got[1], REDUCE_OPS[op]([data(r) for r in range(WORLD)]))


def on_rank_broadcast(rank, world_size):
    t = neuron(data(rank))
    dist.broadcast(t, src=1)
    return t.cpu()


def test_broadcast(world):
    for got in world.run(on_rank_broadcast):
        torch.testing.assert_close(got, data(1))


# --- gathers and scatters ---------------------------------------------------

def on_rank_all_gather(rank, world_size):
    t = neuron(data(rank))
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t)
    flat = torch.empty(world_size * t.numel(), device="neuron")
    dist.all_gather_into_tensor(flat, t)
    return [p.cpu() for p in parts], flat.cpu()


def test_all_gather(world):
    for parts, flat in world.run(on_rank_all_gather):
        for r in range(WORLD):
            torch.testing.assert_close(parts[r], data(r))
        torch.testing.assert_close(flat, torch.cat([data(r) for r in range(WORLD)]))


def on_rank_reduce_scatter(rank, world_size, op):
    reduce_op = getattr(dist.ReduceOp, op)
    full = neuron(data(rank, n=8))
    out = torch.empty(4, device="neuron")
    dist.reduce_scatter_tensor(out, full, op=reduce_op)
    out_list = torch.empty(4, device="neuron")
    dist.reduce_scatter(out_list, list(full.chunk(world_size)), op=reduce_op)
    return out.cpu(), out_list.cpu()


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_reduce_scatter(world, op):
    total = REDUCE_OPS[op]([data(r, n=8) for r in range(WORLD)])
    for rank, (out, out_list) in enumerate(world.run(on_rank_reduce_scatter, op=op)):
        torch.testing.assert_close(out, total.chunk(WORLD)[rank])
        torch.testing.assert_close(out_list, total.chunk(WORLD)[rank])


# Uneven splits: rank r sends (r + 1 + k) elements to rank k.
def splits(src: int) -> list[int]:
    return [src + 1 + dst for dst in range(WORLD)]


def on_rank_all_to_all(rank, world_size):
    inp = neuron(data(rank, n=sum(splits(rank))))
    out_splits = [splits(src)[rank] for src in range(world_size)]
    out = torch.empty(sum(out_splits), device="neuron")
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=splits(rank))
    even_in = neuron(data(rank, n=4))
    even_out = torch.empty(4, device="neuron")
    dist.all_to_all_single(even_out, even_in)
    outs = [torch.empty(3, device="neuron") for _ in range(world_size)]
    dist.all_to_all(outs, list(neuron(data(rank, n=6)).chunk(world_size)))
    return out.cpu(), even_out.cpu(), [o.cpu() for o in outs]


def test_all_to_all(world):
    for rank, (uneven, even, listed) in enumerate(world.run(on_rank_all_to_all)):
        pieces = [data(src, n=sum(splits(src))).split(splits(src))[rank] for src in range(WORLD)]
        torch.testing.assert_close(uneven, torch.cat(pieces))
        torch.testing.assert_close(even, torch.cat([data(src, n=4).chunk(WORLD)[rank] for src in range(WORLD)]))
        for src in range(WORLD):
            torch.testing.assert_close(listed[src], data(src, n=6).chunk(WORLD)[rank])


def on_rank_gather_scatter(rank, world_size):
    t = neuron(data(rank))
    gathered = [torch.empty_like(t) for _ in range(world_size)] if rank == 0 else None
    dist.gather(t, gathered, dst=0)
    piece = torch.empty(3, device="neuron")
    dist.scatter(piece, list(neuron(data(7)).chunk(world_size)) if rank == 1 else None, src=1)
    return [g.cpu() for g in gathered] if gathered else None, piece.cpu()


def test_gather_and_scatter(world):
    results = world.run(on_rank_gather_scatter)
    for r in range(WORLD):
        torch.testing.assert_close(results[0][0][r], data(r))
        torch.testing.assert_close(results[r][1], data(7).chunk(WORLD)[r])


def on_rank_coalesced(rank, world_size):
    a, b = neuron(data(rank)), neuron(data(rank, n=3))
    with dist._coalescing_manager(device=torch.device("neuron", rank)):
        dist.all_reduce(a)
        dist.all_reduce(b)
    c = [neuron(data(rank)), neuron(data(rank, n=2))]
    dist.all_reduce_coalesced(c)
    return a.cpu(), b.cpu(), [x.cpu() for x in c]


def test_coalesced(world):
    for a, b, c in world.run(on_rank_coalesced):
        torch.testing.assert_close(a, data(0) + data(1))
        torch.testing.assert_close(b, data(0, n=3) + data(1, n=3))
        torch.testing.assert_close(c[0], data(0) + data(1))
        torch.testing.assert_close(c[1], data(0, n=2) + data(1, n=2))


# --- point to point -----------------------------------------------------------

def on_rank_p2p(rank, world_size):
    peer = 1 - rank
    # Both ranks send first: the receive must still be posted (no deadlock).
    big = neuron(data(rank, n=1 << 18))
    send = dist.isend(big, peer)
    got = torch.empty(1 << 18, device="neuron")
    dist.recv(got, peer)
    send.wait()
    ops = [dist.P2POp(dist.isend, neuron(data(rank, n=5)), peer),
           dist.P2POp(dist.irecv, recv := torch.empty(5, device="neuron"), peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return got.cpu(), recv.cpu()


def test_send_recv(world):
    for rank, (big, small) in enumerate(world.run(on_rank_p2p)):
        torch.testing.assert_close(big, data(1 - rank, n=1 << 18))
        torch.testing.assert_close(small, data(1 - rank, n=5))


# --- objects, CPU tensors, barrier ------------------------------------------------

def on_rank_objects(rank, world_size):
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"rank": rank, "tensor": torch.tensor([rank])})
    objs = [f"from {rank}", rank * 10]
    dist.broadcast_object_list(objs, src=1)
    received = [None]
    dist.scatter_object_list(received, [["a"], ["b"]] if rank == 0 else None, src=0)
    if rank == 0:
        dist.send_object_list([{"k": 1}], dst=1)
        sent = None
    else:
        sent = [None]
        dist.recv_object_list(sent, src=0)
    return gathered, objs, received, sent


def test_object_collectives(world):
    results = world.run(on_rank_objects)
    for rank, (gathered, objs, received, sent) in enumerate(results):
        assert [g["rank"] for g in gathered] == [0, 1]
        assert objs == ["from 1", 10]
        assert received == [[["a"], ["b"]][rank]]
    assert results[1][3] == [{"k": 1}]


def on_rank_cpu_tensors(rank, world_size):
    t = data(rank)
    dist.all_reduce(t)
    return t


def test_cpu_tensors_go_to_gloo(world):
    for got in world.run(on_rank_cpu_tensors):
        torch.testing.assert_close(got, data(0) + data(1))


def on_rank_barrier(rank, world_size):
    if rank == 1:
        time.sleep(1.0)
    start = time.monotonic()
    dist.barrier()
    return time.monotonic() - start


def test_barrier_blocks_the_host(world):
    waited = world.run(on_rank_barrier)
    assert waited[0] > 0.5, waited


# --- asynchrony and streams ---------------------------------------------------

def on_rank_async(rank, world_size):
    t = neuron(data(rank, n=1 << 20))
    work = dist.all_reduce(t, async_op=True)
    # The caller's stream runs on; waiting orders it after the transfer.
    other = neuron(data(rank)) * 2
    work.wait()
    doubled = t * 2
    fut = dist.all_reduce(neuron(data(rank)), async_op=True).get_future()
    fut_value = fut.wait()[0] * 1
    # A side stream: the collective follows that stream's work, not the default stream's.
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        u = neuron(data(rank)) + 1
        dist.all_reduce(u)
        v = u * 3
    torch.neuron.current_stream().wait_stream(side)
    return doubled.cpu(), fut_value.cpu(), v.cpu(), other.cpu()


def test_async_work_orders_the_callers_stream(world):
    for rank, (doubled, fut_value, v, other) in enumerate(world.run(on_rank_async)):
        torch.testing.assert_close(doubled, (data(0, n=1 << 20) + data(1, n=1 << 20)) * 2)
        torch.testing.assert_close(fut_value, data(0) + data(1))
        torch.testing.assert_close(v, (data(0) + 1 + data(1) + 1) * 3)
        torch.testing.assert_close(other, data(rank) * 2)


def on_rank_freed_during_transfer(rank, world_size):
    store = dist.distributed_c10d._get_default_store()
    n = 1 << 16
    if rank == 1:
        store.wait(["freed"])  # joins only once rank 0 has freed its buffer and reused the memory
        t = neuron(data(rank, n=n))
        dist.all_reduce(t)
        return t.cpu()
    t = neuron(data(rank, n=n))
    work = dist.all_reduce(t, async_op=True)
    del t  # the transfer is still waiting for rank 1
    fillers = [torch.full((n,), 7.0, device="neuron") for _ in range(4)]
    torch.neuron.current_stream().synchronize()
    store.set("freed", "1")
    work.wait()
    torch.neuron.synchronize()
    return [f.cpu() for f in fillers]


def test_memory_freed_during_a_transfer_is_not_reused_under_it(world):
    fillers, reduced = world.run(on_rank_freed_during_transfer)
    for f in fillers:
        assert bool((f == 7.0).all())
    torch.testing.assert_close(reduced, data(0, n=1 << 16) + data(1, n=1 << 16))


# --- functional collectives -------------------------------------------------------

def funcol_step(x: torch.Tensor) -> torch.Tensor:
    group = dist.group.WORLD
    summed = funcol.all_reduce(x * 2, "sum", group)
    gathered = funcol.all_gather_tensor(summed + 1, 0, group)
    return funcol.reduce_scatter_tensor(gathered, "avg", 0, group) - 1


def on_rank_funcol(rank, world_size, compiled):
    fn = torch.compile(funcol_step, backend="neuron", fullgraph=True) if compiled else funcol_step
    return fn(neuron(data(rank))).cpu()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_functional_collectives(world, compiled):
    summed = (data(0) + data(1)) * 2
    for got in world.run(on_rank_funcol, compiled=compiled, timeout_s=180):
        torch.testing.assert_close(got, summed)


# --- bad input --------------------------------------------------------------------

def on_rank_bad_input(rank, world_size):
    def error(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the test inspects the type and message
            return type(e).__name__, str(e).splitlines()[0]
        return None

    t = neuron(data(rank))
    return {
        "mixed": error(lambda: dist.all_gather_into_tensor(torch.empty(12), t)),
        "size": error(lambda: dist.all_gather_into_tensor(torch.empty(5, device="neuron"), t)),
        "avg_int": error(lambda: dist.all_reduce(neuron(torch.ones(2, dtype=torch.int64)), op=dist.ReduceOp.AVG)),
        "strided": error(lambda: dist.all_reduce(neuron(torch.ones(4, 4)).t())),
        "list": error(lambda: dist.all_gather([torch.empty(6, device="neuron")], t)),
        "splits": error(lambda: dist.all_to_all_single(torch.empty(6, device="neuron"), t, [1, 1], [3, 3])),
        "other_device": error(lambda: dist.all_reduce(torch.ones(2, device=f"neuron:{1 - rank}"))),
        # The group is still usable afterwards: nothing was sent.
        "after": on_rank_all_reduce(rank, world_size, "SUM", torch.float32),
    }


def test_bad_input_is_refused_before_anything_is_sent(world):
    for r in world.run(on_rank_bad_input):
        assert r["mixed"][0] == "ValueError" and "neuron:" in r["mixed"][1] and "cpu" in r["mixed"][1]
        assert r["size"][0] == "ValueError" and "all_gather_into_tensor" in r["size"][1]
        assert r["avg_int"][0] == "TypeError" and "AVG" in r["avg_int"][1]
        assert r["strided"][0] == "ValueError" and "not contiguous" in r["strided"][1]
        assert r["list"][0] == "ValueError" and "the output list has 1 tensors; the group has 2 ranks" in r["list"][1]
        assert r["splits"][0] == "ValueError" and "split sizes add up to 2" in r["splits"][1]
        assert r["other_device"][0] == "ValueError" and "communicates for neuron:" in r["other_device"][1]
        torch.testing.assert_close(r["after"], data(0) + data(1))


# --- overlap and backend selection ------------------------------------------------

def on_rank_overlap(rank, world_size):
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["computed"])  # joins only after rank 0 computed: its transfer is in flight meanwhile
        t = neuron(data(rank, n=1024))
        dist.all_reduce(t)
        return None
    t = neuron(data(rank, n=1024))
    work = dist.all_reduce(t, async_op=True)
    a = torch.randn(128, 128, device="neuron")
    b = (a @ a).sum()  # queued behind nothing but itself
    torch.neuron.current_stream().synchronize()
    in_flight = not work.is_completed()
    store.set("computed", "1")
    work.wait()
    return in_flight, t.cpu(), b.item(), (a.cpu() @ a.cpu()).sum().item()


def test_compute_overlaps_communication(world):
    in_flight, reduced, b, expected_b = world.run(on_rank_overlap)[0]
    assert in_flight  # the caller's stream finished while the all_reduce waited for rank 1
    torch.testing.assert_close(reduced, data(0, n=1024) + data(1, n=1024))
    assert abs(b - expected_b) <= 1e-3 * max(1.0, abs(expected_b))


def on_rank_device_then_cpu(rank, world_size):
    # A device collective queued behind slow device work, then a CPU one: the
    # CPU one runs first on the host; each must still meet its own counterpart.
    a = torch.randn(256, 256, device="neuron")
    for _ in range(20):
        a = a @ a / 256
    t = neuron(data(rank)) + a.sum() * 0
    dist.all_reduce(t)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, rank)
    c = data(rank, n=3)
    dist.all_reduce(c)
    return t.cpu(), gathered, c


def test_device_and_cpu_collectives_keep_their_own_order():
    world = World(2, backend="neuron")
    try:
        for t, gathered, c in world.run(on_rank_device_then_cpu):
            torch.testing.assert_close(t, data(0) + data(1))
            assert gathered == [0, 1]
            torch.testing.assert_close(c, data(0, n=3) + data(1, n=3))
    finally:
        world.close()


def on_rank_backend_choice(rank, world_size):
    pg = dist.group.WORLD
    neuron_backend = type(pg._get_backend(torch.device("neuron"))).__name__
    try:
        cpu_backend = type(pg._get_backend(torch.device("cpu"))).__name__
    except RuntimeError:
        cpu_backend = None
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2).to(f"neuron:{rank}"))
    model(torch.ones(2, 3, device=f"neuron:{rank}")).sum().backward()
    return neuron_backend, cpu_backend, on_rank_all_reduce(rank, world_size, "SUM", torch.float32)


@pytest.mark.parametrize("backend, cpu", [(None, None), ("cpu:gloo,neuron:neuron", "ProcessGroupGloo")])
def test_backend_selection(backend, cpu):
    # init_process_group() with no backend takes the accelerator's (as NCCL for CUDA: neuron only);
    # the device-map form pairs it with Gloo for CPU tensors. DDP works with both.
    world = World(2, backend=backend)
    try:
        for neuron_backend, cpu_backend, reduced in world.run(on_rank_backend_choice):
            assert neuron_backend == "_ProcessGroupNeuron" and cpu_backend == cpu
            torch.testing.assert_close(reduced, data(0) + data(1))
    finally:
        world.close()


def on_rank_more(rank, world_size):
    bits = neuron(torch.tensor([0b1100, 0b1010], dtype=torch.int32) >> rank)
    dist.all_reduce(bits, op=dist.ReduceOp.BOR)
    t = neuron(data(rank))
    work = dist.all_reduce(t, async_op=True)
    work.wait(timeout=timedelta(seconds=30))  # with a timeout the host waits too
    done = work.is_completed()
    return bits.cpu(), done, t.cpu()


def test_bitwise_reduction_and_timed_wait(world):
    for bits, done, t in world.run(on_rank_more):
        assert bits.tolist() == [0b1100 | 0b0110, 0b1010 | 0b0101]
        assert done
        torch.testing.assert_close(t, data(0) + data(1))
