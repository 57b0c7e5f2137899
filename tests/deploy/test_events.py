"""deploy/ installs what the rendered evaluate-on-commit objects use (issue 33 point 6): Argo
Events pinned like Argo Workflows, the EventBus the EventSource and Sensor name, the Sensor's
service account with RBAC to submit, and the roles a submitter needs; cluster-up.sh applies
them and waits for them; the README says how to check each is ready."""

from __future__ import annotations

import re

import pytest
from ckptflow.workflows.config import PipelineConfig
from ckptflow.workflows.render import manifests

from tests.deploy.schemas import REPO, kustomize_build

CLUSTER_UP = (REPO / "deploy" / "cluster-up.sh").read_text()


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return kustomize_build()


def _find(objects, kind, name, namespace):
    got = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and o["metadata"].get("namespace") == namespace
    ]
    assert got, f"deploy/k8s has no {kind} {namespace}/{name}"
    return got[0]


def _rules(objects, sa: str, ns: str) -> list[dict]:
    """The rules of every Role bound to service account `sa`."""
    out = []
    for b in (o for o in objects if o["kind"] == "RoleBinding"):
        if any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            out += _find(objects, "Role", b["roleRef"]["name"], ns)["rules"]
    return out


def _allows(rules, resource: str, verb: str) -> bool:
    return any(
        "argoproj.io" in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
        for r in rules
    )


def test_the_rendered_sensor_and_event_source_find_what_they_use(objects):
    docs = {d["kind"]: d for d in manifests("evaluate", PipelineConfig())}
    sensor, source = docs["Sensor"], docs["EventSource"]
    ns = sensor["metadata"]["namespace"]
    sa = sensor["spec"]["template"]["serviceAccountName"]
    _find(objects, "ServiceAccount", sa, ns)
    assert _allows(_rules(objects, sa, ns), "workflows", "create")
    for doc in (sensor, source):
        bus = doc["spec"].get("eventBusName", "default")
        eventbus = _find(objects, "EventBus", bus, doc["metadata"]["namespace"])
        version = eventbus["spec"]["jetstream"]["version"]
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), "pin the NATS version, never latest"


def test_a_submitter_role_can_submit_and_follow(objects):
    rules = _rules(objects, "ckptflow-submitter", "ckptflow")
    for resource in ("workflows", "workflowtemplates", "cronworkflows", "sensors", "eventsources"):
        assert _allows(rules, resource, "create"), resource
    assert any("pods/log" in r["resources"] and "get" in r["verbs"] for r in rules)


def test_cluster_up_installs_argo_events_pinned_and_waits_for_it():
    version = re.search(r"^ARGO_EVENTS_VERSION=(v\d+\.\d+\.\d+)$", CLUSTER_UP, re.M)
    assert version, "cluster-up.sh pins ARGO_EVENTS_VERSION"
    url = "https://github.com/argoproj/argo-events/releases/download/${ARGO_EVENTS_VERSION}/install.yaml"
    assert url in CLUSTER_UP
    # before deploy/k8s: its EventBus needs the CRD
    assert CLUSTER_UP.index('ARGO_EVENTS_MANIFEST"') < CLUSTER_UP.index("-k deploy/k8s")
    assert "rollout status deployment/controller-manager" in CLUSTER_UP
    assert "eventbus/default" in CLUSTER_UP


def test_the_readme_says_how_to_check_each_is_ready():
    readme = (REPO / "README.md").read_text()
    for check in (
        "kubectl -n argo-events rollout status deployment/controller-manager",
        "kubectl -n ckptflow get eventbus default",
        "kubectl -n ckptflow auth can-i create workflows --as=system:serviceaccount:ckptflow:ckptflow-sensor",
    ):
        assert check in readme, check
