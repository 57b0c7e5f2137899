"""One pod: a task in its own network, UTS and mount namespaces, in its own cgroups.

`Pod` has the interface of the runner's `process.Proc` (`pid`, `poll()`, `stop(grace)`,
`finish()`, `stdout`), so the runner can use either, plus `ip`, `path()` (where the node reads
a file the pod wrote to /tmp, /dev/shm or a volume, e.g. an output parameter, after it ended),
`oom_killed()` and `release()` (the pod is gone: processes, cgroups, veth, mounts, files).

How it starts (see podinit.py for the inside): the node prepares the pod's directory (a tmpfs
for /tmp and /dev/shm each, emptyDir volumes, /etc/hosts, /etc/resolv.conf), starts
`unshare --net --uts --mount python podinit.py` in a new session, waits until the namespaces
exist, moves the process into the pod's cgroups, wires its network, then sends the spec; the
pod builds its root filesystem and execs the task.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

from ckptflow.workflows.runner.pods import net, podinit
from ckptflow.workflows.runner.pods.check import tool
from ckptflow.workflows.runner.pods.podspec import Volume
from ckptflow.workflows.runner.process import RESULT_LIMIT, pump, stop_group

__all__ = ["Pod", "PodError", "RESULT_LIMIT"]

READY_TIMEOUT = 30.0  # for the pod's python to start (a busy machine)
START_TIMEOUT = 60.0  # for the pod to build its filesystem and exec
PODINIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "podinit.py")


class PodError(RuntimeError):
    """A pod could not be started; the message names the pod and the cause."""


def _hosts(ip: str, hostname: str) -> str:
    # Only this pod: other pods' names must not resolve (there is no cluster DNS).
    return (
        f"# ckptflow pod {hostname}: this pod only, no cluster DNS\n"
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{ip}\t{hostname}\n"
    )


# No nameserver line: the resolver asks the pod's own loopback, which refuses at once, so a
# name that is not in /etc/hosts fails fast and no DNS query ever leaves the pod.
RESOLV_CONF = "# ckptflow pod: no DNS service; names resolve from /etc/hosts only\noptions timeout:1 attempts:1\n"


class Pod:
    """A started pod; see the module docstring."""

    def __init__(self, name: str, ip: str, hostname: str, directory: str, log_path: str) -> None:
        self.name, self.ip, self.hostname, self.dir = name, ip, hostname, directory
        self.log_path = log_path
        self.log = open(log_path, "ab", buffering=0)  # noqa: SIM115 - closed in finish()
        self.stdout = bytearray()
        self.popen: subprocess.Popen | None = None
        self.cgroups = None
        self.veth: str | None = None
        self.host_mounts: list[str] = []  # on the node, detached in release()
        self.paths: dict[str, str] = {}  # mountPath in the pod -> its storage on the node
        self.upper: str | None = None  # the tmpfs holding what the task writes in its `/`
        self.on_release = None
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._finished = False
        self._released = False
        self._oom = 0

    # --- the process.Proc interface -------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit status as Popen gives it (-9: killed by SIGKILL, e.g. the OOM killer)."""
        return self.popen.poll()

    @property
    def exit_status(self) -> int | None:
        """The exit code a Kubernetes node reports: 128 + signal for a killed process (137)."""
        rc = self.poll()
        return 128 - rc if rc is not None and rc < 0 else rc

    def stop(self, grace: float) -> None:
        """SIGTERM the pod's process group, SIGKILL it after `grace` s, then every process
        left in the pod (also those that left the group). A frozen pod (a lost node,
        nodelifecycle.py) is killed at once: it cannot run a grace period, nor may it run again."""
        if self.cgroups is not None and self.cgroups.frozen():
            self._kill_rest()  # SIGKILL, then thawed (cgroups.kill_all)
            return
        stop_group(self.popen, grace)
        self._kill_rest()

    def finish(self) -> str:
        """Wait for the output pipes to drain; return stdout as text. As on a node, processes
        the task left behind end with it (they would keep the pipes open)."""
        if self.popen is not None and self.popen.poll() is not None:
            self._kill_rest()
        for t in self._readers:
            t.join(timeout=5)
        with self._lock:
            if not self._finished:
                self._finished = True
                self.log.close()
        return self.stdout.decode("utf-8", errors="replace")

    # --- pod extras -----------------------------------------------------------------------
    def path(self, pod_path: str) -> str | None:
        """Where a path of the pod's /tmp, /dev/shm or a volume lies on the node (readable
        after the pod ended, until release()); None for a path outside them. PodError for a
        path that a symlink the pod made leads out of its volume (say, to the node's files)."""
        pod_path = os.path.normpath(pod_path)
        for target in sorted(self.paths, key=len, reverse=True):
            if pod_path == target or pod_path.startswith(target.rstrip("/") + "/"):
                storage = self.paths[target]
                found = storage + pod_path[len(target.rstrip("/")) :]
                real, top = os.path.realpath(found), os.path.realpath(storage)
                if real != top and not real.startswith(top.rstrip("/") + "/"):
                    raise PodError(f"pod {self.name}: {pod_path} links out of its volume")
                return found
        return self._in_root(pod_path)

    def _in_root(self, pod_path: str) -> str | None:
        """Where a file the task wrote in its own `/` (the overlay's upper layer) lies on the
        node, or None (not written there: the host's file, which the pod sees below)."""
        if self.upper is None:
            return None
        top = os.path.join(self.upper, "upper")
        found = top + pod_path
        if not os.path.lexists(found):
            return None
        real = os.path.realpath(found)
        if real != top and not real.startswith(top + "/"):
            raise PodError(f"pod {self.name}: {pod_path} links out of its root")
        return found

    def enter_argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside the pod's namespaces (e.g. an exec readiness probe)."""
        ns = ["--net", "--mount", "--uts"]
        return [tool("nsenter"), f"--target={self.pid}", *ns, "--", *argv]

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of the pod (over its memory limit)."""
        if self.cgroups is not None and not self._released:
            self._oom = max(self._oom, self.cgroups.oom_kills())
        return self._oom > 0

    def release(self) -> None:
        """End the pod for good: kill what runs, remove its cgroups, veth, mounts and files."""
        with self._lock:
            if self._released:
                return
            self._released = True
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self._kill_rest()
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        self.finish()
        quietly(self._teardown)
        if self.on_release is not None:
            self.on_release(self)

    def _teardown(self) -> None:
        if self.cgroups is not None:
            self._oom = max(self._oom, self.cgroups.oom_kills())
            self.cgroups.remove()
        if self.veth:
            net.delete_link(self.veth)  # normally gone with the pod's netns already
        for target in reversed(self.host_mounts):
            with contextlib.suppress(OSError):
                podinit.detach(target)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_rest(self) -> None:
        if self.cgroups is not None:
            self.cgroups.kill_all()

    # --- starting -------------------------------------------------------------------------
    def prepare(self, volumes: list[Volume]) -> list[dict]:
        """Create the pod's storage on the node; return the mounts for podinit (in order).
        The writable layer of its `/` is a tmpfs (`upper`, podinit.overlay_root), gone with
        the pod as a container's writable layer is."""
        os.makedirs(os.path.join(self.dir, "root"))
        self.upper = os.path.join(self.dir, "rootfs")
        os.makedirs(self.upper, mode=0o700)
        podinit.tmpfs(self.upper, mode="0700")
        self.host_mounts.append(self.upper)
        targets = {v.target for v in volumes}
        if len(targets) < len(volumes):
            raise PodError(f"pod {self.name}: two volumes share a mountPath")
        mounts = []
        defaults = [Volume("/tmp", memory=True, name="tmp")]
        defaults.append(Volume("/dev/shm", memory=True, name="shm"))
        own = [v for v in defaults if v.target not in targets] + list(volumes)
        own.sort(key=lambda v: v.target.count("/"))  # a parent before what is mounted in it
        for i, vol in enumerate(own):
            source = vol.host_path or os.path.join(self.dir, "vol", str(i))
            if vol.host_path is None:
                os.makedirs(source)
                os.chmod(source, 0o777)  # as Kubernetes makes an emptyDir
                if vol.memory:
                    podinit.tmpfs(source, vol.size_limit)
                    self.host_mounts.append(source)
            elif not os.path.exists(source):
                raise PodError(
                    f"volume {vol.name or vol.target}: host path {source} does not exist"
                )
            self.paths[vol.target] = source
            mounts.append({"source": source, "target": vol.target, "read_only": vol.read_only})
        for name, text in (("hosts", _hosts(self.ip, self.hostname)), ("resolv.conf", RESOLV_CONF)):
            path = os.path.join(self.dir, name)
            with open(path, "w") as f:
                f.write(text)
            mounts.append({"source": path, "target": f"/etc/{name}", "read_only": True})
        return mounts

    def spawn(self) -> tuple[int, int]:
        """Start podinit in new namespaces and session; return (status fd, go fd) to talk to it."""
        status_r, status_w = os.pipe()
        go_r, go_w = os.pipe()
        argv = [tool("unshare"), "--net", "--uts", "--mount", "--propagation", "private", "--"]
        argv += [sys.executable, "-I", "-S", "-B", PODINIT, str(status_w), str(go_r)]
        try:
            self.popen = subprocess.Popen(
                argv,
                env={"PATH": os.environ.get("PATH") or os.defpath},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(status_w, go_r),
            )
        except BaseException:
            for fd in (status_r, go_w):
                os.close(fd)
            raise
        finally:
            os.close(status_w)
            os.close(go_r)
        self._readers = [
            threading.Thread(target=self._pump, args=(self.popen.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.popen.stderr, False), daemon=True),
        ]
        for t in self._readers:
            t.start()
        return status_r, go_w

    def _pump(self, stream, keep: bool) -> None:
        pump(stream, self._write_log, self.stdout if keep else None, self._lock)

    def _write_log(self, data: bytes) -> None:  # under self._lock (process.pump)
        if not self._finished:
            self.log.write(data)

    def go(self, status: int, go: int, spec: dict) -> None:
        """Send the spec; return once the task runs, PodError with the pod's reason if not."""
        try:
            os.write(go, json.dumps(spec).encode())  # podinit reads while we write
        except BrokenPipeError:
            pass  # podinit died; its reason (if any) is on the status pipe
        finally:
            os.close(go)
        # EOF without a word: the exec worked (the status pipe closes on exec).
        reason = _read_until_eof(status, START_TIMEOUT).decode("utf-8", "replace").strip()
        if reason:
            raise PodError(f"pod {self.name}: {reason}")

    def wait_ready(self, status: int) -> None:
        """Wait for podinit's `R` (its namespaces exist); PodError if it ends or is too slow."""
        ready, _, _ = select.select([status], [], [], READY_TIMEOUT)
        if ready and os.read(status, 1) == b"R":
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        rc = self.popen.wait()
        self.finish()
        if not ready:
            raise PodError(f"pod {self.name}: its init did not start within {READY_TIMEOUT:.0f}s")
        raise PodError(f"pod {self.name}: unshare failed (exit {rc}): {_last_line(self.log_path)}")


def _last_line(path: str) -> str:
    """The last line of a log (what a failing tool said last)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


def _read_until_eof(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                raise PodError(f"the pod did not start its task within {timeout:.0f}s")
            chunk = os.read(fd, 4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def quietly(fn) -> None:
    """Run a teardown step; a failure is reported on stderr, never stops the rest."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - teardown must go on
        print(f"ckptflow pods: teardown: {exc}", file=sys.stderr)
