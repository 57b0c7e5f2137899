"""Local processes for container/script templates: spawn, capture, probe, and kill for sure.

Each process runs in its own session (process group), so stopping it also stops whatever it
started (a shell's children, torchrun's workers). The registry knows every live process, so a
Ctrl-C, a deadline or an exception in the runner leaves nothing running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

__all__ = ["PUMP_CHUNK", "Proc", "ProcessRegistry", "probe_once", "pump", "stop_group"]

RESULT_LIMIT = 1 << 20  # stdout kept for outputs.result; more is logged but not kept
PUMP_CHUNK = 1 << 16  # the most a pump reads at once: its memory, whatever the newlines


def pump(stream, write, kept: bytearray | None, lock) -> None:
    """Copy a pipe to `write` (the log) in reads of at most PUMP_CHUNK bytes, keeping its first
    RESULT_LIMIT bytes in `kept` (stdout for outputs.result; None: stderr), then close it.
    Bounded in bytes, not lines: one 150 MiB line read by readline() was held whole (477 MiB
    of runner memory, a 157 MB status.json). Both Proc and the pods' Pod pump through it."""
    while True:
        chunk = stream.read1(PUMP_CHUNK)
        if not chunk:
            break
        with lock:
            write(chunk)
            if kept is not None and len(kept) < RESULT_LIMIT:
                kept.extend(chunk[: RESULT_LIMIT - len(kept)])
    stream.close()


def stop_group(popen: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process group `popen` leads, SIGKILL it after `grace` seconds, and SIGKILL
    the group once more when the leader is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    # A process that ignored SIGTERM left children in its group: make sure they go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)


class Proc:
    """One running process with stdout and stderr copied to a log file (stdout also kept)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
        self.log = open(log_path, "ab", buffering=0)  # noqa: SIM115 - closed in finish()
        self._lock = threading.Lock()
        self.stdout = bytearray()
        try:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except BaseException:
            self.log.close()
            raise
        self._readers = [
            threading.Thread(target=self._pump, args=(self.popen.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.popen.stderr, False), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _pump(self, stream, keep: bool) -> None:
        pump(stream, self.log.write, self.stdout if keep else None, self._lock)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, then SIGKILL it after `grace` seconds."""
        stop_group(self.popen, grace)

    def finish(self) -> str:
        """Wait for the output pipes to drain; return stdout as text."""
        for t in self._readers:
            t.join(timeout=5)
        self.log.close()
        return self.stdout.decode("utf-8", errors="replace")


class ProcessRegistry:
    """Every live process of a run, so all of them can be stopped at once."""

    def __init__(self, grace: float = 3.0) -> None:
        self.grace = grace
        self._live: set[Proc] = set()
        self._lock = threading.Lock()
        self._closed = False

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log_path: str) -> Proc:
        with self._lock:
            if self._closed:
                raise RuntimeError("the run is stopping; no new processes")
            proc = Proc(argv, env, cwd, log_path)
            self._live.add(proc)
            return proc

    def add(self, proc) -> None:
        """Register a process started elsewhere (a pod: same interface); RuntimeError once the
        run is stopping, so nothing started late escapes stop_all()."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the run is stopping; no new processes")
            self._live.add(proc)

    def release(self, proc: Proc) -> None:
        with self._lock:
            self._live.discard(proc)

    def stop_all(self) -> None:
        """Stop every live process (in parallel) and refuse new ones."""
        with self._lock:
            self._closed = True
            procs = list(self._live)
        threads = [threading.Thread(target=p.stop, args=(self.grace,)) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _port(value, ports: list[dict]) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for p in ports:
        if p.get("name") == value:
            return int(p["containerPort"])
    raise ValueError(f"probe port {value!r} is neither a number nor a named container port")


def probe_once(probe: dict, ports: list[dict], env: dict[str, str], cwd: str) -> bool:
    """Run a readiness probe once against the local process (host 127.0.0.1)."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    if "tcpSocket" in probe:
        spec = probe["tcpSocket"]
        try:
            with socket.create_connection(
                (spec.get("host") or "127.0.0.1", _port(spec["port"], ports)), timeout=timeout
            ):
                return True
        except OSError:
            return False
    if "httpGet" in probe:
        spec = probe["httpGet"]
        scheme = str(spec.get("scheme") or "HTTP").lower()
        url = f"{scheme}://{spec.get('host') or '127.0.0.1'}:{_port(spec['port'], ports)}"
        req = urllib.request.Request(url + (spec.get("path") or "/"))
        for h in spec.get("httpHeaders") or []:
            req.add_header(h["name"], h["value"])
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return 200 <= resp.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False
    if "exec" in probe:
        try:
            done = subprocess.run(
                probe["exec"]["command"],
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0
    return True


def wait_ready(probe: dict, proc: Proc, ports: list[dict], env, cwd, should_stop) -> bool:
    """Poll a readiness probe until it passes; False if the process ended or we must stop."""
    start_at = time.monotonic() + float(probe.get("initialDelaySeconds") or 0)
    while time.monotonic() < start_at and proc.poll() is None and not should_stop():
        time.sleep(0.05)
    while proc.poll() is None and not should_stop():
        if probe_once(probe, ports, env, cwd):
            return True
        time.sleep(0.1)
    return False
