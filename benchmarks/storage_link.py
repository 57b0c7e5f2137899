"""A storage link of its own for one benchmark process: its disk reads capped at a bandwidth.

On a cluster every rank's host reaches the checkpoint store over its own link (a NIC to S3, a
mount of a shared file system), so a cooperative load, where each of M ranks reads 1/M of the
checkpoint, gets M links' worth of bandwidth. Ranks simulated on one machine share one disk and
one page cache instead, which hides exactly what cooperation is for. Here each process joins a
cgroup of its own whose block-I/O reads from the disk holding the checkpoint are throttled
(cgroup v1 `blkio.throttle.read_bps_device`, v2 `io.max rbps=`), with the page cache dropped
before the load: every byte a rank needs comes over its own capped link, or from a peer.

Root only, Linux only; `capped` raises LinkUnavailable naming why (never a silent unthrottled run).
"""

from __future__ import annotations

import contextlib
import os

CGROUP_ROOT = "/sys/fs/cgroup"


class LinkUnavailable(RuntimeError):
    """This machine cannot cap a process's disk reads (no cgroup block-I/O controller, not
    root, or the path is not on a block device)."""


def disk_of(path: str, sys_root: str = "/sys") -> str:
    """'major:minor' of the whole disk holding `path` (a partition's parent disk: the
    throttle applies to disks, not partitions)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    entry = os.path.join(sys_root, "dev", "block", dev)
    if not os.path.exists(entry):
        raise LinkUnavailable(f"{path} is not on a block device ({dev}): nothing to throttle")
    if os.path.exists(os.path.join(entry, "partition")):
        with open(os.path.join(os.path.realpath(entry), "..", "dev")) as f:
            dev = f.read().strip()
    return dev


def _layout(cgroup_root: str) -> tuple[str, str] | None:
    """(folder new cgroups go in, file to write) for v1 blkio or v2 io, or None."""
    v1 = os.path.join(cgroup_root, "blkio")
    if os.path.exists(os.path.join(v1, "blkio.throttle.read_bps_device")):
        return v1, "blkio.throttle.read_bps_device"
    controllers = os.path.join(cgroup_root, "cgroup.subtree_control")
    if os.path.exists(controllers):
        with open(controllers) as f:
            if "io" in f.read().split():
                return cgroup_root, "io.max"
    return None


def limit_line(knob: str, disk: str, bytes_per_s: int) -> str:
    """What the knob's file takes for a read cap of `bytes_per_s` on `disk`."""
    if knob == "io.max":
        return f"{disk} rbps={bytes_per_s}\n"
    return f"{disk} {bytes_per_s}\n"


@contextlib.contextmanager
def capped(name: str, path: str, mib_s: float, cgroup_root: str = CGROUP_ROOT, sys_root="/sys"):
    """Within the block, this process's reads from the disk under `path` are capped at `mib_s`
    MiB/s (it sits in cgroup `name`); afterwards it is back in the cgroup it came from and `name` is
    removed (a crash leaves an empty cgroup behind, which holds nothing)."""
    where = _layout(cgroup_root)
    if where is None:
        raise LinkUnavailable(
            f"no cgroup block-I/O controller under {cgroup_root} (v1 blkio or v2 io)"
        )
    folder = os.path.join(where[0], name)
    disk = disk_of(path, sys_root)
    home = os.path.join(where[0], _own_cgroup(where[1] == "io.max").lstrip("/"))
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, where[1]), "w") as f:
            f.write(limit_line(where[1], disk, int(mib_s * (1 << 20))))
        _move(folder)
    except PermissionError as exc:
        raise LinkUnavailable(f"cannot create cgroup {folder}: run the benchmark as root") from exc
    try:
        yield folder
    finally:
        _move(home)
        os.rmdir(folder)


def _own_cgroup(v2: bool, proc: str = "/proc/self/cgroup") -> str:
    """This process's cgroup in the block-I/O hierarchy ("/" when not found)."""
    with open(proc) as f:
        for line in f:
            _, controllers, where = line.rstrip("\n").split(":", 2)
            if (v2 and controllers == "") or (not v2 and "blkio" in controllers.split(",")):
                return where
    return "/"


def _move(folder: str) -> None:
    with open(os.path.join(folder, "cgroup.procs"), "w") as f:
        f.write(f"{os.getpid()}\n")
