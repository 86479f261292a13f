"""A cost model of a kernel call on a platform target: a model estimate, not a measurement.

Each instruction is charged to its engine from the public NeuronCore figures in the platform
table (clocks, tensor-engine rate, HBM bandwidth). The model's own assumptions are the constants
below: every instruction pays a fixed issue overhead, vector/scalar/gpsimd engines process one
element per partition per cycle, the tensor engine streams one moving column per cycle (a
quarter of that for fp32 operands), and engines overlap perfectly, so the estimated latency is
the busiest engine's time (the serial sum is reported as an upper bound).
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch

ISSUE_OVERHEAD_CYCLES = 64       # per compute instruction
DMA_FIXED_SECONDS = 0.5e-6       # per DMA transfer (descriptor processing and latency)
FP32_MATMUL_SLOWDOWN = 4         # fp32 operands run the systolic array at a quarter of the bf16 rate
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


class CostRecorder:
    """Counts what the check pass of a kernel call would execute."""

    def __init__(self, platform):
        self.platform = platform
        self.instructions = defaultdict(int)
        self.cycles = defaultdict(float)
        self.dma_seconds = 0.0
        self.bytes = defaultdict(int)   # "hbm->sbuf", "sbuf->hbm", ...
        self.flops = 0

    def instruction(self, engine, what, shape, dtype, matmul=None, src=None, dst=None, passes=1):
        shape = tuple(shape)
        itemsize = dtype.itemsize
        self.instructions[engine] += 1
        if engine == "dma":
            nbytes = math.prod(shape) * itemsize
            self.bytes[f"{src}->{dst}"] += nbytes
            per_core = self.platform.figures["hbm_bandwidth_tbps"] * 1e12 / self.platform.figures["cores_per_chip"]
            self.dma_seconds += DMA_FIXED_SECONDS + nbytes / per_core
            return
        if matmul is not None:
            k, m, n = matmul
            self.flops += 2 * k * m * n
            rate = FP32_MATMUL_SLOWDOWN if dtype == torch.float32 else 1
            self.cycles["tensor"] += ISSUE_OVERHEAD_CYCLES + n * rate
            return
        free = math.prod(shape[1:]) if len(shape) > 1 else 1
        self.cycles[engine] += ISSUE_OVERHEAD_CYCLES + free * passes

    def report(self, kernel_name, grid) -> "CostReport":
        f = self.platform.figures
        clocks = {"tensor": f["tensor_clock_ghz"], "vector": f["vector_clock_ghz"], "scalar": f["scalar_clock_ghz"],
                  "gpsimd": f["vector_clock_ghz"]}
        seconds = {e: self.cycles[e] / (clocks[e] * 1e9) for e in clocks}
        seconds["dma"] = self.dma_seconds
        total = max(seconds.values())
        peak = f["core_bf16_tflops"] * 1e12
        return CostReport(
            kernel=kernel_name, target=self.platform.target, grid=grid,
            engine_seconds=seconds, instructions={e: self.instructions[e] for e in ENGINES},
            bytes_moved=dict(self.bytes), matmul_flops=self.flops, estimated_seconds=total,
            serial_seconds=sum(seconds.values()),
            tensor_engine_utilisation=self.flops / (peak * total) if total else 0.0)


@dataclass
class CostReport:
    """The estimated cost of one kernel call (all programs of its grid on one NeuronCore)."""

    kernel: str
    target: str
    grid: tuple
    engine_seconds: dict
    instructions: dict
    bytes_moved: dict
    matmul_flops: int
    estimated_seconds: float
    serial_seconds: float
    tensor_engine_utilisation: float
    nc_latency: object = field(init=False, repr=False)

    def __post_init__(self):
        self.nc_latency = _Latency(self.estimated_seconds * 1e6)

    def __str__(self):
        lines = [f"NKI cost model estimate (not a measurement): {self.kernel} grid={self.grid or (1,)} on "
                 f"{self.target}",
                 f"  estimated latency {self.estimated_seconds * 1e6:.2f} us (engines overlapped; serial bound "
                 f"{self.serial_seconds * 1e6:.2f} us), tensor engine utilisation {self.tensor_engine_utilisation:.1%}"]
        for e in ENGINES:
            lines.append(f"  {e:7s} {self.engine_seconds[e] * 1e6:10.2f} us  {self.instructions[e]:6d} instructions")
        for route, n in sorted(self.bytes_moved.items()):
            lines.append(f"  {route:14s} {n:12d} bytes")
        return "\n".join(lines)


class _Latency:
    """``benchmark_result.nc_latency`` of NKI's benchmark API: every percentile is the model's estimate."""

    def __init__(self, us):
        self._us = us

    def get_latency_percentile(self, percentile):
        return self._us
