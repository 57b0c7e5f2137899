"""A runner process that is interrupted (Ctrl-C, SIGTERM) leaves nothing of its pods; one that
is SIGKILLed leaves them to `sweep`, which removes them all (processes included)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from ckptflow.workflows.runner.pods import Node, available, leftovers, sweep

WHY = available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")

# The runners' Nodes take a prefix of their own: any Node made on this host sweeps what dead
# owners left under the default one (by design). Under xdist (CI, once) the killed runner's
# leftovers were gone 0.2 s after the kill, before this test's own sweep could be checked; a
# Node made in a loop beside it does the same (default prefix: fails; this prefix: passes).
PREFIX = "ckt"
# A runner: a Node with two sleeping pods; prints what it made, then waits to be stopped.
RUNNER = """
import json, os, sys, time
from ckptflow.workflows.runner.pods import Node, Volume

def run(node):
    pods = [
        node.start_pod(
            f"p{i}", ["sleep", "600"], {"PATH": "/usr/bin:/bin"}, "/",
            log_path=os.path.join(sys.argv[1], f"p{i}.log"),
            volumes=[Volume("/cache", memory=True, size_limit=1 << 20)],
            memory_limit="64Mi",
        )
        for i in range(2)
    ]
    netns = [os.stat(f"/proc/{p.pid}/ns/net").st_ino for p in pods]
    print(json.dumps({"tag": node.tag, "pids": [p.pid for p in pods], "netns": netns}), flush=True)
    time.sleep(600)

if sys.argv[2] == "with":
    with Node(prefix=sys.argv[3], sweep_first=False) as node:
        run(node)
else:  # no `with`: only the atexit hook can clean up
    run(Node(prefix=sys.argv[3], sweep_first=False))
"""


@pytest.fixture
def start_runner(tmp_path):
    """Start runners; any still running at the end is interrupted (so it cleans up)."""
    procs = []

    def start(style: str) -> tuple[subprocess.Popen, dict]:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(tmp_path), style, PREFIX],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            pytest.fail(f"the runner did not start: {proc.communicate()[1][-2000:]}")
        made = json.loads(line)
        found = leftovers(made["tag"])
        assert made["tag"] + "b" in found["links"] and found["cgroups"] and found["mounts"]
        assert all(os.path.exists(f"/proc/{pid}") for pid in made["pids"])
        return proc, made

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


def _ticks_since_boot() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def live_net_namespaces(started_before: int | None = None) -> set[int]:
    """The network namespaces live processes are in; with `started_before` (clock ticks since
    boot), only those of processes started before then.

    A freed namespace's inode number is the next one the kernel hands out: under xdist a pod
    of another test, started after this runner was stopped, was found in the runner's pod's
    inode (CI, once). A process of this runner's pods was started before it was stopped."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ino = os.stat(f"/proc/{pid}/ns/net").st_ino
            with open(f"/proc/{pid}/stat") as f:  # field 22: the start time (after the comm)
                started = int(f.read().rsplit(")", 1)[1].split()[19])
            if started_before is None or started < started_before:
                out.add(ino)
    return out


def assert_nothing_left(made: dict, stopped: int) -> None:
    """Nothing of the runner's pods is left; `stopped`: when it was stopped (ticks)."""
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in made["pids"]):
        assert time.monotonic() < deadline, "a pod process survived"
        time.sleep(0.05)
    found = leftovers(made["tag"])
    assert not any(found.values()), found
    assert not set(made["netns"]) & live_net_namespaces(started_before=stopped)


@pytest.mark.parametrize(("sig", "style"), [(signal.SIGINT, "atexit"), (signal.SIGTERM, "with")])
def test_an_interrupted_runner_cleans_up(start_runner, sig, style):
    proc, made = start_runner(style)
    stopped = _ticks_since_boot()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert "teardown" not in err, err
    assert_nothing_left(made, stopped)


def test_a_killed_runner_is_swept(start_runner):
    proc, made = start_runner("with")
    proc.kill()
    proc.wait(timeout=30)
    time.sleep(0.2)
    found = leftovers(made["tag"])
    assert found["links"] and found["cgroups"] and found["mounts"] and found["state"]
    assert all(os.path.exists(f"/proc/{pid}") for pid in made["pids"])  # pods outlive it
    stopped = _ticks_since_boot()
    removed = sweep(PREFIX)
    assert any(made["tag"] in r for r in removed)
    assert_nothing_left(made, stopped)


def test_sweep_spares_live_nodes():
    with Node() as node:
        sweep()
        assert leftovers(node.tag)["links"] == [node.bridge.name]
