"""Argo's examples that use `resource` templates, ConfigMap parameters and Secrets, vendored
unchanged in tests/workflows/fixtures/argo-examples/, run with the local runner against the
cluster model's object store (the objects their comments ask for are in
tests/workflows/fixtures/argo-objects/) to Argo's outcome."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from ckptflow.workflows.runner import SpecError, load_manifest, run_workflow
from ckptflow.workflows.runner.objects import ObjectStore, load_objects

VENDORED = Path(__file__).parent / "fixtures" / "argo-examples"
OBJECTS = Path(__file__).parent / "fixtures" / "argo-objects"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "argo" / "examples"

SUCCEED = [
    "k8s-patch-pod",
    "k8s-patch-json-pod",
    "k8s-patch-merge-pod",
    "k8s-patch-json-workflow",
    "k8s-set-owner-reference",
    "k8s-owner-reference",
    "resource-delete-with-flags",
    "resource-flags",
]
# example -> the objects its comments ask to create first (scripts/argo_examples.py reads it too)
NEEDS: dict[str, str] = json.loads((OBJECTS / "needs.json").read_text())
SLOW = ["k8s-wait-wf", "k8s-jobs", "k8s-orchestration"]
REFUSED = {
    "k8s-resource-log-selector": "no controller writes a TFJob's status locally",
    "daemoned-stateful-set-with-service": "no controller writes a StatefulSet's status locally",
}


def _run(
    name: str, tmp_path: Path, manifest: dict | None = None, objects: ObjectStore | None = None
):
    manifest = manifest or load_manifest(str(VENDORED / f"{name}.yaml"))
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), stream=io.StringIO(),
        lock_dir=str(tmp_path / "locks"), objects=objects, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.skipif(not SHARED.is_dir(), reason="no Argo checkout at ../shared")
@pytest.mark.parametrize("name", [*SUCCEED, *NEEDS, *SLOW, *REFUSED])
def test_the_vendored_copy_is_unchanged(name):
    assert (VENDORED / f"{name}.yaml").read_bytes() == (SHARED / f"{name}.yaml").read_bytes()


@pytest.mark.parametrize("name", SUCCEED)
def test_resource_examples_succeed(name, tmp_path):
    result = _run(name, tmp_path)
    assert result.phase == "Succeeded", result.status["status"].get("message")


def test_patch_pod_changes_the_templates_own_pod(tmp_path):
    """k8s-patch-pod patches `{{pod.name}}`: the resource template's own pod, in the store."""
    store = ObjectStore()
    seen = []
    store.on_delete.append(seen.append)  # the run's end collects the pod the workflow owns
    result = _run("k8s-patch-pod", tmp_path, objects=store)
    assert result.phase == "Succeeded"
    pods = [o for o in seen if o["kind"] == "Pod"]
    assert len(pods) == 1 and pods[0]["metadata"]["annotations"]["foo"] == "bar"
    assert store.list("Pod") == [] and store.get("Workflow", result.name) is None


def test_set_owner_reference_makes_the_configmap_garbage(tmp_path):
    store = ObjectStore()
    created = []
    store.on_create.append(created.append)
    result = _run("k8s-set-owner-reference", tmp_path, objects=store)
    assert result.phase == "Succeeded"
    cm = next(o for o in created if o["kind"] == "ConfigMap")
    assert cm["metadata"]["name"].startswith("owned-eg-")
    assert cm["metadata"]["ownerReferences"][0]["uid"] == result.status["metadata"]["uid"]
    assert store.list("ConfigMap") == []  # collected with the workflow at the run's end


def test_resource_flags_runs_the_first_step_only(tmp_path):
    result = _run("resource-flags", tmp_path)
    assert result.node("submit-resource")["phase"] == "Succeeded"
    assert result.node("submit-resource-without-validation")["phase"] == "Skipped"


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_examples_with_their_objects_succeed(name, tmp_path):
    store = load_objects([str(OBJECTS / NEEDS[name])])
    result = _run(name, tmp_path, objects=store)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    logs = "".join(p.read_text() for p in (tmp_path / "w").rglob("*.log"))
    expected = {
        "secrets": "secret from env: S00perS3cretPa55word\nsecret from file: S00perS3cretPa55word",
        "workflow-of-workflows": "Welcome Argo",
    }.get(name, "hello world")
    assert expected in logs


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_without_their_objects_they_are_refused_naming_the_option(name, tmp_path):
    if name == "workflow-of-workflows":  # the template is read when the child starts:
        result = _run(name, tmp_path)  # the child is Error, which its failureCondition sees
        assert result.phase == "Failed"
        assert "failure condition 'status.phase in" in result.node("workflow1")["message"]
        return
    with pytest.raises(SpecError, match="--objects FILE"):
        _run(name, tmp_path)


def _shortened(name: str, old: str, new: str) -> dict:
    """The example with its sleeps shortened (the vendored file stays as Argo wrote it)."""
    text = (VENDORED / f"{name}.yaml").read_text()
    assert old in text
    return yaml.safe_load(text.replace(old, new))


def test_k8s_wait_wf_waits_for_the_child_workflow(tmp_path):
    manifest = _shortened("k8s-wait-wf", 'command: [sleep, "20"]', 'command: [sleep, "1"]')
    result = _run("k8s-wait-wf", tmp_path, manifest)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    child = result.node("create-wf")["outputs"]["parameters"][0]["value"]
    assert child.startswith("sleep-")
    assert (tmp_path / "w" / "workflows" / child / "status.json").is_file()


def test_k8s_jobs_runs_the_job_pods_and_saves_jsonpath_and_jq_outputs(tmp_path):
    manifest = _shortened("k8s-jobs", "time.sleep(10)", "time.sleep(0)")
    result = _run("k8s-jobs", tmp_path, manifest)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    params = {p["name"]: p["value"] for p in result.node(result.name)["outputs"]["parameters"]}
    job = json.loads(params["job-obj"])
    assert params["job-name"] == job["metadata"]["name"]
    assert job["status"]["succeeded"] == 3
    numbers = [int(p.read_text()) for p in (tmp_path / "w" / "logs").glob("rand-num-*.log")]
    assert len(numbers) == 3 and all(1 <= n <= 1000 for n in numbers)


def test_k8s_orchestration_creates_and_deletes_the_job(tmp_path):
    manifest = _shortened("k8s-orchestration", "time.sleep(10)", "time.sleep(0)")
    store = ObjectStore()
    result = _run("k8s-orchestration", tmp_path, manifest, objects=store)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    assert store.list("Job") == [] and store.list("Pod", "job-name") == []


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_conditions_on_kinds_without_a_controller_are_refused(name, tmp_path):
    with pytest.raises(SpecError, match=REFUSED[name]):
        _run(name, tmp_path)
