"""Every parallelism style, end to end: each example under examples/distributed runs
under torchrun on two neuron devices and checks itself against a single-process CPU
run (the script exits non-zero on a mismatch and prints "parity ok" otherwise).

torchrun starts each rank in a session of its own, so killing torchrun's process
group would leave ranks behind: the ranks are found through /proc while they run
and killed by pid if anything is left at the end.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "distributed"
TIMEOUT_S = 240


def children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> set[int]:
    tree, found, todo = children_of(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def run_torchrun(script: Path) -> tuple[int | None, str]:
    """(exit code or None on timeout, output) of `torchrun --standalone --nproc-per-node 2 script`
    (--standalone: a rendezvous on a free local port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        seen: set[int] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= descendants(proc.pid)
            time.sleep(0.5)
        code = proc.poll()
        for pid in seen | ({proc.pid} if code is None else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        out.seek(0)
        return code, out.read()


SCRIPTS = ["ddp", "fsdp2", "dtensor", "tensor_parallel", "pipeline", "zero", "simple_fsdp", "dcp"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_matches_single_process_cpu(name):
    code, output = run_torchrun(EXAMPLES / f"{name}.py")
    ranks = [line for line in output.splitlines() if line.startswith("[rank") or name in line]
    tail = "\n".join(ranks[-40:] or output.splitlines()[-40:])
    assert code is not None, f"{name}.py did not finish within {TIMEOUT_S} s:\n{tail}"
    assert code == 0, f"{name}.py exited with {code}:\n{tail}"
    assert f"{name}: parity ok" in output, tail
