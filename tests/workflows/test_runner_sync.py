"""`synchronization` on one machine (workflows/runner/sync.py): mutexes and semaphores at
template and workflow level, shared by every run on the machine through file locks."""

from __future__ import annotations

import fcntl
import io
import os
import threading
import time
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.sync import limits_from_configmap, parse_limit


def workflow(entry: str, *templates: dict, **spec) -> dict:
    return {"kind": "Workflow", "metadata": {"name": "wf"},
            "spec": {"entrypoint": entry, "templates": list(templates), **spec}}  # fmt: skip


def stamp_template(log: Path, sync: dict | None = None, sleep: float = 0.4) -> dict:
    """A template appending `start <t>` / `end <t>` lines to `log` around a sleep."""
    script = (f"echo start $(date +%s.%N) >> {log}; sleep {sleep}; "
              f"echo end $(date +%s.%N) >> {log}")  # fmt: skip
    tmpl = {"name": "work", "inputs": {"parameters": [{"name": "i"}]},
            "container": {"command": ["sh", "-c"], "args": [script]}}  # fmt: skip
    if sync is not None:
        tmpl["synchronization"] = sync
    return tmpl


def fan_out(n: int) -> dict:
    return {"name": "main", "steps": [[{"name": "w", "template": "work", "withSequence": {"count": str(n)},
            "arguments": {"parameters": [{"name": "i", "value": "{{item}}"}]}}]]}  # fmt: skip


def max_concurrency(log: Path) -> int:
    events = sorted(
        (float(t), 1 if kind == "start" else -1)
        for kind, t in (line.split() for line in log.read_text().splitlines())
    )
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def run(manifest: dict, tmp_path: Path, name: str = "wf", **kwargs):
    kwargs.setdefault("lock_dir", str(tmp_path / "locks"))
    return run_workflow(
        manifest, workdir=str(tmp_path / name), name=name, stream=io.StringIO(), **kwargs
    )


def test_a_template_mutex_runs_its_instances_one_at_a_time(tmp_path):
    log = tmp_path / "log"
    manifest = workflow("main", fan_out(3), stamp_template(log, {"mutexes": [{"name": "m"}]}))
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded"
    assert max_concurrency(log) == 1
    # without it they overlap (the test would notice a mutex that does nothing)
    log2 = tmp_path / "log2"
    assert (
        run(workflow("main", fan_out(3), stamp_template(log2)), tmp_path, "b").phase == "Succeeded"
    )
    assert max_concurrency(log2) == 3


def test_a_semaphore_admits_its_limit(tmp_path):
    log = tmp_path / "log"
    sync = {"semaphores": [{"configMapKeyRef": {"name": "my-config", "key": "template"}}]}
    manifest = workflow("main", fan_out(4), stamp_template(log, sync))
    result = run(manifest, tmp_path, semaphores={"my-config/template": 2})
    assert result.phase == "Succeeded"
    assert max_concurrency(log) == 2


def test_a_semaphore_without_a_limit_is_refused_naming_the_flag(tmp_path):
    sync = {"semaphores": [{"configMapKeyRef": {"name": "my-config", "key": "template"}}]}
    manifest = workflow("main", fan_out(1), stamp_template(tmp_path / "l", sync))
    with pytest.raises(SpecError, match="pass --semaphore my-config/template=N"):
        run(manifest, tmp_path)
    db = {"semaphores": [{"database": {"key": "k"}}]}
    with pytest.raises(SpecError, match="spec: synchronization.semaphores k"):
        run(
            workflow("main", fan_out(1), stamp_template(tmp_path / "l"), synchronization=db),
            tmp_path,
        )


def test_workflow_mutex_excludes_another_run_on_the_machine(tmp_path):
    log = tmp_path / "log"
    tmpl = {"name": "one", "container": {"command": ["sh", "-c"], "args": [
        f"echo start $(date +%s.%N) >> {log}; sleep 0.5; echo end $(date +%s.%N) >> {log}"]}}  # fmt: skip
    manifest = workflow("one", tmpl, synchronization={"mutexes": [{"name": "only-one"}]})
    results = []
    threads = [threading.Thread(target=lambda n=n: results.append(run(manifest, tmp_path, f"r{n}")))
               for n in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.phase for r in results] == ["Succeeded", "Succeeded"]
    assert max_concurrency(log) == 1


def test_a_waiting_node_is_pending_with_argos_message_until_the_lock_is_free(tmp_path):
    lock = tmp_path / "locks" / "default" / "mutex" / "m"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another workflow holds it
    tmpl = {"name": "t", "synchronization": {"mutexes": [{"name": "m"}]},
            "container": {"command": ["true"]}}  # fmt: skip
    out = []
    t = threading.Thread(target=lambda: out.append(run(workflow("t", tmpl), tmp_path)))
    t.start()
    status = tmp_path / "wf" / "status.json"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "Waiting for" not in (
        status.read_text() if status.exists() else ""
    ):
        time.sleep(0.1)
    assert "Waiting for default/mutex/m lock" in status.read_text()
    assert not out
    os.close(fd)
    t.join(30)
    assert out[0].phase == "Succeeded"


def test_limits_from_flags_and_configmaps(tmp_path):
    assert parse_limit("my-config/template=3") == ("my-config/template", 3)
    for bad in ("x", "x=0", "=2", "x=two"):
        with pytest.raises(ValueError, match="expected NAME=N"):
            parse_limit(bad)
    cm = tmp_path / "cm.yaml"
    cm.write_text(
        "kind: ConfigMap\nmetadata: {name: my-config}\ndata: {template: '3', workflow: '1'}\n"
    )
    assert limits_from_configmap(str(cm)) == {"my-config/template": 3, "my-config/workflow": 1}
    cm.write_text("kind: Secret\n")
    with pytest.raises(ValueError, match="expected a ConfigMap"):
        limits_from_configmap(str(cm))
