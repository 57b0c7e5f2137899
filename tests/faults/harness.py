"""Crash harness: run a save in a forked child that SIGKILLs itself at a chosen point.

The kill points live in the child's Storage (injected through `Checkpointer(storage=...)`), so
a crash lands exactly at one phase of the commit protocol: before any data, in the middle of the
data files, after the data but before the manifest, after the manifest but before the commit
marker, or while the marker is being written (half of its bytes, then death). Children are
forked from the test process, which has torch imported already: a crash case costs
milliseconds, not an interpreter start.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback

import torch
from fsspec.implementations.local import LocalFileSystem

from ckptflow.core import layout
from ckptflow.core.storage import Storage
from tests.steps.distworkers import free_port, rank_env

PHASES = {
    "before_data": "SIGKILL before the first data file (intent written)",
    "mid_data": "SIGKILL in the middle of the data files",
    "before_manifest": "SIGKILL after all data, before the manifest",
    "before_commit": "SIGKILL after the manifest, before the commit marker",
    "during_commit": "SIGKILL while writing the commit marker (half of its bytes written)",
}


def die() -> None:
    """End this process the way the OOM killer or a node loss would: no cleanup at all."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached


class KillingStorage(Storage):
    """A Storage whose process dies at one phase of a save (see PHASES).

    `mid_after` is how many object writes complete before a `mid_data` crash.
    """

    def __init__(self, uri: str, phase: str, *, mid_after: int = 3, fs=None):
        super().__init__(uri, fs=fs)
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        self.phase, self.mid_after = phase, mid_after
        self._objects = 0
        self._lock = threading.Lock()

    def write(self, rel, data, *, exclusive=False, **kw):
        name = rel.rsplit("/", 1)[-1]
        if rel.startswith(f"{layout.OBJECTS}/"):
            if self.phase == "before_data":
                die()
            super().write(rel, data, exclusive=exclusive, **kw)
            with self._lock:
                self._objects += 1
                if self.phase == "mid_data" and self._objects >= self.mid_after:
                    die()
            return
        if name.startswith("manifest-") and self.phase == "before_manifest":
            die()
        if name == layout.COMMIT and rel.startswith("step-"):
            if self.phase == "before_commit":
                die()
            if self.phase == "during_commit":
                self._torn_write(rel, bytes(data))
                die()
        super().write(rel, data, exclusive=exclusive, **kw)

    def _torn_write(self, rel: str, data: bytes) -> None:
        """Half of the marker reaches storage. Locally that is the hidden temporary file an
        exclusive create writes before linking it into place (as ckptflow.core.localfs.write names
        it); on S3 a half-written COMMIT object, which a real interrupted PUT can never
        leave: that makes the S3 case stricter than reality."""
        half = data[: len(data) // 2]
        if self.protocol == "file":
            path = self.path(rel)
            tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{'ab' * 6}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, half)
            os.fsync(fd)
            os.close(fd)
        else:
            self.fs.pipe_file(self.path(rel), half)


def run_forked(fn, *args, timeout: float = 120.0) -> int:
    """Run fn(*args) in a forked child; return its exit code (-9: it was SIGKILLed)."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            fn(*args)
        except SystemExit as exc:  # a step's main() ends with sys.exit(code)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"child {pid} did not finish in {timeout}s")
        time.sleep(0.01)


def crash_state(seed: int, n_tensors: int = 8) -> dict:
    """A state dict of `n_tensors` distinct tensors (one object each) and some plain values."""
    g = torch.Generator().manual_seed(seed)
    state = {f"layer{i}": torch.randn(48, 64, generator=g) for i in range(n_tensors)}
    state["step"] = seed
    state["data"] = {"position": 1000 + seed, "epoch": 1}
    return state


def save_then_maybe_die(root: str, phase: str, step: int, state: dict, block: bool) -> None:
    """The child's work: one save through a killing storage; returning means it survived.
    The storage is made here, in the child: an fsspec filesystem is not fork-safe."""
    from ckptflow.steps.checkpoint import Checkpointer

    ck = Checkpointer("unused", storage=KillingStorage(root, phase), threads=2)
    handle = ck.save(step, state, block=block)
    if not block:
        # "training" goes on while the background write runs (and dies)
        for t in state.values():
            if isinstance(t, torch.Tensor):
                t.add_(1.0)
    handle.wait()
    ck.close()


def run_ranks(world: int, fn, *args, timeout: float = 120.0) -> list[int]:
    """Run fn(rank, world, *args) on `world` forked gloo ranks; return their exit codes.

    When a rank dies abnormally the others are SIGKILLed, as torchrun tears a group down.
    """
    import datetime

    import torch.distributed as dist

    port = free_port()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                rank_env(rank, world, port)
                dist.init_process_group(
                    "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
                )
                fn(rank, world, *args)
                dist.barrier()
                dist.destroy_process_group()
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < world:
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if any(c != 0 for c in codes.values()) or time.monotonic() > deadline:
            for pid in pids:  # the agent's teardown
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.01)
    return [codes[p] for p in pids]


def rank_state(rank: int, step: int) -> dict:
    """Rank-qualified shards plus a replicated tensor and values: deterministic per step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    shared = torch.Generator().manual_seed(step)
    return {
        f"shard/rank{rank}": {f"t{i}": torch.randn(32, 64, generator=g) for i in range(4)},
        "replicated": torch.randn(16, 16, generator=shared),
        "step": step,
    }


def ranks_save(rank: int, world: int, root: str, step: int, kill_rank: int | None) -> None:
    """Every rank saves `step`; rank `kill_rank` dies after its first object write."""
    from ckptflow.steps.checkpoint import Checkpointer

    phase = "mid_data" if rank == kill_rank else None
    st = KillingStorage(root, phase, mid_after=1) if phase else Storage(root)
    Checkpointer("unused", storage=st, threads=2).save(step, rank_state(rank, step))


def with_output_to(path: str, fn, *args):
    """Run fn(*args) with this process's stdout and stderr (fds 1, 2) going to `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # pytest's capture replaced sys.stdout/sys.stderr and put handlers on the root logger:
    # point both streams at the new fds and drop the handlers, so a step's own
    # logging.basicConfig writes its lines to `path`.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    return fn(*args)


MAX_PEAK = 64 << 20  # bytes a rejected checkpoint may make Python allocate


class ReadRecordingFS(LocalFileSystem):
    """Local filesystem recording every path it is asked to read or look at."""

    cachable = False

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.paths: list[str] = []

    def cat_file(self, path, *a, **kw):
        self.paths.append(str(path))
        return super().cat_file(path, *a, **kw)

    def _open(self, path, *a, **kw):
        self.paths.append(str(path))
        return super()._open(path, *a, **kw)

    def info(self, path, **kw):
        self.paths.append(str(path))
        return super().info(path, **kw)

    def ls(self, path, *a, **kw):
        self.paths.append(str(path))
        return super().ls(path, *a, **kw)
