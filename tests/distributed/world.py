"""A pool of rank processes that run test functions, one process group for many tests.

Starting a rank costs seconds (importing torch, connecting Gloo), so a
``World`` starts its ranks once and then runs functions in all of them:
``world.run(fn, **kwargs)`` calls ``fn(rank=r, world_size=n, **kwargs)`` in
every rank and returns the per-rank results (or raises the first rank's
error). ``fn`` must be a module-level function of an importable module, and
return picklable values (CPU tensors, numbers).

Every call has a deadline; a world whose call overran, or whose rank died,
is killed (every process, no waiting) and must not be used again. Ranks also
exit on their own when the test process goes away (their connection closes).
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Client, Listener

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Plain pickle: a Connection's own pickler is torch's, which would share
# tensors through file descriptors instead of copying them.
def _send(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


class RankError(AssertionError):
    """A test function raised in a rank; the message carries its traceback."""


class RankDied(RuntimeError):
    """A rank exited; ``results`` holds what the other ranks returned."""

    def __init__(self, message: str, results: list):
        super().__init__(message)
        self.results = results


class World:
    def __init__(self, world_size: int = 2, backend: str | None = "neuron", timeout_s: float = 60.0, start_s: float = 120.0,
                 env: dict | None = None, capture_stderr: bool = False):
        self.world_size = world_size
        self._dir = tempfile.TemporaryDirectory(prefix="tn-world-")
        self._listener = Listener(("127.0.0.1", 0), authkey=b"torchneuron-tests")
        host, port = self._listener.address
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
        self._stderr = [os.path.join(self._dir.name, f"rank{r}.err") for r in range(world_size)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.distributed.world", str(rank), str(world_size), host, str(port),
                 os.path.join(self._dir.name, "store"), str(backend), str(timeout_s)],
                cwd=REPO, env=env, stderr=open(self._stderr[rank], "w") if capture_stderr else None,
            )
            for rank in range(world_size)
        ]
        self.conns = [None] * world_size
        self._listener._listener._socket.settimeout(start_s)
        try:
            for _ in range(world_size):
                conn = self._listener.accept()
                rank = _recv(conn)
                self.conns[rank] = conn
            self._gather(start_s)  # every rank reports its group is up
        except BaseException:
            self.close()
            raise

    def run(self, fn, timeout_s: float = 60.0, **kwargs) -> list:
        for conn in self.conns:
            _send(conn, (fn.__module__, fn.__name__, kwargs))
        return self._gather(timeout_s)

    def _gather(self, timeout_s: float) -> list:
        deadline = time.monotonic() + timeout_s
        results: list = [None] * self.world_size
        errors, died = [], []
        for rank, conn in enumerate(self.conns):
            try:
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    self.close()
                    raise TimeoutError(f"rank {rank} did not answer within {timeout_s} s; the world was killed")
                reply = _recv(conn)
            except (EOFError, ConnectionError):
                died.append(rank)
                continue
            if reply[0] == "ok":
                results[rank] = reply[1]
            else:
                errors.append(f"rank {rank}: {reply[1]}")
        if died:
            self.close()
            raise RankDied(f"ranks {died} exited (codes {[self.procs[r].poll() for r in died]})", results)
        if errors:
            raise RankError("\n".join(errors))
        return results

    def stderr(self, rank: int) -> str:
        """What a rank wrote to stderr (with ``capture_stderr=True``); readable after close()."""
        with open(self._stderr[rank]) as f:
            return f.read()

    @property
    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs) and all(c is not None for c in self.conns)

    def close(self) -> None:
        for conn in self.conns:
            if conn is not None:
                try:
                    _send(conn, None)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.conns = [None] * self.world_size
        self._listener.close()

    def __del__(self):
        self._dir.cleanup()


def _serve(rank: int, world_size: int, host: str, port: int, store_path: str, backend: str, timeout_s: float):
    import torch
    import torch.distributed as dist

    conn = Client((host, port), authkey=b"torchneuron-tests")
    _send(conn, rank)
    try:
        torch.neuron.set_device(rank % torch.neuron.device_count())
        dist.init_process_group(None if backend == "None" else backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        _send(conn, ("ok", None))
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, ConnectionError):
            os._exit(0)  # the test process is gone: do not linger in collectives
        if msg is None:
            break
        module, name, kwargs = msg
        try:
            fn = getattr(importlib.import_module(module), name)
            reply = ("ok", fn(rank=rank, world_size=world_size, **kwargs))
        except BaseException:
            reply = ("error", traceback.format_exc())
        _send(conn, reply)
    dist.destroy_process_group()


if __name__ == "__main__":
    a = sys.argv[1:]
    _serve(int(a[0]), int(a[1]), a[2], int(a[3]), a[4], a[5], float(a[6]))
