"""Argo controller rules the local runner follows, each on a small manifest: a daemon that
exits (workflow/controller/operator.go assessNodeStatus) and retry affinity
(workflow/controller/retry_tweak.go RetryOnDifferentHost)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.cluster import default_cluster
from ckptflow.workflows.runner.execute import add_hostnames_to_affinity

SH = "python:3-alpine"


def run(manifest: dict, tmp_path: Path, name: str, **kwargs):
    return run_workflow(
        manifest, workdir=str(tmp_path / name), name=name, stream=io.StringIO(), **kwargs
    )


def leaf(name: str, code: str, **extra) -> dict:
    return {"name": name, "container": {"image": SH, "command": ["sh", "-c", code]}, **extra}


def dag_workflow(templates: list[dict], tasks: list[dict], **spec) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "rules-"},
        "spec": {
            "entrypoint": "main",
            "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
            **spec,
        },
    }


def test_a_daemon_that_exits_zero_fails_and_is_retried(tmp_path):
    manifest = dag_workflow(
        [
            leaf("quits", "exit 0", daemon=True, retryStrategy={"limit": 1}),
            leaf("work", "sleep 1"),
        ],
        [{"name": "d", "template": "quits"}, {"name": "w", "template": "work"}],
    )
    result = run(manifest, tmp_path, "daemon-exit")
    retry = result.node("daemon-exit.d")
    assert retry["type"] == "Retry" and retry["phase"] == "Failed"
    attempts = [n for n in result.nodes.values() if n["displayName"].startswith("d(")]
    assert sorted(n["displayName"] for n in attempts) == ["d(0)", "d(1)"]
    for n in attempts:
        assert n["phase"] == "Failed"
        assert n["message"] == "Daemoned pod succeeded. Marking it as failed"
    assert result.phase == "Failed"


def test_a_daemon_stopped_at_the_end_of_its_scope_succeeds(tmp_path):
    manifest = dag_workflow(
        [leaf("serve", "sleep 60", daemon=True), leaf("work", "sleep 0.5")],
        [{"name": "d", "template": "serve"}, {"name": "w", "template": "work"}],
    )
    result = run(manifest, tmp_path, "daemon-stop")
    assert result.node("daemon-stop.d")["phase"] == "Succeeded"
    assert result.phase == "Succeeded"


def test_add_hostnames_to_affinity_follows_argo():
    assert add_hostnames_to_affinity("kubernetes.io/hostname", ["a"], None) == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]}
                    ]}
                ]
            }
        }
    }  # fmt: skip
    existing = add_hostnames_to_affinity("kubernetes.io/hostname", ["a"], None)
    merged = add_hostnames_to_affinity("kubernetes.io/hostname", ["a", "b"], existing)
    term = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["a", "b"]
    other = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}  # fmt: skip
    merged = add_hostnames_to_affinity("kubernetes.io/hostname", ["a"], other)
    exprs = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert [e["key"] for e in exprs] == ["zone", "kubernetes.io/hostname"]
    assert (
        other["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"][0]["key"]
        == "zone"
    )  # the template is not changed


def test_a_retry_with_node_anti_affinity_cannot_run_on_the_one_node(tmp_path):
    """Without a cluster model the runner is one node: the retry must avoid it, so it stays
    Pending (the scheduler's message) until the workflow's deadline fails it."""
    strategy = {"limit": 2, "affinity": {"nodeAntiAffinity": {}}}
    manifest = dag_workflow(
        [leaf("flaky", "exit 1", retryStrategy=strategy)],
        [{"name": "r", "template": "flaky"}],
        activeDeadlineSeconds=3,
    )
    result = run(manifest, tmp_path, "anti")
    first, second = result.node("anti.r(0)"), result.node("anti.r(1)")
    assert first["phase"] == "Failed" and first["hostNodeName"]
    assert second["phase"] == "Failed"
    assert "hostNodeName" not in second  # never bound to a node
    assert second["message"] in ("Step exceeded its deadline", "Max duration limit exceeded")
    assert "anti.r(2)" not in {n["name"] for n in result.nodes.values()}
    assert result.phase == "Failed"


def test_a_retry_without_anti_affinity_runs_on_the_same_node(tmp_path):
    manifest = dag_workflow(
        [leaf("flaky", "test -e x || { touch x; exit 1; }", retryStrategy={"limit": 2})],
        [{"name": "r", "template": "flaky"}],
    )
    result = run(manifest, tmp_path, "same", cwd=str(tmp_path))
    assert result.phase == "Succeeded"
    first, second = result.node("same.r(0)"), result.node("same.r(1)")
    assert second["phase"] == "Succeeded"
    assert first["hostNodeName"] == second["hostNodeName"] == default_cluster().nodes[0].name


def test_an_empty_timeout_is_no_deadline(tmp_path):
    """`timeout: "{{workflow.parameters.t}}"` left "" sets none (operator.go
    checkTemplateTimeouts reads `tmpl.Timeout != ""`); a value ends the pod."""
    manifest = dag_workflow(
        [leaf("work", "sleep 1.5", timeout="{{workflow.parameters.t}}")],
        [{"name": "w", "template": "work"}],
        arguments={"parameters": [{"name": "t", "value": ""}]},
    )
    assert run(manifest, tmp_path, "none").phase == "Succeeded"
    cut = run(manifest, tmp_path, "cut", arguments={"t": "1"})
    assert cut.phase == "Failed"
    assert "deadline" in cut.node("cut.w")["message"]


@pytest.mark.parametrize(
    "strategy, deleted",
    [
        ("OnPodSuccess", {"ok"}),
        ("OnPodCompletion", {"ok", "bad"}),
        ("OnWorkflowCompletion", {"ok", "bad"}),
        ("OnWorkflowSuccess", set()),  # the workflow failed
        ("", set()),
    ],
)
def test_pod_gc_marks_the_pods_argo_deletes(tmp_path, strategy, deleted):
    """cleanup.go determinePodCleanupAction: a deleted pod's logs are gone on Argo."""
    manifest = dag_workflow(
        [leaf("ok", "true"), leaf("bad", "exit 3")],
        [{"name": "ok", "template": "ok"}, {"name": "bad", "template": "bad"}],
        podGC={"strategy": strategy},
    )
    result = run(manifest, tmp_path, "gc")
    assert result.phase == "Failed"
    got = {n["displayName"] for n in result.nodes.values() if n["local"].get("podDeleted")}
    assert got == deleted
    assert all(
        Path(n["local"]["logFile"]).exists() for n in result.nodes.values() if n["type"] == "Pod"
    )


def test_pod_gc_label_selector_limits_what_is_deleted(tmp_path):
    manifest = dag_workflow(
        [leaf("keep", "true"), leaf("drop", "true", metadata={"labels": {"gc": "yes"}})],
        [{"name": "keep", "template": "keep"}, {"name": "drop", "template": "drop"}],
        podGC={"strategy": "OnPodSuccess", "labelSelector": {"matchLabels": {"gc": "yes"}}},
    )
    result = run(manifest, tmp_path, "sel")
    got = {n["displayName"] for n in result.nodes.values() if n["local"].get("podDeleted")}
    assert result.phase == "Succeeded" and got == {"drop"}


@pytest.mark.parametrize(
    "pod_gc, phrase",
    [
        ({"strategy": "Sometimes"}, "unknown strategy 'Sometimes'"),
        ({"strategy": "OnPodSuccess", "labelSelector": {"matchExpressions": []}}, "matchLabels"),
    ],
)
def test_a_pod_gc_argo_refuses_or_the_runner_cannot_read_is_refused(tmp_path, pod_gc, phrase):
    manifest = dag_workflow([leaf("ok", "true")], [{"name": "ok", "template": "ok"}], podGC=pod_gc)
    with pytest.raises(SpecError, match=phrase):
        run(manifest, tmp_path, "bad-gc")


def test_a_pending_pod_is_not_ended_by_its_active_deadline(tmp_path):
    """A pod's activeDeadlineSeconds counts from its start on a node (Kubernetes sets
    startTime once bound), so an unschedulable retry is ended by the workflow's deadline
    (operator.go: "Step exceeded its deadline"), not by its own."""
    strategy = {"limit": 1, "affinity": {"nodeAntiAffinity": {}}}
    manifest = dag_workflow(
        [leaf("flaky", "exit 1", retryStrategy=strategy, activeDeadlineSeconds=1)],
        [{"name": "r", "template": "flaky"}],
        activeDeadlineSeconds=3,
    )
    result = run(manifest, tmp_path, "pend")
    assert result.node("pend.r(1)")["message"] == "Step exceeded its deadline"


def test_retry_affinity_on_a_dag_template_is_refused(tmp_path):
    manifest = dag_workflow([leaf("ok", "true")], [{"name": "ok", "template": "ok"}])
    manifest["spec"]["templates"][0]["retryStrategy"] = {"affinity": {"nodeAntiAffinity": {}}}
    with pytest.raises(SpecError, match="retry affinity on a DAG/steps template"):
        run(manifest, tmp_path, "dag-aff")
