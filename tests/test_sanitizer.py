"""The stream sanitizer: each report class with a planted race, no report
where the program orders its accesses, and the test suite's own programs run
clean with it on."""

import os
import subprocess
import sys

import pytest
import torch

from tests.test_copies import busy
from torchneuron import sanitizer
from torchneuron.sanitizer import StreamRaceError


@pytest.fixture
def on():
    torch.neuron.synchronize()
    sanitizer.enable()
    yield
    sanitizer.disable()
    torch.neuron.synchronize()


def write_on_default_then_read_on(side, order):
    x = torch.zeros(64, device="neuron")
    x.add_(1)  # written on the default stream
    order(side)
    with torch.neuron.stream(side):
        return x * 2  # read on the side stream


ORDERINGS = {
    "wait_stream": lambda side: side.wait_stream(torch.neuron.default_stream()),
    "event": lambda side: side.wait_event(torch.neuron.default_stream().record_event()),
    "stream synchronize": lambda side: torch.neuron.default_stream().synchronize(),
    "event synchronize": lambda side: torch.neuron.default_stream().record_event().synchronize(),
    "device synchronize": lambda side: torch.neuron.synchronize(),
    "item": lambda side: torch.zeros(1, device="neuron").sum().item(),
}


def test_a_read_on_another_stream_of_an_unordered_write_is_reported_with_both_stacks(on):
    side = torch.neuron.Stream()
    with pytest.raises(StreamRaceError) as info:
        write_on_default_then_read_on(side, lambda s: None)
    message = str(info.value)
    assert f"stream {side.stream_id} reads it" in message and "stream 0 wrote it" in message
    assert "aten::mul" in message and "aten::add_" in message
    # Both stack traces point at the lines of this file that made the accesses.
    assert message.count("in write_on_default_then_read_on") == 2, message
    assert "x.add_(1)" in message and "return x * 2" in message


@pytest.mark.parametrize("how", sorted(ORDERINGS))
def test_an_ordered_read_is_not_reported(on, how):
    side = torch.neuron.Stream()
    out = write_on_default_then_read_on(side, ORDERINGS[how])
    torch.neuron.synchronize()
    assert out.cpu().unique().tolist() == [2.0]


def test_a_write_after_an_unordered_read_on_another_stream_is_reported(on):
    side = torch.neuron.Stream()
    x = torch.ones(64, device="neuron")
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        y = x * 3  # read on the side stream
    with pytest.raises(StreamRaceError, match=r"aten::mul_.* writes it while aten::mul.* read it"):
        x.mul_(0)  # written on the default stream while the side stream may still read it
    torch.neuron.current_stream().wait_stream(side)
    del y


def test_a_host_read_of_a_non_blocking_copy_before_it_is_known_complete_is_reported(on):
    x = busy()[0] * 0 + 5
    h = x.to("cpu", non_blocking=True)
    with pytest.raises(StreamRaceError, match="the host reads it while aten::_to_copy on neuron:0 stream 0 wrote it"):
        h.sum()
    torch.neuron.current_stream().synchronize()
    assert h.sum().item() == 5 * 384


def test_a_host_read_after_the_copys_event_completed_is_not_reported(on):
    h = torch.empty(384, pin_memory=True)
    h.copy_(busy()[0], non_blocking=True)
    done = torch.neuron.Event()
    done.record()
    done.synchronize()
    h.sum()


def test_a_host_write_to_pinned_memory_a_non_blocking_copy_may_still_read_is_reported(on):
    h = torch.ones(64).pin_memory()
    busy()
    d = h.to("neuron", non_blocking=True)
    with pytest.raises(StreamRaceError, match="the host writes it while aten::_to_copy on neuron:0 stream 0 read it"):
        h.fill_(7)
    torch.neuron.synchronize()
    del d


def test_a_pinned_block_reused_by_a_copy_on_another_stream_starts_a_new_history(on):
    """The block of a dropped copy's destination may serve the next copy: the
    old copy's write is its previous owner's, not a race with the new one."""
    side = torch.neuron.Stream()
    x = torch.ones(64, device="neuron")
    side.wait_stream(torch.neuron.current_stream())
    dropped = x.to("cpu", non_blocking=True)
    address = dropped.untyped_storage().data_ptr()
    while not torch.neuron.current_stream().query():  # done (a query orders nothing), its result unread
        pass
    del dropped
    with torch.neuron.stream(side):
        h = x.to("cpu", non_blocking=True)
    assert h.untyped_storage().data_ptr() == address, "the pinned allocator did not reuse the block"
    side.synchronize()
    assert h.sum().item() == 64


def test_off_nothing_is_checked_and_no_observer_is_installed():
    assert not sanitizer.is_enabled()
    side = torch.neuron.Stream()
    write_on_default_then_read_on(side, lambda s: None)  # racy, and not reported
    torch.neuron.synchronize()


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_the_environment_variable_turns_it_on_and_a_bad_value_is_an_error():
    racy = ("import torch, torchneuron\n"
            "x = torch.zeros(8, device='neuron'); x.add_(1)\n"
            "with torch.neuron.stream(torch.neuron.Stream()):\n"
            "    y = x * 2\n")
    found = _run(racy, TORCHNEURON_SANITIZER="1")
    assert found.returncode != 0 and "StreamRaceError" in found.stderr, found.stderr
    assert _run(racy, TORCHNEURON_SANITIZER="0").returncode == 0
    bad = _run("import torchneuron", TORCHNEURON_SANITIZER="yes")
    assert "TORCHNEURON_SANITIZER='yes': expected 0 or 1" in bad.stderr


def test_the_suites_own_stream_and_copy_programs_run_clean_with_it_on():
    """A slice of the default tier with the sanitizer on: zero reports."""
    here = os.path.dirname(__file__)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(here, "test_async_copies.py"),
         os.path.join(here, "test_fuzz_async.py"), os.path.join(here, "test_streams.py"),
         "-k", "not sanitizer and not planted"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "TORCHNEURON_SANITIZER": "1"},
    )
    tail = result.stdout[-3000:]
    assert result.returncode == 0 and "StreamRaceError" not in result.stdout, tail
