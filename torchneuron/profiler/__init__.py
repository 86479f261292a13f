"""Profiling the neuron device.

``torch.profiler.profile(activities=[ProfilerActivity.CPU,
ProfilerActivity.PrivateUse1])`` records every device task (see
``csrc/profiler``); this package exports such a profile to Parquet and
analyses exports (``torchneuron explore``). See docs/profiler.md.
"""

from torchneuron.profiler.export import export_parquet, parquet_trace_handler
from torchneuron.profiler.schema import SCHEMA_VERSION

__all__ = ["export_parquet", "parquet_trace_handler", "SCHEMA_VERSION"]
