"""Issue 34 point 3: a node lost silently (`--fail-node NODE@SECONDS`) and what Kubernetes and
Argo then do (nodelifecycle.py): the rules one by one, then a run on a two-node profile (root).
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from pathlib import Path

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.cluster import ClusterError, LifecycleSettings, load_profile
from ckptflow.workflows.runner.nodelifecycle import (
    admitted_tolerations,
    argo_marks_pod_deleted,
    eviction_delay,
    node_ready_condition,
    parse_fail_node,
    unreachable_taints,
)
from ckptflow.workflows.runner.pods import Node, available, leftovers

from ckptflow import run_cli

WHY = available()
needs_pods = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
UNREACHABLE = "node.kubernetes.io/unreachable"
PROFILE = """\
nodeMonitorGracePeriod: 2s
nodeMonitorPeriod: 0.5
disableAdmissionPlugins: [DefaultTolerationSeconds]
nodes:
- name: node-a
  allocatable: {cpu: "4", memory: 4Gi}
- name: node-b
  allocatable: {cpu: "4", memory: 4Gi}
"""


@pytest.fixture
def profile(tmp_path: Path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(PROFILE)
    return str(path)


# --- the rules --------------------------------------------------------------------------------


def test_default_toleration_seconds_are_added_unless_the_pod_has_its_own():
    """plugin/pkg/admission/defaulttolerationseconds/admission.go: not-ready and unreachable
    NoExecute for 300 s, each only where the pod has no toleration for that key (or all keys)
    with effect NoExecute (or all effects)."""
    settings = LifecycleSettings()
    added = admitted_tolerations([], settings)
    assert added == (
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    )
    own = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
    assert [t.get("tolerationSeconds") for t in admitted_tolerations([own], settings)] == [5, 300]
    everything = {"operator": "Exists"}  # tolerates every taint: nothing added
    assert admitted_tolerations([everything], settings) == (everything,)
    off = LifecycleSettings(default_tolerations=False)
    assert admitted_tolerations([], off) == ()


def test_eviction_follows_the_smallest_matching_toleration():
    """taint_eviction.go processPodOnNode/getMinTolerationTime."""
    taints = unreachable_taints()
    assert eviction_delay([], taints) == 0.0  # no toleration: at once
    assert eviction_delay(admitted_tolerations([], LifecycleSettings()), taints) == 300.0
    short = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}
    assert eviction_delay([{**short, "tolerationSeconds": 7}], taints) == 7.0
    assert eviction_delay([{**short, "tolerationSeconds": -1}], taints) == 0.0
    assert eviction_delay([short], taints) is None  # tolerates forever
    assert eviction_delay([{**short, "key": "other"}], taints) == 0.0  # does not match


def test_argo_marks_a_missing_pod_only_after_it_is_not_recently_started():
    """operator.go podReconciliation/recentlyStarted (RECENTLY_STARTED_POD_DURATION 10s)."""
    assert not argo_marks_pod_deleted(9.9)
    assert argo_marks_pod_deleted(10.1)


def test_a_node_is_ready_until_the_grace_period_has_passed():
    """node_lifecycle_controller.go tryUpdateNodeHealth."""
    assert node_ready_condition(40.0, 50.0) is None
    assert node_ready_condition(50.0, 50.0) is None
    cond = node_ready_condition(50.1, 50.0)
    assert (cond["status"], cond["reason"]) == ("Unknown", "NodeStatusUnknown")
    assert cond["message"] == "Kubelet stopped posting node status."


def test_profile_lifecycle_settings(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("nodes: [{name: a, allocatable: {cpu: 1}}]\n")
    defaults = load_profile(str(path)).lifecycle
    assert (defaults.node_monitor_grace_s, defaults.node_monitor_period_s) == (50.0, 5.0)
    assert (defaults.unreachable_toleration_s, defaults.default_tolerations) == (300, True)
    path.write_text(PROFILE)
    got = load_profile(str(path)).lifecycle
    assert (got.node_monitor_grace_s, got.node_monitor_period_s) == (2.0, 0.5)
    assert got.default_tolerations is False
    for bad, where in (
        ("nodeMonitorGracePeriod: soon", "nodeMonitorGracePeriod"),
        ("nodeMonitorPeriod: 0", "nodeMonitorPeriod"),
        ("defaultUnreachableTolerationSeconds: 1.5", "defaultUnreachableTolerationSeconds"),
        ("disableAdmissionPlugins: [NodeRestriction]", "disableAdmissionPlugins"),
    ):
        path.write_text(f"{bad}\nnodes: [{{name: a, allocatable: {{cpu: 1}}}}]\n")
        with pytest.raises(ClusterError, match=where):
            load_profile(str(path))


def test_fail_node_option_is_checked(tmp_path, profile, capsys):
    cluster = load_profile(profile)
    assert parse_fail_node("node-a@1.5", cluster).after_s == 1.5
    assert parse_fail_node("node-b@1m", cluster).after_s == 60.0
    manifest = tmp_path / "wf.yaml"
    manifest.write_text(json.dumps(_workflow("w", [_server("s")])))
    base = [str(manifest), "--isolate", "--cluster", profile, "--workdir", str(tmp_path / "w")]
    for bad, says in (
        ("node-z@3", "no node 'node-z'"),
        ("node-a@soon", "is not a time"),
        ("node-a@-1", "is not a time"),
        ("node-a", "expected NODE@SECONDS"),
        ("node-a@1 --fail-node node-a@2", "'node-a' is given twice"),
    ):
        given = [a for v in bad.split(" --fail-node ") for a in ("--fail-node", v)]
        assert run_cli.main([*base, *given]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err and err.startswith("ckptflow run: --fail-node")
    assert run_cli.main([str(manifest), "--isolate", "--fail-node", "node-a@1"]) == 2
    assert "add --cluster" in capsys.readouterr().err


# --- a run with a node lost -------------------------------------------------------------------

NODE_ENV = [
    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
]
# On node-a: serve TCP (a heartbeat byte every 0.2 s to each peer), write the address for the
# peer, tick in the log; never end by itself. Anywhere else: succeed at once.
SERVER = """
import os, socket, sys, threading, time
if os.environ["NODE"] != "node-a":
    print("done on", os.environ["NODE"]); sys.exit(0)
srv = socket.socket(); srv.bind(("0.0.0.0", 7000)); srv.listen()
def beat(c):
    while True:
        c.sendall(b"."); time.sleep(0.2)
def serve():
    while True:
        c, _ = srv.accept(); threading.Thread(target=beat, args=(c,), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
if len(sys.argv) > 1:
    open(sys.argv[1] + ".tmp", "w").write(os.environ["POD_IP"]); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
n = 0
while True:
    n += 1; print(f"tick {n} {time.time():.2f}", flush=True); time.sleep(0.1)
"""
# On node-b: connect to the server, take heartbeats until none comes for 1.5 s; then a new
# connect must time out too. Any FIN (b""), RST or "no route" fails it.
PEER = """
import socket, sys, time
path = sys.argv[1]
while True:
    try:
        ip = open(path).read(); break
    except OSError:
        time.sleep(0.05)
c = socket.create_connection((ip, 7000), timeout=5); c.settimeout(1.5)
beats = 0
try:
    while True:
        data = c.recv(100)
        if not data:
            print("FIN after", beats); sys.exit(1)
        beats += len(data)
except socket.timeout:
    print("recv timed out after", beats, "heartbeats at", f"{time.time():.2f}")
except OSError as exc:
    print("recv failed:", exc); sys.exit(1)
try:
    socket.create_connection((ip, 7000), timeout=1.5)
    print("connected to a lost node"); sys.exit(1)
except socket.timeout:
    print("connect timed out")
except OSError as exc:
    print("connect failed:", exc); sys.exit(1)
"""


def _server(name: str, *args: str, **pod) -> dict:
    container = {"image": "x", "command": ["python", "-c", SERVER, *args], "env": NODE_ENV}
    return {"name": name, "container": container, **pod}


def _workflow(name: str, templates: list[dict]) -> dict:
    tasks = [{"name": t["name"], "template": t["name"]} for t in templates]
    return {
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "main",
            "activeDeadlineSeconds": 120,
            "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
        },
    }


def _ticks(log: str) -> list[float]:
    return [float(t) for t in re.findall(r"^tick \d+ ([\d.]+)$", log, re.M)]


@needs_pods
@pytest.mark.timeout(180)
def test_a_silent_node_loss_is_detected_evicted_and_retried_elsewhere(tmp_path, profile):
    # a claim: shared by the run's pods on every node (a hostPath is each node's own)
    volume = [{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]
    mount = [{"name": "shared", "mountPath": "/shared"}]
    retry = {"limit": 2, "retryPolicy": "Always"}
    tolerate = [
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
    ]
    tolerant = _server("tolerant", "/shared/ip", retryStrategy=retry, tolerations=tolerate)
    tolerant["container"]["volumeMounts"] = mount
    bare = _server("bare", retryStrategy=retry)  # no toleration (the admission plugin is off)
    peer = {
        "name": "peer",
        "nodeSelector": {"kubernetes.io/hostname": "node-b"},
        "container": {"image": "x", "command": ["python", "-c", PEER, "/shared/ip"]},
    }
    peer["container"]["volumeMounts"] = mount
    manifest = _workflow("lost", [tolerant, bare, peer])
    manifest["spec"]["volumes"] = volume
    status = tmp_path / "w" / "status.json"
    seen: dict[str, set] = {}

    def watch():  # what `argo get` would show while the node is lost
        while not done.is_set():
            try:
                nodes = json.loads(status.read_text())["status"]["nodes"]
            except (OSError, ValueError, KeyError):
                nodes = {}
            for n in nodes.values():
                seen.setdefault(n["displayName"], set()).add((n["phase"], n.get("message", "")))
            time.sleep(0.05)

    done = threading.Event()
    watcher = threading.Thread(target=watch)
    watcher.start()
    stream = io.StringIO()
    node = Node(prefix="ckl")
    try:
        result = run_workflow(
            manifest,
            workdir=str(tmp_path / "w"),
            name="lost",
            stream=stream,
            pod_node=node,
            cluster=load_profile(profile),
            fail_nodes=[parse_fail_node("node-a@3", load_profile(profile))],
        )
        assert node.pods() == []  # the frozen pods were thawed and killed at the end
    finally:
        done.set()
        watcher.join()
        node.close()
    out = stream.getvalue()
    assert not any(leftovers(node.tag).values()), leftovers(node.tag)
    assert result.phase == "Succeeded", (result.message, out)

    lost = {n["displayName"]: n for n in result.nodes.values() if n["type"] == "Pod"}
    for name in ("tolerant", "bare"):
        first, second = lost[f"{name}(0)"], lost[f"{name}(1)"]
        assert (first["phase"], first["message"]) == ("Error", "pod deleted")
        assert first["hostNodeName"] == "node-a" and "exitCode" not in (first.get("outputs") or {})
        assert (second["phase"], second["hostNodeName"]) == ("Succeeded", "node-b")
        # Argo leaves a missing pod of a node started < 10 s ago alone (recentlyStarted)
        took = first["local"]["finishedAtUnix"] - first["local"]["startedAtUnix"]
        assert took > 10.0, took
        assert second["outputs"]["result"] == "done on node-b"
        # frozen, not dead: Argo showed it Running until its pod was deleted
        assert ("Running", "") in seen[f"{name}(0)"]
    assert lost["peer"]["phase"] == "Succeeded", Path(lost["peer"]["local"]["logFile"]).read_text()
    peer_log = lost["peer"]["outputs"]["result"]
    assert "recv timed out after" in peer_log and "connect timed out" in peer_log

    # the frozen pod made no progress after the loss (ticks every 0.1 s until then)
    lost_at = float(re.search(r"recv timed out after \d+ heartbeats at ([\d.]+)", peer_log)[1])
    ticks = _ticks(Path(lost["tolerant(0)"]["local"]["logFile"]).read_text())
    assert len(ticks) >= 5 and ticks[-1] < lost_at - 1.0  # silent 1.5 s before the peer gave up

    # detection after the grace period (2 s, checked every 0.5 s); eviction after the
    # toleration (2 s) for one, at once for the pod without a toleration
    silent = float(re.search(r"NodeNotReady node-a: .* ([\d.]+)s after it went silent", out)[1])
    assert 2.0 < silent <= 2.0 + 0.5 + 1.0, out  # + a busy machine's delay
    events = [(e["event"], e["subject"]) for e in result.status["status"]["local"]["nodeLifecycle"]]
    assert events[:2] == [("NodeLost", "node-a"), ("NodeNotReady", "node-a")]
    assert sorted(events[2:]) == [
        ("TaintManagerEviction", "lost.bare(0)"),
        ("TaintManagerEviction", "lost.tolerant(0)"),
    ]
    waits = dict(
        re.findall(r"TaintManagerEviction lost\.(\w+)\(0\): .*\(([\d.]+)s after the taint\)", out)
    )
    assert float(waits["bare"]) < 0.5, out
    assert 2.0 <= float(waits["tolerant"]) < 2.5, out
    print(out)


# A runner that froze its pod (a node lost) and then was SIGKILLed: what it prints, then waits.
FROZEN_RUNNER = """
import json, os, sys, time
from ckptflow.workflows.runner.pods import Node
node = Node(prefix=sys.argv[2], sweep_first=False)
pod = node.start_pod(
    "p", ["sleep", "600"], {"PATH": "/usr/bin:/bin"}, "/", log_path=os.path.join(sys.argv[1], "p.log")
)
pod.cgroups.freeze()
print(json.dumps({"tag": node.tag, "pid": pod.pid, "freezer": pod.cgroups.freezer}), flush=True)
time.sleep(600)
"""


@needs_pods
def test_frozen_pods_of_a_killed_runner_are_swept(tmp_path):
    """A frozen process ignores SIGKILL until thawed: sweep (cgroups.kill_all) thaws after the
    signal, so the pods of a runner killed mid-loss go too, freezer cgroups included."""
    import subprocess
    import sys

    from ckptflow.workflows.runner.pods import sweep

    proc = subprocess.Popen(
        [sys.executable, "-c", FROZEN_RUNNER, str(tmp_path), "ckf"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        made = json.loads(proc.stdout.readline())
        with open(Path(made["freezer"]) / "freezer.state") as f:
            assert f.read().strip() == "FROZEN"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert Path(f"/proc/{made['pid']}").exists()  # the frozen pod outlived its runner
    assert any(made["tag"] in r for r in sweep("ckf"))
    deadline = time.monotonic() + 10
    while Path(f"/proc/{made['pid']}").exists():
        assert time.monotonic() < deadline, "a frozen pod process survived the sweep"
        time.sleep(0.05)
    assert not any(leftovers(made["tag"]).values()), leftovers(made["tag"])


@needs_pods
@pytest.mark.timeout(120)
def test_an_interrupted_run_thaws_and_kills_its_frozen_pods(tmp_path, profile):
    """Ctrl-C while a node is lost: the frozen pod (it ignores every signal until thawed) goes
    with the rest, and its cgroups with it."""
    import os
    import signal
    import subprocess
    import sys

    shared = tmp_path / "w" / "volumes" / "shared"  # the claim's directory (runner/volumes.py)
    script = "import os, time\nopen('/shared/pid', 'w').write(str(os.getpid()))\ntime.sleep(600)"
    task = {
        "name": "sleeper",
        "container": {
            "image": "x",
            "command": ["python", "-c", script],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        },
    }
    manifest = _workflow("cut", [task])
    manifest["spec"]["volumes"] = [
        {"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}
    ]
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(manifest))
    argv = [sys.executable, "-m", "ckptflow.run_cli", str(path), "--isolate", "--cluster"]
    argv += [profile, "--fail-node", "node-a@1", "--workdir", str(tmp_path / "w")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "NodeLost node-a" in line:
                break
        pid = int((shared / "pid").read_text())
        with open(f"/proc/{pid}/cgroup") as f:
            freezer = next(x.split(":", 2)[2].strip() for x in f if ":freezer:" in x)
        state = Path("/sys/fs/cgroup/freezer" + freezer)
        assert (state / "freezer.state").read_text().strip() == "FROZEN"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "teardown" not in err, err
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, "the frozen pod survived the interrupted run"
        time.sleep(0.05)
    assert not state.exists()
