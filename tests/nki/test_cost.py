"""The cost model: labelled as an estimate, counts what a kernel does, grows with the work."""

import numpy as np

import torchneuron.nki as nki
from tests.nki.test_isa import tiled_matmul


def estimate(m, k, n, target="trn2"):
    return nki.estimate(tiled_matmul, np.zeros((k, m), np.float32), np.zeros((k, n), np.float32), target=target)


def test_counts_instructions_bytes_and_flops():
    r = estimate(256, 384, 1024)
    tiles = (256 // 128) * (1024 // 512)
    assert r.instructions["tensor"] == tiles * 3
    assert r.matmul_flops == 2 * 256 * 384 * 1024
    assert r.bytes_moved["hbm->sbuf"] == 4 * (384 * 256 * 2 + 384 * 1024 * 2)  # lhsT per n-tile, rhs per m-tile
    assert r.bytes_moved["sbuf->shared_hbm"] == 4 * 256 * 1024
    assert r.estimated_seconds == max(r.engine_seconds.values())
    assert r.serial_seconds >= r.estimated_seconds
    assert 0 < r.tensor_engine_utilisation <= 1


def test_bigger_work_gives_a_bigger_estimate():
    small, large = estimate(128, 128, 512), estimate(256, 512, 1024)
    assert large.estimated_seconds > small.estimated_seconds
    assert all(large.engine_seconds[e] >= small.engine_seconds[e] for e in small.engine_seconds)


def test_targets_differ_and_the_report_says_it_is_an_estimate():
    trn2, trn3 = estimate(256, 256, 1024), estimate(256, 256, 1024, target="trn3")
    assert trn3.target == "trn3" and trn3.engine_seconds["dma"] < trn2.engine_seconds["dma"]  # more HBM bandwidth
    text = str(trn2)
    assert "estimate" in text and "not a measurement" in text and "tensor" in text


def test_benchmark_api_sets_benchmark_result():
    bench = nki.benchmark(tiled_matmul, target="trn2")
    a, b = np.ones((128, 128), np.float32), np.ones((128, 512), np.float32)
    out = bench(a, b)
    np.testing.assert_array_equal(out, 128)
    latency_us = bench.benchmark_result.nc_latency.get_latency_percentile(50)
    assert latency_us == bench.benchmark_result.estimated_seconds * 1e6 > 0
