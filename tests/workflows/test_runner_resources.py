"""`resource` templates against the object store (workflows/runner/resource.py,
resource_fields.py, controllers.py): each kubectl action, conditions as Argo's matchConditions,
outputs, flags, owner references and garbage collection, child workflows, hostile manifests;
and `--objects` / ConfigMap / Secret references (refs.py) on small manifests."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner import objects as ob
from ckptflow.workflows.runner.object_rules import MAX_OBJECT_BYTES
from ckptflow.workflows.runner.resource import parse_flags
from ckptflow.workflows.runner.resource_fields import (
    ResourceError,
    conditions_met,
    jq_filter,
    json_path,
)

from ckptflow.run_cli import main as run_main


def _wf(*templates, entry=None, **spec):
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf"},
        "spec": {"entrypoint": entry or templates[0]["name"], "templates": list(templates), **spec},
    }


def _res(name, action, manifest=None, **extra):
    res = {"action": action, **extra}
    if manifest is not None:
        res["manifest"] = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
    return {"name": name, "resource": res}


def _steps(name, *names):
    return {"name": name, "steps": [[{"name": n, "template": n}] for n in names]}


def _run(manifest, tmp_path, objects=None, **kw):
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), stream=io.StringIO(), objects=objects,
        lock_dir=str(tmp_path / "locks"), env={"PATH": "/usr/bin:/bin"}, **kw,
    )  # fmt: skip


CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1"}}}


def test_conditions_follow_argos_match_conditions():
    obj = {"status": {"succeeded": 3, "failed": 0, "phase": "Running"}}
    assert conditions_met(obj, "status.succeeded > 2", "status.failed > 1") is True
    assert conditions_met(obj, "status.succeeded > 3", "") is None  # keep waiting
    assert conditions_met(obj, "status.phase == Running,status.failed == 0", "") is True
    # no success condition: met at once unless the failure one matches (numMatched >= 0)
    assert conditions_met(obj, "", "status.phase in (Failed, Error)") is True
    with pytest.raises(ResourceError, match=r"failure condition 'status.phase in \(Error,Failed\)"):
        conditions_met(
            {"status": {"phase": "Error"}},
            "status.phase == Succeeded",
            "status.phase in (Failed, Error)",
        )
    # a missing field never satisfies `>` (ParseInt fails) and satisfies `!=`
    assert conditions_met({}, "status.n > 0", "") is None
    assert conditions_met({}, "status.phase != Failed", "") is True


def test_json_path_and_jq_outputs():
    obj = {"metadata": {"name": "n", "labels": {"x.y/z": "v"}}, "spec": {"c": [{"p": 80}]}}
    assert json_path(obj, "{.metadata.name}") == "n"
    assert json_path(obj, "name={.metadata.name} port={.spec.c[0].p}") == "name=n port=80"
    assert json_path(obj, "{.metadata.labels['x.y/z']}") == "v"
    assert json_path(obj, "{.spec.c[0]}") == '{"p":80}'
    with pytest.raises(ResourceError, match="not found"):
        json_path(obj, "{.status.phase}")
    with pytest.raises(ResourceError, match="not followed locally"):
        json_path(obj, "{.items[*].name}")
    assert jq_filter(obj, ".metadata.name") == "n"
    assert jq_filter(obj, ".spec.c[] | .p") == "80"
    assert jq_filter({"b": 1, "a": 2}, ".") == '{"a":2,"b":1}'  # Go's json.Marshal: keys sorted
    with pytest.raises(ResourceError, match="jqFilter"):
        jq_filter(obj, ".[")


def test_flags_that_matter_are_followed_and_others_named():
    assert parse_flags(["configmap", "--selector", "a=1"]) == {
        "args": ["configmap"], "selector": "a=1", "namespace": None,
    }  # fmt: skip
    assert parse_flags(["pod", "p", "-n=ns", "--validate=false"])["args"] == ["pod", "p"]
    with pytest.raises(ResourceError, match="'--cascade=orphan' is not followed locally"):
        parse_flags(["--cascade=orphan"])


def test_create_get_patch_delete_and_outputs(tmp_path):
    store = ob.ObjectStore()
    manifest = _wf(
        _steps("main", "create", "get", "patch", "delete"),
        _res("create", "create", CM),
        {**_res("get", "get", CM), "outputs": {"parameters": [
            {"name": "label", "valueFrom": {"jsonPath": "{.metadata.labels.a}"}},
            {"name": "obj", "valueFrom": {"jqFilter": ".metadata.name"}},
        ]}},
        _res("patch", "patch", {**CM, "metadata": {"name": "c", "labels": {"b": "2"}}}, mergeStrategy="merge"),
        _res("delete", "delete", flags=["configmap", "--selector", "b=2"]),
    )  # fmt: skip
    seen = []
    store.on_delete.append(seen.append)
    result = _run(manifest, tmp_path, store)
    assert result.phase == "Succeeded", result.message
    outs = {p["name"]: p["value"] for p in result.node("get")["outputs"]["parameters"]}
    assert outs == {"label": "1", "obj": "c"}
    cm = next(o for o in seen if o["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert store.get("ConfigMap", "c") is None


def test_api_errors_fail_the_node_with_the_servers_words(tmp_path):
    store = ob.ObjectStore()
    store.create(CM)
    manifest = _wf(_res("make", "create", CM))
    result = _run(manifest, tmp_path, store)
    assert result.phase == "Failed"
    assert (
        result.node("wf")["message"]
        == 'Error from server (AlreadyExists): ConfigMap "c" already exists'
    )
    result = _run(_wf(_res("get", "get", {**CM, "metadata": {"name": "nope"}})), tmp_path)
    assert "Error from server (NotFound)" in result.node("wf")["message"]


def test_a_condition_waits_for_another_step_to_change_the_object(tmp_path):
    """get with a successCondition waits until a parallel step patches the object."""
    manifest = _wf(
        {"name": "main", "steps": [
            [{"name": "make", "template": "make"}],
            [{"name": "wait", "template": "wait"}, {"name": "later", "template": "later"}],
        ]},
        _res("make", "create", CM),
        _res("wait", "get", CM, successCondition="metadata.labels.ready == yes"),
        {"name": "later", "steps": [[{"name": "nap", "template": "nap"}], [{"name": "mark", "template": "mark"}]]},
        {"name": "nap", "container": {"image": "x", "command": ["sleep", "0.3"]}},
        _res("mark", "patch", {**CM, "metadata": {"name": "c", "labels": {"ready": "yes"}}}),
    )  # fmt: skip
    result = _run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("wait")["finishedAt"] >= result.node("mark")["finishedAt"]


def test_a_waiting_condition_ends_at_the_templates_deadline(tmp_path):
    manifest = _wf(
        _steps("main", "make", "wait"),
        _res("make", "create", CM),
        {**_res("wait", "get", CM, successCondition="metadata.labels.ready == yes"), "activeDeadlineSeconds": 1},
    )  # fmt: skip
    result = _run(manifest, tmp_path)
    assert result.phase == "Failed"


def test_set_owner_reference_owns_by_the_workflow_and_the_end_collects(tmp_path):
    store = ob.ObjectStore()
    created = []
    store.on_create.append(created.append)
    result = _run(_wf(_res("make", "create", CM, setOwnerReference=True)), tmp_path, store)
    assert result.phase == "Succeeded"
    cm = next(o for o in created if o["kind"] == "ConfigMap")
    ref = cm["metadata"]["ownerReferences"][0]
    assert ref["kind"] == "Workflow" and ref["name"] == "wf" and ref["controller"] is True
    assert ref["uid"] == result.status["metadata"]["uid"]
    assert store.get("ConfigMap", "c") is None and store.get("Workflow", "wf") is None
    # without an owner the object outlives the run, as on a cluster
    result = _run(_wf(_res("make", "create", CM)), tmp_path, store)
    assert store.get("ConfigMap", "c") is not None


def test_a_child_workflow_runs_and_its_phase_is_seen(tmp_path):
    child = _wf({"name": "c", "container": {"image": "x", "command": ["sh", "-c", "exit 3"]}})
    child["metadata"] = {"generateName": "child-"}
    manifest = _wf(
        {**_res("make", "create", child, successCondition="status.phase == Succeeded",
                failureCondition="status.phase in (Failed, Error)"),
         "outputs": {"parameters": [{"name": "n", "valueFrom": {"jsonPath": "{.metadata.name}"}}]}},
    )  # fmt: skip
    result = _run(manifest, tmp_path)
    assert result.phase == "Failed"
    assert "failure condition 'status.phase in (Error,Failed)' evaluated true" in result.message
    runs = list((tmp_path / "w" / "workflows").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("child-")
    status = json.loads((runs[0] / "status.json").read_text())
    assert status["status"]["phase"] == "Failed"


def test_deleting_a_child_workflow_stops_it(tmp_path):
    child = _wf({"name": "c", "container": {"image": "x", "command": ["sleep", "60"]}})
    child["metadata"] = {"name": "kid"}
    manifest = _wf(
        _steps("main", "make", "drop"),
        _res("make", "create", child),
        _res("drop", "delete", {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "kid"}}),
    )  # fmt: skip
    result = _run(manifest, tmp_path)
    assert result.phase == "Succeeded"
    status = json.loads((tmp_path / "w" / "workflows" / "kid" / "status.json").read_text())
    assert status["status"]["phase"] == "Failed"
    assert "deleted" in status["status"]["message"]


def test_what_cannot_be_followed_is_refused_with_one_line(tmp_path):
    bad = _wf(
        _steps("main", "a", "b", "c", "d"),
        _res("a", "scale", CM),
        _res("b", "delete", CM, successCondition="status.x == 1"),
        _res("c", "create", CM, flags=["--dry-run=server"]),
        _res("d", "patch", CM, mergeStrategy="apply"),
    )  # fmt: skip
    with pytest.raises(SpecError) as info:
        _run(bad, tmp_path)
    text = str(info.value)
    assert "template 'a': resource.action: 'scale' is not one of" in text
    assert "not supported for delete action" in text
    assert "'--dry-run=server' is not followed locally" in text
    assert "resource.mergeStrategy: 'apply'" in text


def test_a_hostile_manifest_is_bounded(tmp_path):
    big = {**CM, "data": {"k": "x" * (MAX_OBJECT_BYTES + 10)}}
    result = _run(_wf(_res("make", "create", big)), tmp_path)
    assert result.phase == "Failed" and "byte" in result.message
    two = yaml.safe_dump(CM) + "---\n" + yaml.safe_dump(CM)
    result = _run(_wf(_res("make", "create", two)), tmp_path)
    assert "more than one object" in result.message


def test_manifest_from_an_input_artifact(tmp_path):
    tmpl = {
        **_res("make", "create"),
        "inputs": {
            "artifacts": [{"name": "m", "path": "/tmp/m", "raw": {"data": yaml.safe_dump(CM)}}]
        },
    }
    tmpl["resource"]["manifestFrom"] = {"artifact": {"name": "m"}}
    store = ob.ObjectStore()
    result = _run(_wf(tmpl), tmp_path, store)
    assert result.phase == "Succeeded", result.message
    assert store.get("ConfigMap", "c") is not None


def _echo(env=None, volumes=None, mounts=None, args="echo $V"):
    c = {"image": "x", "command": ["sh", "-c"], "args": [args]}
    if env:
        c["env"] = env
    if mounts:
        c["volumeMounts"] = mounts
    t = {"name": "main", "container": c}
    return _wf(t, volumes=volumes) if volumes else _wf(t)


def test_secret_env_and_volume_and_configmap_parameters_from_objects(tmp_path):
    objs = tmp_path / "objs.yaml"
    objs.write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: aGVsbG8=}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {msg: hi, f: file-text}\n"
    )
    store = ob.load_objects([str(objs)])
    env = [
        {"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "W", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "msg"}}},
    ]
    vols = [
        {"name": "sv", "secret": {"secretName": "s"}},
        {"name": "cv", "configMap": {"name": "c", "items": [{"key": "f", "path": "sub/f.txt"}]}},
    ]
    mounts = [{"name": "sv", "mountPath": "/etc/sec"}, {"name": "cv", "mountPath": "/etc/cm"}]
    manifest = _echo(env, vols, mounts, "echo $V $W; cat /etc/sec/k; echo; cat /etc/cm/sub/f.txt")
    manifest["spec"]["arguments"] = {
        "parameters": [{"name": "p", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "msg"}}}]
    }
    manifest["spec"]["templates"][0]["container"]["args"][0] += "; echo {{workflow.parameters.p}}"
    result = _run(manifest, tmp_path, store)
    assert result.phase == "Succeeded", result.message
    assert result.node("wf")["outputs"]["result"] == "hello hi\nhello\nfile-texthi"


def test_missing_objects_are_refused_naming_objects_option(tmp_path):
    env = [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    with pytest.raises(SpecError, match="--objects FILE"):
        _run(_echo(env), tmp_path)
    manifest = _echo()
    manifest["spec"]["arguments"] = {
        "parameters": [{"name": "p", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    }
    with pytest.raises(SpecError, match="ConfigMap 'c' key 'k' is not in the cluster model"):
        _run(manifest, tmp_path)


def test_cli_objects_option_and_a_damaged_file(tmp_path, capsys):
    wf = tmp_path / "wf.yaml"
    manifest = _echo(args="echo {{workflow.parameters.p}}")
    manifest["spec"]["arguments"] = {
        "parameters": [{"name": "p", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    }
    wf.write_text(yaml.safe_dump(manifest))
    objs = tmp_path / "objs.yaml"
    objs.write_text("kind: ConfigMap\nmetadata: {name: c}\ndata: {k: from-file}\n")
    rc = run_main([str(wf), "--workdir", str(tmp_path / "w"), "--objects", str(objs)])
    assert rc == 0
    assert "from-file" in (tmp_path / "w" / "logs" / "wf.log").read_text()
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ConfigMap\nmetadata: {name: Bad_Name}\n")
    rc = run_main([str(wf), "--workdir", str(tmp_path / "w2"), "--objects", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--objects {bad}: ConfigMap name 'Bad_Name'" in err
    assert len(err.strip().splitlines()) == 1


def test_secret_volume_and_env_in_an_isolated_pod(tmp_path):
    from ckptflow.workflows.runner.pods import available

    why = available()
    if why is not None:
        pytest.skip(f"pods unavailable: {why}")
    store = ob.ObjectStore()
    store.create({"kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "pw"}})
    env = [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    vols = [{"name": "sv", "secret": {"secretName": "s"}}]
    mounts = [{"name": "sv", "mountPath": "/etc/sec"}]
    manifest = _echo(
        env, vols, mounts, "echo $V; cat /etc/sec/k; echo; touch /etc/sec/x || echo ro"
    )
    result = _run(manifest, tmp_path, store, isolate=True)
    assert result.phase == "Succeeded", result.message
    # read-only, as the kubelet mounts it
    assert result.node("wf")["outputs"]["result"] == "pw\npw\nro"


def test_nested_child_workflows_are_bounded(tmp_path, monkeypatch):
    """Workflows creating workflows (five levels deep): the child count ends the chain."""
    from ckptflow.workflows.runner import controllers

    monkeypatch.setattr(controllers, "MAX_CHILD_WORKFLOWS", 3)
    inner = _wf({"name": "leaf", "container": {"image": "x", "command": ["true"]}})
    for _ in range(5):
        inner["metadata"] = {"generateName": "level-"}
        inner = _wf(
            _res(
                "make", "create", inner,
                successCondition="status.phase == Succeeded",
                failureCondition="status.phase in (Failed, Error)",
            )
        )  # fmt: skip
    result = _run(inner, tmp_path)
    assert result.phase == "Failed"
    runs = list((tmp_path / "w").rglob("status.json"))
    assert len(runs) == 1 + 3  # the top run and three children, no more


def test_a_store_shared_by_two_runs_keeps_no_hooks_of_the_first(tmp_path):
    store = ob.ObjectStore()
    _run(_wf(_res("make", "create", CM)), tmp_path / "one", store)
    assert store.on_create == [] and store.on_delete == []
    child = _wf({"name": "c", "container": {"image": "x", "command": ["true"]}})
    child["metadata"] = {"name": "kid"}
    result = _run(
        _wf(_res("make", "create", child, successCondition="status.phase == Succeeded")),
        tmp_path / "two",
        store,
    )
    assert result.phase == "Succeeded", result.message
    assert (tmp_path / "two" / "w" / "workflows" / "kid" / "status.json").is_file()
    assert not (tmp_path / "one" / "w" / "workflows").exists()
