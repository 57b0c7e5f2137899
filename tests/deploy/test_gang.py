"""The optional gang-scheduling overlay (deploy/gang/): Kueue pinned, its queues valid for that
version's CRDs (vendored in tests/fixtures/kueue/) and sized for the default gang, the PodGroup
RBAC for Volcano and coscheduling."""

from __future__ import annotations

import hashlib
import re
import subprocess

import jsonschema
import pytest
import yaml
from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.gang_scheduling import DEFAULT_QUEUE
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner import gang
from ckptflow.workflows.runner.cluster import resource_units

from tests.deploy.schemas import REPO

GANG = REPO / "deploy" / "gang"
KUEUE = GANG / "kueue"
CRDS = REPO / "tests" / "fixtures" / "kueue"
VERSION = "v0.19.2"


def crd_schema(kind: str) -> dict:
    """The v1beta2 openAPIV3Schema of a vendored Kueue CRD, strict: every object that lists
    properties and does not preserve unknown fields refuses others."""
    for path in CRDS.glob("kueue.x-k8s.io_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
            schema = version["schema"]["openAPIV3Schema"]
            stack = [schema]
            while stack:
                node = stack.pop()
                if isinstance(node, dict):
                    if "properties" in node and not node.get(
                        "x-kubernetes-preserve-unknown-fields"
                    ):
                        node.setdefault("additionalProperties", False)
                    stack.extend(node.values())
                elif isinstance(node, list):
                    stack.extend(node)
            # metadata is the API server's ObjectMeta, not in the CRD's schema
            schema["properties"]["metadata"] = {"type": "object"}
            return schema
    raise AssertionError(f"no vendored CRD for {kind}")


def queues() -> list[dict]:
    return list(yaml.safe_load_all((KUEUE / "queues.yaml").read_text()))


def test_the_vendored_crds_are_the_documented_files():
    readme = (CRDS / "README.md").read_text()
    for digest, name in re.findall(r"sha256 `([0-9a-f]{64})` (\S+)", readme):
        assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == digest, name
    assert len(re.findall(r"sha256 `", readme)) == 3
    assert "Apache License" in (CRDS / "LICENSE").read_text()
    assert VERSION in readme


def test_queues_are_valid_kueue_v1beta2_objects():
    docs = queues()
    assert [d["kind"] for d in docs] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
    for doc in docs:
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        jsonschema.Draft7Validator(crd_schema(doc["kind"])).validate(doc)


def test_an_unknown_field_fails_the_schema_check():
    _, cq, _ = queues()
    cq["spec"]["resourceGroups"][0]["flavours"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd_schema("ClusterQueue")).validate(cq)


def test_the_queues_are_the_ones_the_rendered_ranks_name():
    flavor, cq, lq = queues()
    platform = PipelineConfig().platform
    assert lq["metadata"] == {"name": DEFAULT_QUEUE["kueue"], "namespace": platform.namespace}
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]
    selector = cq["spec"]["namespaceSelector"]["matchLabels"]
    assert selector == {"kubernetes.io/metadata.name": platform.namespace}
    (group,) = cq["spec"]["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    (doc,) = manifests(
        "pretrain", apply_overrides(PipelineConfig(), ["platform.gang_scheduler=kueue"])
    )
    rank = {t["name"]: t for t in doc["spec"]["templates"]}["pretrain-rank"]
    assert rank["metadata"]["labels"][gang.KUEUE_QUEUE_LABEL] == lq["metadata"]["name"]


def test_the_quota_admits_the_default_gang():
    """Kueue admits a pod group only when all of it fits the quota: the default ranks do."""
    _, cq, _ = queues()
    (flavor,) = cq["spec"]["resourceGroups"][0]["flavors"]
    quota = {
        r["name"]: resource_units(r["name"], r["nominalQuota"], "quota")
        for r in flavor["resources"]
    }
    cfg = PipelineConfig()
    res = cfg.pretrain.rank_resources
    need = {
        "cpu": resource_units("cpu", res.cpu, "cpu"),
        "memory": resource_units("memory", res.memory, "m"),
    }
    for name, units in need.items():
        assert cfg.pretrain.ranks * units <= quota[name], name
    assert set(group for group in cq["spec"]["resourceGroups"][0]["coveredResources"]) == set(need)


def test_install_script_pins_kueue_and_waits_for_it():
    text = (KUEUE / "install.sh").read_text()
    assert f"KUEUE_VERSION={VERSION}" in text
    url = (
        "https://github.com/kubernetes-sigs/kueue/releases/download/${KUEUE_VERSION}/manifests.yaml"
    )
    assert url in text and "--server-side" in text
    assert "deploy/kueue-controller-manager --for=condition=available" in text
    assert "clusterqueue/ckptflow --for=condition=Active" in text
    assert subprocess.run(["bash", "-n", str(KUEUE / "install.sh")]).returncode == 0
    assert (KUEUE / "install.sh").stat().st_mode & 0o111
    assert VERSION in (GANG / "README.md").read_text()


def test_podgroup_rbac_covers_both_podgroup_apis_for_the_workflow_account():
    role, binding = yaml.safe_load_all((GANG / "podgroup-rbac.yaml").read_text())
    platform = PipelineConfig().platform
    (rule,) = role["rules"]
    assert set(rule["apiGroups"]) == {api.split("/")[0] for api in gang.PODGROUP_API.values()}
    assert rule["resources"] == ["podgroups"]
    assert {"get", "create", "patch"} <= set(rule["verbs"])  # kubectl apply
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": platform.service_account,
            "namespace": platform.namespace,
        }
    ]
