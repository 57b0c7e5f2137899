"""A task's working directory (workflows/runner/leaf.py `working_dir`): Argo runs a container in
its image's workingDir, `/` by default, or the template's `workingDir`. Locally the node's own
directory stands in for `/` (as for its artifact paths, artifact_paths.py): a file written
relative to the working directory is the output artifact at `/NAME`, and nothing lands in the
runner's own working directory (the examples conditional-artifacts, dag-conditional-artifacts,
exit-handler-with-artifacts)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.pods import available


def manifest(extra_container: dict | None = None) -> dict:
    writer = {
        "name": "write",
        "script": {
            "image": "python:alpine",
            "command": ["python"],
            "source": 'open("result.txt", "w").write("it was heads")\n',
            **(extra_container or {}),
        },
        "outputs": {"artifacts": [{"name": "result", "path": "/result.txt"}]},
    }
    reader = {
        "name": "read",
        "inputs": {"artifacts": [{"name": "r", "path": "/tmp/r"}]},
        "container": {"image": "alpine", "command": ["cat", "/tmp/r"]},
    }
    main = {
        "name": "main",
        "steps": [
            [{"name": "w", "template": "write"}],
            [{"name": "r", "template": "read", "arguments": {"artifacts": [
                {"name": "r", "from": "{{steps.w.outputs.artifacts.result}}"}]}}],
        ],
    }  # fmt: skip
    return {
        "kind": "Workflow",
        "metadata": {"name": "wd"},
        "spec": {"entrypoint": "main", "templates": [main, writer, reader]},
    }


def _run(tmp_path: Path, monkeypatch, doc: dict, **kw):
    here = tmp_path / "user-cwd"
    here.mkdir()
    monkeypatch.chdir(here)  # the runner's own cwd: nothing may be written there
    result = run_workflow(doc, workdir=str(tmp_path / "w"), name="wd", stream=io.StringIO(), **kw)
    return result, here


def test_a_relative_file_is_the_output_at_root(tmp_path, monkeypatch):
    result, here = _run(tmp_path, monkeypatch, manifest())
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result.node("wd[1].r")["outputs"]["result"] == "it was heads"
    assert os.listdir(here) == []  # before: result.txt landed in the user's folder


def test_a_missing_working_dir_is_made_in_the_nodes_filesystem(tmp_path, monkeypatch):
    doc = manifest({"workingDir": "/src/app"})
    doc["spec"]["templates"][1]["outputs"]["artifacts"][0]["path"] = "/src/app/result.txt"
    result, here = _run(tmp_path, monkeypatch, doc)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result.node("wd[1].r")["outputs"]["result"] == "it was heads"
    assert not os.path.exists("/src/app")  # the host's / is never written
    assert os.listdir(here) == []


def test_an_explicit_cwd_is_still_where_tasks_run(tmp_path, monkeypatch):
    """`run_workflow(cwd=...)` (the local pipeline's runs directory) keeps its meaning."""
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    doc = manifest()
    doc["spec"]["templates"][1]["outputs"] = {}
    doc["spec"]["templates"][0]["steps"] = doc["spec"]["templates"][0]["steps"][:1]
    result, _ = _run(tmp_path, monkeypatch, doc, cwd=str(chosen))
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert (chosen / "result.txt").read_text() == "it was heads"


WHY = available()


@pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
def test_a_pod_writes_relative_to_its_own_root(tmp_path, monkeypatch):
    result, here = _run(tmp_path, monkeypatch, manifest(), isolate=True)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result.node("wd[1].r")["outputs"]["result"] == "it was heads"
    assert os.listdir(here) == []  # before: the pod wrote into the host's folder


def _sh(name: str, script: str, **extra) -> dict:
    return {"name": name, "container": {"command": ["sh", "-c"], "args": [script], **extra}}


@pytest.fixture
def probe_dir():
    """A sandbox directory of the host (under /var/tmp) that pods write into by its path."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="ckptflow-rootfs-probe-", dir="/var/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
def test_a_pods_writes_to_its_root_stay_in_the_pod(tmp_path, monkeypatch, probe_dir):
    """A container's root filesystem is its own writable layer (podinit.overlay_root): a file
    written at a host path stays in the pod, and is still its output parameter."""
    out = f"{probe_dir}/out.txt"
    tmpl = _sh("w", f"echo written > {out} && cat {out}")
    tmpl["outputs"] = {"parameters": [{"name": "p", "valueFrom": {"path": out}}]}
    doc = {"kind": "Workflow", "metadata": {"name": "wd"},
           "spec": {"entrypoint": "w", "templates": [tmpl]}}  # fmt: skip
    result, _ = _run(tmp_path, monkeypatch, doc, isolate=True)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    node = result.node("wd")
    assert node["outputs"]["parameters"][0]["value"] == "written\n"
    assert os.listdir(probe_dir) == []  # before: the pod (root) wrote into the host's folder


@pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
def test_read_only_root_filesystem_keeps_volumes_writable(tmp_path, monkeypatch, probe_dir):
    """securityContext.readOnlyRootFilesystem: `/` refuses writes, the pod's /tmp does not."""
    script = f"echo x > /tmp/ok && ! touch {probe_dir}/no 2>/dev/null && echo ro"
    tmpl = _sh("w", script, securityContext={"readOnlyRootFilesystem": True})
    doc = {"kind": "Workflow", "metadata": {"name": "wd"},
           "spec": {"entrypoint": "w", "templates": [tmpl]}}  # fmt: skip
    result, _ = _run(tmp_path, monkeypatch, doc, isolate=True)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result.node("wd")["outputs"]["result"] == "ro"
    assert os.listdir(probe_dir) == []
