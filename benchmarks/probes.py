"""What the benchmarks measure a phase with, in its own process: wall and CPU time, peak RSS,
the page cache (warm or dropped) and the bytes a method stored; plus scratch clean-up."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time

GIB = float(1 << 30)
BLOCK = 8 << 20  # dd-like block size for the raw disk / raw S3 ceiling


def clock() -> tuple[float, float]:
    """(wall, CPU) now: CPU is every thread of this process (user + system)."""
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float], prefix: str) -> dict:
    wall, cpu = clock()
    return {f"{prefix}_s": wall - t0[0], f"{prefix}_cpu_s": cpu - t0[1]}


def _write_proc(path: str, value: str) -> bool:
    """Write a kernel control file; False where it is refused (not Linux, not root)."""
    try:
        with open(path, "w") as f:
            f.write(value + "\n")
        return True
    except OSError:
        return False


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: clear_refs 5), so a later VmHWM is this phase's."""
    return _write_proc("/proc/self/clear_refs", "5")


def pre_read(uri: str) -> None:
    """Read every file of a local checkpoint once, so a warm load finds it in the page cache."""
    if uri.startswith("s3://"):
        return
    paths = (
        [uri]
        if os.path.isfile(uri)
        else [os.path.join(d, f) for d, _, files in os.walk(uri) for f in files]
    )
    buf = bytearray(BLOCK)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def rss_gib(field: str = "VmHWM") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / GIB
    return float("nan")


def drop_caches() -> bool:
    """Flush and drop the page cache (root only) so the next read comes from the disk."""
    os.sync()
    return _write_proc("/proc/sys/vm/drop_caches", "3")


def storage_busy(dirty_limit: int = 1 << 20) -> bool:
    """Whether the host's storage has work: more than `dirty_limit` bytes dirty or under
    writeback in the page cache, or a request in flight on any block device."""
    dirty = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(("Dirty:", "Writeback:")):
                dirty += int(line.split()[1]) * 1024
    if dirty > dirty_limit:
        return True
    for dev in glob.glob("/sys/block/*/inflight"):
        with contextlib.suppress(OSError, ValueError), open(dev) as f:
            if any(int(x) for x in f.read().split()):
                return True
    return False


def settle(quiet_s: float = 0.3, limit_s: float = 10.0) -> float:
    """Flush the host and wait until its storage has been idle for `quiet_s` (at most
    `limit_s`); the seconds waited. Run before each timed phase, so dirty pages an earlier
    phase left (DCP's async_save does not fsync) are not written back during this one. It
    does not see what a virtual disk's host still does: the save after DCP's async_save
    stayed slow with it; the shuffled schedule (checkpoint.round_order) spreads that out."""
    t0 = time.perf_counter()
    os.sync()
    quiet_since = None
    while time.perf_counter() - t0 < limit_s:
        now = time.perf_counter()
        if storage_busy():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            break
        time.sleep(0.02)
    return time.perf_counter() - t0


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def s3fs():
    from ckptflow.core.storage import filesystem_for

    return filesystem_for("s3://x")


def stored_bytes(uri: str) -> int:
    if uri.startswith("s3://"):
        return int(s3fs().du(uri[5:], total=True))
    if os.path.isfile(uri):
        return os.path.getsize(uri)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(uri) for f in files)


def remove(uri: str) -> None:
    """Delete a file or folder, local or on S3 (missing is fine)."""
    import shutil

    if uri.startswith("s3://"):
        fs = s3fs()
        if fs.exists(uri[5:]):
            fs.rm(uri[5:], recursive=True)
    elif os.path.isdir(uri):
        shutil.rmtree(uri)
    elif os.path.exists(uri):
        os.remove(uri)
