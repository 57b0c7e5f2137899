"""cgroup v1 for pods: a memory cgroup for every pod (its limit, and the list of every process
it ever started, so none survives the pod), a cpu cgroup when it has a CPU limit, and a freezer
cgroup where the kernel has one (a node lost silently: its pods stop where they are, unkilled).

A Node's cgroups sit below the runner's own cgroup of each controller (as a kubelet's pods sit
below its slice), so whatever limits the runner has also bound its pods:
`<memory mount>/<runner's path>/<node tag>/<pod suffix>`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

__all__ = ["CGROUP_ROOT", "NodeCgroups", "PodCgroups", "problem", "tagged_dirs", "thaw"]

CGROUP_ROOT = "/sys/fs/cgroup"
CPU_PERIOD_US = 100_000
MAX_WALK_DEPTH = 8  # how deep sweep looks for leftovers in a hierarchy


def mount_of(controller: str) -> str:
    """The v1 hierarchy of a controller (`/sys/fs/cgroup/memory`)."""
    return os.path.join(CGROUP_ROOT, controller)


def own_path(controller: str) -> str:
    """This process's cgroup (relative path) in a v1 controller's hierarchy; '/' if unknown."""
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return path
    return "/"


def problem() -> str | None:
    """Why pods cannot have cgroups here (one line), or None."""
    mem = mount_of("memory")
    if not os.path.exists(os.path.join(mem, "memory.limit_in_bytes")):
        return f"no cgroup v1 memory controller at {mem} (cgroup v2 is not supported yet)"
    if not os.access(mem, os.W_OK):
        return f"{mem} is not writable (pods need root with write access to cgroups)"
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _pids(directory: str) -> list[int]:
    try:
        with open(os.path.join(directory, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        # a cgroup removed (ENOENT) or being removed (ENODEV) while it is read holds nobody:
        # killing its pod must not fail because the runner released it first
        return []


def thaw(directory: str) -> None:
    """Let a frozen freezer cgroup run again (nothing if it is not one, or is gone)."""
    state = os.path.join(directory, "freezer.state")
    if os.path.exists(state):
        with contextlib.suppress(OSError):
            _write(state, "THAWED")


def kill_all(directories: list[str], timeout: float = 5.0) -> bool:
    """SIGKILL every process in the cgroups until they are empty; False if some would not go.
    A frozen freezer cgroup is thawed after the signals are sent: a frozen process never dies,
    and one thawed first could run on (the signal is pending when it wakes, so it only dies)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {p for d in directories for p in _pids(d)}
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for d in directories:
            thaw(d)
        time.sleep(0.01)


def remove_dir(directory: str, timeout: float = 3.0) -> None:
    """rmdir a cgroup (children first), retrying while the kernel still counts exiting tasks."""
    if not os.path.isdir(directory):
        return
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            remove_dir(entry.path, timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            kill_all([directory], timeout=0.5)
            time.sleep(0.02)


class PodCgroups:
    """The cgroups of one pod."""

    def __init__(self, memory: str, cpu: str | None, freezer: str | None = None) -> None:
        self.memory = memory
        self.cpu = cpu
        self.freezer = freezer
        self.dirs = [memory] + ([cpu] if cpu else []) + ([freezer] if freezer else [])

    def join(self, pid: int) -> None:
        """Move a process (the pod's first one, before it runs anything) into the cgroups."""
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def pids(self) -> set[int]:
        """Every process now in the pod."""
        return {p for d in self.dirs for p in _pids(d)}

    def oom_kills(self) -> int:
        """How many processes of the pod the kernel's OOM killer has killed."""
        try:
            with open(os.path.join(self.memory, "memory.oom_control")) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill_all(self, timeout: float = 5.0) -> bool:
        return kill_all(self.dirs, timeout)

    def set_cpu_limit(self, cpus: float, period_us: int = CPU_PERIOD_US) -> None:
        """Change the pod's CFS quota while it runs (a throttled node, for tests): `cpus` per
        `period_us`; a short period spreads the throttling evenly over the pod's work. Needs
        a pod started with a CPU limit (it has a cpu cgroup)."""
        if self.cpu is None:
            raise OSError("the pod has no cpu cgroup: start it with a CPU limit")
        _write(os.path.join(self.cpu, "cpu.cfs_quota_us"), "-1")  # a period below the quota
        _write(os.path.join(self.cpu, "cpu.cfs_period_us"), str(period_us))
        _write(os.path.join(self.cpu, "cpu.cfs_quota_us"), str(max(1000, int(cpus * period_us))))

    def freeze(self, timeout: float = 5.0) -> None:
        """Stop every process of the pod where it is (cgroup v1 freezer: no signal, no exit, its
        sockets stay open), as a node whose kernel hangs or loses power leaves them. OSError if
        the pod has no freezer cgroup or does not freeze within `timeout`."""
        if self.freezer is None:
            raise OSError("the pod has no freezer cgroup (no cgroup v1 freezer controller)")
        state = os.path.join(self.freezer, "freezer.state")
        _write(state, "FROZEN")
        deadline = time.monotonic() + timeout
        while True:  # FREEZING until every task stopped
            with open(state) as f:
                if f.read().strip() == "FROZEN":
                    return
            if time.monotonic() > deadline:
                raise OSError(f"{self.freezer}: did not freeze within {timeout:.0f}s")
            time.sleep(0.01)

    def frozen(self) -> bool:
        """Whether the pod is frozen (or freezing)."""
        if self.freezer is None:
            return False
        try:
            with open(os.path.join(self.freezer, "freezer.state")) as f:
                return f.read().strip() != "THAWED"
        except OSError:
            return False

    def remove(self) -> None:
        """Kill what is left (thawed first, see kill_all) and remove the cgroups."""
        self.kill_all()
        for d in self.dirs:
            remove_dir(d)


class NodeCgroups:
    """The parent cgroups of a Node's pods."""

    def __init__(self, tag: str) -> None:
        self.memory = self._parent("memory", tag)
        os.mkdir(self.memory)
        self.cpu: str | None = None
        self.freezer: str | None = None
        self.tag = tag

    @staticmethod
    def _parent(controller: str, tag: str) -> str:
        base = mount_of(controller) + own_path(controller).rstrip("/")
        return os.path.join(base, tag)

    def pod(self, suffix: str, memory_limit: int | None, cpu_limit: float | None) -> PodCgroups:
        """Create a pod's cgroups with its limits (cpu: a CFS quota of `cpu_limit` CPUs)."""
        memory = os.path.join(self.memory, suffix)
        os.mkdir(memory)
        cpu = freezer = None
        try:
            if self._freezer_parent() is not None:
                freezer = os.path.join(self.freezer, suffix)
                os.mkdir(freezer)
            if memory_limit is not None:
                _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_limit))
                swap = os.path.join(memory, "memory.memsw.limit_in_bytes")
                if os.path.exists(swap):  # with swap, a limit alone swaps instead of OOM-killing
                    _write(swap, str(memory_limit))
            if cpu_limit is not None:
                cpu = os.path.join(self._cpu_parent(), suffix)
                os.mkdir(cpu)
                _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
                quota = max(1000, int(cpu_limit * CPU_PERIOD_US))
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(quota))
        except BaseException:
            PodCgroups(memory, cpu, freezer).remove()
            raise
        return PodCgroups(memory, cpu, freezer)

    def _freezer_parent(self) -> str | None:
        """The node's freezer cgroup, made on first use; None without a v1 freezer controller."""
        if self.freezer is None:
            if not os.path.exists(os.path.join(mount_of("freezer"), "cgroup.procs")):
                return None
            path = self._parent("freezer", self.tag)
            os.makedirs(path, exist_ok=True)
            self.freezer = path
        return self.freezer

    def _cpu_parent(self) -> str:
        if self.cpu is None:
            if not os.path.exists(os.path.join(mount_of("cpu"), "cpu.cfs_quota_us")):
                raise OSError("cpu limits need the cgroup v1 cpu controller (cpu.cfs_quota_us)")
            path = self._parent("cpu", self.tag)
            os.makedirs(path, exist_ok=True)
            self.cpu = path
        return self.cpu

    def remove(self) -> None:
        """Remove the node's cgroups (and any pod cgroups still in them)."""
        for d in (self.memory, self.cpu, self.freezer):
            if d:
                remove_dir(d)


def tagged_dirs(is_ours) -> list[str]:
    """Every cgroup directory in the memory and cpu hierarchies whose name `is_ours(name)`."""
    found = []
    for controller in ("memory", "cpu", "freezer"):
        top = mount_of(controller)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, _ in os.walk(top):
            depth = dirpath[len(top) :].count("/")
            for name in list(dirnames):
                if is_ours(name):
                    found.append(os.path.join(dirpath, name))
                    dirnames.remove(name)  # its children go with it
            if depth >= MAX_WALK_DEPTH:
                dirnames.clear()
    return found
