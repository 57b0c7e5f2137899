"""A Node: what one runner run needs to start pods on this machine, and its teardown.

A Node owns a state directory `<state root>/<tag>` (bind-mounted on itself and made private, so
the mounts in it propagate nowhere), a bridge with the node address of its own subnet, and the
parent cgroups of its pods. `close()` (also on `with` exit, at interpreter exit, and on SIGTERM,
which it turns into KeyboardInterrupt where nobody handles SIGTERM) kills every pod and removes
all of it; `sweep` at start removes what crashed earlier runs left.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import threading
from collections.abc import Sequence

from ckptflow.workflows.runner.pods import net, podinit
from ckptflow.workflows.runner.pods.cgroups import NodeCgroups
from ckptflow.workflows.runner.pods.check import available
from ckptflow.workflows.runner.pods.naming import PREFIX, new_tag, pod_suffix, start_time
from ckptflow.workflows.runner.pods.pod import READY_TIMEOUT, START_TIMEOUT, Pod, PodError, quietly
from ckptflow.workflows.runner.pods.podspec import Volume, check_hostname, parse_cpu, parse_quantity
from ckptflow.workflows.runner.pods.sweep import OWNER_FILE, STATE_ROOT, sweep

__all__ = ["Node"]


def _sigterm(signum, frame):  # SIGTERM unwinds like Ctrl-C, so `with`/finally clean up
    raise KeyboardInterrupt


def _install_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt, unless someone already handles it."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)


POD_PRIVATE = ("/tmp", "/dev/shm")  # a pod's own, fresh mounts


def hidden_paths(paths) -> list[str]:
    """Of `paths`, those a pod's private /tmp or /dev/shm would hide (not those mounts
    themselves), children of another listed path dropped: what must be bound into the pod."""
    real = sorted({os.path.realpath(p) for p in paths})
    hidden = [
        p for p in real if p not in POD_PRIVATE and any(p.startswith(d + "/") for d in POD_PRIVATE)
    ]
    return [p for p in hidden if not any(p.startswith(q + "/") for q in hidden)]


def runtime_volumes(taken) -> list[Volume]:
    """This interpreter and this package, bound read-only at their own path where the pod's
    private /tmp would hide them: a pod runs the runner's Python (as a node runs its image's),
    so a checkout or venv under /tmp must not vanish inside the pod ("No such file")."""
    here = os.path.dirname(os.path.abspath(__file__))
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    paths = [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), package_root]
    return [
        Volume(p, host_path=p, read_only=True, name="runtime")
        for p in hidden_paths(paths)
        if p not in taken and not any(p.startswith(t.rstrip("/") + "/") for t in taken)
    ]


class Node:
    """The pods of one run; see the module docstring. Use as a context manager."""

    def __init__(
        self,
        *,
        cidr: str = net.POD_CIDR,
        subnet_bits: int = net.SUBNET_BITS,
        state_root: str = STATE_ROOT,
        prefix: str = PREFIX,
        sweep_first: bool = True,
    ) -> None:
        why = available()
        if why:
            raise PodError(why)
        if sweep_first:
            sweep(prefix, state_root)
        self.tag = new_tag(prefix)
        self.state_root = state_root
        self._cidr, self._bits = cidr, subnet_bits
        self.dir = os.path.join(state_root, self.tag)
        self._lock = threading.Condition()
        self._pods: set[Pod] = set()
        self._next = 0
        self._unused_ips: set[str] = set()
        self._starting = 0
        self._closed = self._done = False
        self._mounted = False
        self.cgroups = self.bridge = None
        atexit.register(self.close)
        _install_sigterm()
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        os.makedirs(self.dir, mode=0o700)
        with open(os.path.join(self.dir, OWNER_FILE), "w") as f:
            f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
        podinit.bind(self.dir, self.dir, recursive=False)
        self._mounted = True
        podinit.mount("none", self.dir, None, podinit.MS_PRIVATE)
        self.cgroups = NodeCgroups(self.tag)
        self.bridge = net.Bridge(self.tag, self._cidr, self._bits)

    @property
    def address(self) -> str:
        """The node address on the bridge: where shared services listen for pods."""
        return self.bridge.address

    @property
    def subnet(self) -> str:
        """The node's pod subnet (CIDR)."""
        return str(self.bridge.ips.subnet)

    def new_ip(self) -> str:
        """A fresh pod address, for a caller that needs it before the start (the downward API's
        `status.podIP` in the pod's env); pass it to start_pod(ip=...). Never handed out twice."""
        address = str(self.bridge.ips.next())
        with self._lock:
            self._unused_ips.add(address)
        return address

    def _take_ip(self, address: str | None) -> str:
        if address is None:
            return str(self.bridge.ips.next())
        with self._lock:
            if address not in self._unused_ips:
                raise ValueError(f"pod IP {address} was not handed out by new_ip() or is used")
            self._unused_ips.discard(address)
        return address

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_pod(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        *,
        hostname: str | None = None,
        volumes: Sequence[Volume] = (),
        memory_limit: int | str | None = None,
        cpu_limit: float | str | None = None,
        log_path: str,
        ip: str | None = None,
        containers: dict | None = None,
        read_only_root: bool = False,
    ) -> Pod:
        """Start `argv` as a pod with a new IP; PodError (one line) if it cannot start.

        hostname: the pod's hostname (default: `name`). volumes: mounted in order of depth.
        memory_limit: bytes or a quantity (`64Mi`); over it the kernel OOM-kills (exit 137).
        cpu_limit: CPUs or a quantity (`500m`), as a CFS quota. log_path: stdout and stderr.
        ip: an address from new_ip() (default: a new one). containers: the pod's init
        containers and sidecars for podinit (`init`, `sidecars`, `grace`; pod_containers.py).
        read_only_root: the container's `securityContext.readOnlyRootFilesystem` (its `/`
        read-only, its volumes, /tmp and /dev/shm not).
        """
        hostname = check_hostname(hostname or name)
        memory = None if memory_limit is None else parse_quantity(memory_limit, "memory limit")
        cpu = None if cpu_limit is None else parse_cpu(cpu_limit)
        if not argv:
            raise ValueError(f"pod {name}: empty command")
        address = self._take_ip(ip)
        with self._lock:
            if self._closed:
                raise PodError(f"pod {name}: the node is shutting down; no new pods")
            index, self._next = self._next, self._next + 1
            self._starting += 1
        try:
            suffix = pod_suffix(index)
            try:
                pod = Pod(name, address, hostname, self.dir + "/" + suffix, log_path)
            except OSError as exc:  # the log file
                raise PodError(f"pod {name}: {exc}") from exc
            pod.on_release = self._forget
            with self._lock:
                self._pods.add(pod)  # from now on close() stops it, wherever the start is
            try:
                mounts = list(volumes)
                mounts += runtime_volumes({v.target for v in mounts})
                extra = {**(containers or {}), "read_only_root": read_only_root}
                self._build(pod, suffix, list(argv), dict(env), cwd, mounts, memory, cpu, extra)
            except BaseException as exc:
                pod.release()
                if isinstance(exc, (OSError, net.NetError)):
                    raise PodError(f"pod {name}: {exc}") from exc
                raise
            return pod
        finally:
            with self._lock:
                self._starting -= 1
                self._lock.notify_all()

    def _build(self, pod: Pod, suffix, argv, env, cwd, volumes, memory, cpu, containers) -> None:
        mounts = pod.prepare(volumes)
        pod.cgroups = self.cgroups.pod(suffix, memory, cpu)
        status, go = pod.spawn()
        try:
            pod.wait_ready(status)
            pod.cgroups.join(pod.pid)  # before it runs anything of the task
            pod.veth = self.tag + suffix
            net.connect_pod(self.bridge, pod.veth, pod.pid, pod.ip)
            if self._closed:
                raise PodError(f"pod {pod.name}: the node is shutting down")
        except BaseException:
            os.close(go)  # podinit reads EOF and gives up
            os.close(status)
            raise
        spec = {
            "root": os.path.join(pod.dir, "root"),
            "upper": pod.upper,
            "hide": [self.state_root],
            "mounts": mounts,
            "hostname": pod.hostname,
            "cwd": cwd,
            "argv": argv,
            "env": env,
            **(containers or {}),
        }
        pod.go(status, go, spec)

    def _forget(self, pod: Pod) -> None:
        with self._lock:
            self._pods.discard(pod)

    def pods(self) -> list[Pod]:
        """The pods not yet released."""
        with self._lock:
            return list(self._pods)

    def close(self) -> None:
        """Kill every pod and remove the node's bridge, cgroups, mounts and files (idempotent)."""
        with self._lock:
            if self._done:
                return
            self._closed = True
            self._lock.wait_for(lambda: self._starting == 0, READY_TIMEOUT + START_TIMEOUT)
            pods = list(self._pods)
        for pod in pods:
            pod.release()
        if self.cgroups is not None:
            quietly(self.cgroups.remove)
        if self.bridge is not None:
            quietly(self.bridge.delete)
        if self._mounted:
            quietly(lambda: podinit.detach(self.dir))
            self._mounted = False
        shutil.rmtree(self.dir, ignore_errors=True)
        self._done = True
        atexit.unregister(self.close)
