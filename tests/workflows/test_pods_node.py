"""Pods for real (root): network, hostname, private /tmp and /dev/shm, volumes, limits.

Traffic only between namespaces these tests create: the pods and the node address of a bridge
of our own. Skipped with `available()`'s reason where pods cannot work, except as root in CI.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from ckptflow.workflows.runner.pods import (
    Node,
    PodError,
    Volume,
    available,
    downward_env,
    leftovers,
)
from ckptflow.workflows.runner.pods.node import hidden_paths

WHY = available()
pods_only = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0 and os.environ.get("CI")),
    reason="only as root in CI",
)
def test_pods_work_as_root_in_ci():
    # CI runs as root: the pod tests below must run there, not skip.
    assert available() is None


@pytest.fixture(scope="module")
def node():
    if WHY is not None:
        pytest.skip(f"pods unavailable: {WHY}")
    with Node() as n:
        yield n
    assert not any(leftovers(n.tag).values())


def start(node, tmp_path, name, code, **kw):
    """Start `python -c code` as a pod."""
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    log = str(tmp_path / f"{name}-{uuid.uuid4().hex[:6]}.log")
    return node.start_pod(name, argv, dict(ENV), "/", log_path=log, **kw)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def wait(pod, timeout=30.0):
    """Wait for a pod to end; return (exit status as a node reports it, stdout)."""
    deadline = time.monotonic() + timeout
    while pod.poll() is None:
        assert time.monotonic() < deadline, f"pod {pod.name} still runs"
        time.sleep(0.02)
    return pod.exit_status, pod.finish()


def wait_for_output(pod, text, timeout=30.0):
    deadline = time.monotonic() + timeout
    while text.encode() not in pod.stdout:
        assert pod.poll() is None, f"pod {pod.name} ended: {pod.finish()}"
        assert time.monotonic() < deadline, f"pod {pod.name} never printed {text!r}"
        time.sleep(0.02)


SERVER = """
    import socket
    s = socket.socket()
    s.bind(("0.0.0.0", 8080))
    s.listen()
    print("listening", flush=True)
    conn, peer = s.accept()
    conn.sendall(b"pong from " + socket.gethostname().encode() + b" to " + peer[0].encode())
    conn.close()
"""


@pods_only
def test_two_pods_talk_over_the_bridge_and_keep_their_names(node, tmp_path):
    server = start(node, tmp_path, "server-a", SERVER)
    wait_for_output(server, "listening")
    client = start(
        node,
        tmp_path,
        "client-b",
        f"""
        import socket, time
        with socket.create_connection(("{server.ip}", 8080), timeout=10) as c:
            print(c.recv(100).decode())
        print("hostname", socket.gethostname(), socket.gethostbyname(socket.gethostname()))
        t = time.monotonic()
        try:
            socket.gethostbyname("server-a")
            print("resolved server-a")
        except OSError:
            print("server-a unresolved in %.1fs" % (time.monotonic() - t))
        """,
    )
    rc, out = wait(client)
    assert rc == 0, out
    assert server.ip != client.ip
    assert f"pong from server-a to {client.ip}" in out
    assert f"hostname client-b {client.ip}" in out
    assert "server-a unresolved" in out
    assert float(out.split("unresolved in ")[1].split("s")[0]) < 3  # no DNS timeout
    assert wait(server)[0] == 0
    for pod in (server, client):
        pod.release()


@pods_only
def test_enter_argv_runs_inside_the_pod(node, tmp_path):
    pod = start(node, tmp_path, "entered", "import time; time.sleep(60)")
    probe = subprocess.run(
        pod.enter_argv(["sh", "-c", "hostname; ip -4 -o addr show eth0"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.startswith("entered\n") and f"inet {pod.ip}/" in probe.stdout
    pod.release()


@pods_only
def test_tmp_and_shm_are_private(node, tmp_path):
    secret = f"secret-{uuid.uuid4().hex}"
    writer = start(
        node,
        tmp_path,
        "writer",
        f"""
        import os, time
        for d in ("/tmp", "/dev/shm"):
            open(os.path.join(d, "{secret}"), "w").write("mine")
        print("written", flush=True)
        time.sleep(60)
        """,
    )
    wait_for_output(writer, "written")
    reader = start(
        node,
        tmp_path,
        "reader",
        f"""
        import os
        print([os.path.exists(os.path.join(d, "{secret}")) for d in ("/tmp", "/dev/shm")])
        """,
    )
    rc, out = wait(reader)
    assert (rc, out.strip()) == (0, "[False, False]")
    assert not os.path.exists(f"/tmp/{secret}")
    assert not os.path.exists(f"/dev/shm/{secret}")
    # The node still reads what the pod wrote (output parameters live in /tmp).
    assert read(writer.path(f"/tmp/{secret}")) == "mine"
    writer.stop(1)
    assert read(writer.path(f"/tmp/{secret}")) == "mine"
    for pod in (writer, reader):
        pod.release()
    assert not os.path.exists(writer.dir)


@pods_only
def test_volumes_exist_in_the_pod_only(node, tmp_path):
    top = f"/data-{uuid.uuid4().hex[:8]}"
    deep = f"/mnt/ckpt-{uuid.uuid4().hex[:8]}/x"  # below an existing host directory
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "seen").write_text("by the pod")
    before = sorted(os.listdir("/mnt"))
    pod = start(
        node,
        tmp_path,
        "volumes",
        f"""
        import os
        for d in ("/data", "{top}", "{deep}", "/work-dir"):
            print(d, os.path.isdir(d))
            open(os.path.join(d, "f"), "w").write(d)
        print("mnt keeps", sorted(os.listdir("/mnt")))
        try:
            open("/ro/f", "w")
        except OSError as exc:
            print("ro", exc.strerror)
        print("same path", open("{shared}/seen").read())  # under the pod's own /tmp
        """,
        volumes=[
            Volume("/data", name="data"),
            Volume(top, name="top"),
            Volume(deep, name="deep"),
            Volume("/work-dir", host_path=str(shared), name="work"),
            Volume("/ro", host_path=str(shared), read_only=True, name="ro"),
            Volume(str(shared), host_path=str(shared), name="at-its-own-path"),
        ],
    )
    rc, out = wait(pod)
    assert rc == 0, out
    for d in ("/data", top, deep, "/work-dir"):
        assert f"{d} True" in out
        assert not os.path.exists(d)
    assert f"mnt keeps {sorted([*before, deep.split('/')[2]])}" in out  # host entries stay
    assert sorted(os.listdir("/mnt")) == before
    assert (shared / "f").read_text() == "/work-dir"  # a shared dir is shared
    assert "ro Read-only file system" in out
    assert "same path by the pod" in out
    assert read(pod.path("/data/f")) == "/data"
    assert pod.path("/elsewhere/f") is None
    pod.release()


@pods_only
def test_a_link_out_of_a_volume_is_not_followed_by_the_node(node, tmp_path):
    pod = start(node, tmp_path, "linker", "import os; os.symlink('/etc/hostname', '/tmp/out')")
    assert wait(pod)[0] == 0
    with pytest.raises(PodError, match="links out of its volume"):
        pod.path("/tmp/out")
    pod.release()


@pods_only
def test_memory_emptydir_has_its_size_limit(node, tmp_path):
    pod = start(
        node,
        tmp_path,
        "small-cache",
        """
        import errno, os
        try:
            with open("/cache/big", "wb") as f:
                f.write(b"x" * (2 << 20))
                f.flush()
            print("wrote it")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        st = os.statvfs("/dev/shm")
        print(st.f_blocks * st.f_frsize)
        """,
        volumes=[
            Volume("/cache", memory=True, size_limit=1 << 20, name="cache"),
            Volume("/dev/shm", memory=True, size_limit=4 << 20, name="dshm"),
        ],
    )
    rc, out = wait(pod)
    assert (rc, out.split()) == (0, ["ENOSPC", str(4 << 20)])
    pod.release()


@pods_only
def test_pods_started_at_once_get_their_own_ips(node, tmp_path):
    got, errors = [], []

    def one(i):
        try:
            pod = start(node, tmp_path, f"many-{i}", "import socket; print(socket.gethostname())")
            got.append((pod, wait(pod)))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(out for _, (_, out) in got) == [f"many-{i}\n" for i in range(6)]
    assert len({pod.ip for pod, _ in got}) == 6
    for pod, _ in got:
        pod.release()


@pods_only
def test_a_mount_path_through_a_symlink_lands_where_the_pod_looks(node, tmp_path):
    # /var/run is a symlink to /run on most systems: the mount must be where the pod
    # resolves it, not on the host's /run.
    name = f"ckp-test-{uuid.uuid4().hex[:8]}"
    pod = start(
        node,
        tmp_path,
        "linked",
        f"import os; print(os.path.ismount('/var/run/{name}'), os.path.isdir('/run/{name}'))",
        volumes=[Volume(f"/var/run/{name}", name="v")],
    )
    rc, out = wait(pod)
    assert (rc, out.strip()) == (0, "True True")
    assert not os.path.exists(f"/run/{name}")
    pod.release()


@pods_only
def test_a_pod_over_its_memory_limit_is_oom_killed(node, tmp_path):
    pod = start(
        node,
        tmp_path,
        "hungry",
        "x = b'x' * (200 << 20)\nprint('survived')",
        memory_limit="64Mi",
    )
    rc, out = wait(pod)
    assert rc == 137 and pod.poll() == -9, out
    assert "survived" not in out
    assert pod.oom_killed()
    pod.release()
    assert pod.oom_killed()  # still known after release


@pods_only
def test_a_pod_reaches_a_service_on_the_node_address(node, tmp_path):
    with socket.socket() as srv:
        srv.bind((node.address, 0))
        srv.listen()
        srv.settimeout(30)
        port = srv.getsockname()[1]
        pod = start(
            node,
            tmp_path,
            "client",
            f"""
            import socket
            with socket.create_connection(("{node.address}", {port}), timeout=10) as c:
                c.sendall(b"hello node")
            """,
        )
        conn, peer = srv.accept()
        with conn:
            assert conn.recv(100) == b"hello node"
    assert peer[0] == pod.ip
    assert wait(pod)[0] == 0
    pod.release()
    with open(f"/proc/sys/net/ipv4/conf/{node.bridge.name}/forwarding") as f:
        assert f.read().strip() == "0"  # nothing is routed from the bridge to elsewhere


@pods_only
def test_a_retry_gets_a_new_ip(node, tmp_path):
    ips = []
    for _ in range(3):
        pod = start(node, tmp_path, "retried", "pass")
        assert wait(pod)[0] == 0
        ips.append(pod.ip)
        pod.release()
    assert len(set(ips)) == 3
    assert node.address not in ips


@pods_only
def test_downward_api_env_carries_the_pod_ip(node, tmp_path):
    ip = node.new_ip()
    env_spec = [
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
    ]
    env = {**ENV, **downward_env("dw-pod", "default", ip, {"team": "ml"}, {}, env_spec)}
    code = """
        import os, socket
        print(os.environ["MY_IP"], os.environ["MY_NAME"], os.environ["TEAM"])
        s = socket.socket(); s.bind((os.environ["MY_IP"], 0)); print("bound")
    """
    log = str(tmp_path / "dw.log")
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    pod = node.start_pod("dw-pod", argv, env, "/", log_path=log, ip=ip)
    assert pod.ip == ip
    assert wait(pod) == (0, f"{ip} dw-pod ml\nbound\n")
    pod.release()
    with pytest.raises(ValueError, match="new_ip"):
        node.start_pod("again", ["true"], ENV, "/", log_path=log, ip=ip)  # used already


@pods_only
def test_stop_and_finish_leave_no_process(node, tmp_path):
    daemon = start(
        node,
        tmp_path,
        "escaper",
        """
        import os, subprocess, time
        # a child in a new session: outside the pod's process group, still in the pod
        subprocess.Popen(["sleep", "600"], start_new_session=True)
        print("forked", flush=True)
        time.sleep(600)
        """,
    )
    wait_for_output(daemon, "forked")
    assert len(daemon.cgroups.pids()) == 2
    daemon.stop(1)
    assert daemon.cgroups.pids() == set()
    leaver = start(
        node,
        tmp_path,
        "leaver",
        "import subprocess; subprocess.Popen(['sleep', '600']); print('bye')",
    )
    t = time.monotonic()
    assert wait(leaver) == (0, "bye\n")  # finish() does not wait for the orphaned sleep
    assert time.monotonic() - t < 4
    for pod in (daemon, leaver):
        pod.release()


@pods_only
def test_cpu_limit_sets_a_quota(node, tmp_path):
    pod = start(node, tmp_path, "slow", "import time; time.sleep(30)", cpu_limit="250m")
    with open(os.path.join(pod.cgroups.cpu, "cpu.cfs_quota_us")) as f:
        assert f.read().strip() == "25000"
    assert pod.pid in pod.cgroups.pids()
    pod.release()


@pods_only
def test_start_errors_are_one_line(node, tmp_path):
    log = str(tmp_path / "bad.log")
    with pytest.raises(PodError, match="no-such-command-here"):
        node.start_pod("bad", ["no-such-command-here"], dict(ENV), "/", log_path=log)
    with pytest.raises(PodError, match="workingDir /nowhere"):
        node.start_pod("bad", ["true"], dict(ENV), "/nowhere", log_path=log)
    with pytest.raises(ValueError, match="1-63 letters"):
        node.start_pod("bad_name", ["true"], dict(ENV), "/", log_path=log)
    with pytest.raises(PodError, match="share a mountPath"):
        node.start_pod(
            "bad", ["true"], dict(ENV), "/", log_path=log, volumes=[Volume("/a"), Volume("/a/")]
        )
    with pytest.raises(ValueError, match="memory limit"):
        node.start_pod("bad", ["true"], dict(ENV), "/", log_path=log, memory_limit="lots")
    assert node.pods() == []  # nothing left of the failed starts


@pods_only
def test_close_removes_everything(tmp_path):
    node = Node()
    assert node.subnet != "" and leftovers(node.tag)["links"] == [node.bridge.name]
    started = [start(node, tmp_path, f"p{i}", "import time; time.sleep(600)") for i in range(2)]
    netns = {os.stat(f"/proc/{p.pid}/ns/net").st_ino for p in started}
    assert os.stat("/proc/self/ns/net").st_ino not in netns and len(netns) == 2
    pids = [p.pid for p in started]
    other = Node()  # a second run at the same time: its own tag and subnet
    assert (other.tag, other.subnet) != (node.tag, node.subnet)
    other.close()
    node.close()
    node.close()  # idempotent
    assert not any(leftovers(node.tag).values()), leftovers(node.tag)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert not netns & _live_net_namespaces()
    with pytest.raises(PodError, match="shutting down"):
        start(node, tmp_path, "late", "pass")


def _live_net_namespaces() -> set[int]:
    """The inode of every network namespace a process on this machine is in."""
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                out.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    return out


@pods_only
def test_closing_while_pods_start_stops_them_all(tmp_path):
    node = Node()
    errors = []

    def worker(i):
        try:
            pod = start(node, tmp_path, f"w{i}", "import time; time.sleep(600)")
            pod.poll()
        except PodError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    node.close()
    for t in threads:
        t.join(timeout=60)
    assert not any(leftovers(node.tag).values()), leftovers(node.tag)
    assert all("shutting down" in e for e in errors), errors


def test_hidden_paths_are_those_under_the_pods_own_mounts():
    assert hidden_paths(["/tmp/co/.venv", "/tmp/co", "/usr", "/tmp", "/dev/shm/x/y"]) == [
        "/dev/shm/x/y",
        "/tmp/co",
    ]


def test_a_runner_living_under_tmp_still_runs_in_its_pods(node, tmp_path, monkeypatch):
    """A checkout (or venv) under /tmp: the pod's private /tmp would hide the interpreter and
    the package ("No such file or directory: '/tmp/.../.venv/bin/python'"), so both are bound
    into every pod at their own path, read-only."""
    prefix = tmp_path / "venv"
    prefix.mkdir()
    (prefix / "marker").write_text("here")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    pod = start(node, tmp_path, "under-tmp", f"print(open({str(prefix / 'marker')!r}).read())")
    status, out = wait(pod)
    pod.release()
    assert status == 0 and "here" in out, out
