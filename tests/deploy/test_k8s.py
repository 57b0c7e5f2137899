"""deploy/k8s builds offline with `kubectl kustomize`, and every rendered object is valid."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.schemas import (
    DNS_1123,
    K8S_DIR,
    is_pinned_image,
    k3d_port_map,
    kustomize_build,
    validate_definition,
)

# kind -> (apiVersion, namespaced, allowed top-level keys)
KINDS = {
    "Namespace": ("v1", False, {"spec"}),
    "Secret": ("v1", True, {"type", "stringData", "data"}),
    "ConfigMap": ("v1", True, {"data"}),
    "ServiceAccount": ("v1", True, set()),
    "PersistentVolumeClaim": ("v1", True, {"spec"}),
    "Service": ("v1", True, {"spec"}),
    "Deployment": ("apps/v1", True, {"spec"}),
    "Job": ("batch/v1", True, {"spec"}),
    "Role": ("rbac.authorization.k8s.io/v1", True, {"rules"}),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", True, {"roleRef", "subjects"}),
    "EventBus": ("argoproj.io/v1alpha1", True, {"spec"}),  # Argo Events' CRD (test_events.py)
}
POD_SPEC_KEYS = {
    "containers",
    "volumes",
    "restartPolicy",
    "serviceAccountName",
    "securityContext",
    "nodeSelector",
    "tolerations",
}
# Keys the Argo controller reads from its ConfigMap that we set.
CONTROLLER_KEYS = {"artifactRepository", "links"}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return kustomize_build()


def _find(objects, kind, name, namespace=None):
    for o in objects:
        md = o["metadata"]
        if o["kind"] == kind and md["name"] == name and md.get("namespace") == namespace:
            return o
    raise AssertionError(f"no {kind} {namespace}/{name} in deploy/k8s")


def _pod_specs(objects):
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            yield o, o["spec"]["template"]["spec"]


def _secret_keys(secret) -> set[str]:
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def test_builds_offline_with_no_remote_resources(objects):
    text = (K8S_DIR / "kustomization.yaml").read_text()
    kustomization = yaml.safe_load(text)
    for res in kustomization["resources"]:
        assert "://" not in res and not res.startswith("github.com"), f"remote resource {res}"
        assert (K8S_DIR / res).exists(), res
    assert {o["kind"] for o in objects} == set(KINDS)


def test_every_object_is_well_formed(objects):
    seen = set()
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    for o in objects:
        api, namespaced, keys = KINDS[o["kind"]]
        md = o["metadata"]
        where = f"{o['kind']} {md.get('namespace')}/{md['name']}"
        assert o["apiVersion"] == api, where
        assert set(o) - {"apiVersion", "kind", "metadata"} <= keys, where
        assert DNS_1123.match(md["name"].replace(".", "-")), where
        assert md["labels"]["app.kubernetes.io/part-of"] == "ckptflow", where
        if namespaced:
            # `argo` is created by the cluster script before Argo's own manifest.
            assert md.get("namespace") in namespaces | {"argo"}, where
        else:
            assert "namespace" not in md, where
        assert (o["kind"], md.get("namespace"), md["name"]) not in seen, f"duplicate {where}"
        seen.add((o["kind"], md.get("namespace"), md["name"]))


def test_pod_templates_validate_against_the_core_schema(objects):
    for owner, spec in _pod_specs(objects):
        assert set(spec) <= POD_SPEC_KEYS, owner["metadata"]["name"]
        for container in spec["containers"]:
            validate_definition(container, "io.k8s.api.core.v1.Container")
            assert is_pinned_image(container["image"]), container["image"]
            assert container["resources"]["requests"], "every container requests resources"
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
        for volume in spec.get("volumes", []):
            validate_definition(volume, "io.k8s.api.core.v1.Volume")
        if owner["kind"] == "Deployment":
            labels = owner["spec"]["template"]["metadata"]["labels"]
            assert owner["spec"]["selector"]["matchLabels"].items() <= labels.items()
        else:
            assert spec["restartPolicy"] in ("OnFailure", "Never")


def test_references_resolve(objects):
    """Secrets and their keys, volume claims, service accounts and role bindings all exist."""
    for owner, spec in _pod_specs(objects):
        ns = owner["metadata"]["namespace"]
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in _secret_keys(_find(objects, "Secret", ref["name"], ns))
            for source in container.get("envFrom", []):
                _find(objects, "Secret", source["secretRef"]["name"], ns)
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in spec.get("volumes", [])}
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                pvc = _find(objects, "PersistentVolumeClaim", claim, ns)
                validate_definition(pvc["spec"], "io.k8s.api.core.v1.PersistentVolumeClaimSpec")
        if "serviceAccountName" in spec:
            _find(objects, "ServiceAccount", spec["serviceAccountName"], ns)
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        ns = binding["metadata"]["namespace"]
        _find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"], ns)
        for subject in binding["subjects"]:
            _find(objects, subject["kind"], subject["name"], subject["namespace"])


def test_services_select_pods_and_name_their_ports(objects):
    node_ports = []
    for svc in (o for o in objects if o["kind"] == "Service"):
        ns = svc["metadata"]["namespace"]
        targets = [
            d
            for d in objects
            if d["kind"] == "Deployment"
            and d["metadata"]["namespace"] == ns
            and svc["spec"]["selector"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, f"service {svc['metadata']['name']} selects {len(targets)}"
        container_ports = {
            p["name"]: p["containerPort"]
            for c in targets[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            validate_definition(port, "io.k8s.api.core.v1.ServicePort")
            assert port["targetPort"] in container_ports, port
            if "nodePort" in port:
                assert 30000 <= port["nodePort"] <= 32767
                node_ports.append(port["nodePort"])
    assert len(node_ports) == len(set(node_ports))
    # Every node port is reachable from the host through the k3d cluster's port mappings.
    assert set(node_ports) <= set(k3d_port_map().values())


def _service_port(objects, url_or_host: str) -> tuple[dict, int]:
    """The Service and port a `http://name.ns.svc:port` (or `name.ns.svc:port`) names."""
    parts = urlsplit(url_or_host if "://" in url_or_host else f"http://{url_or_host}")
    name, ns, *_ = parts.hostname.split(".")
    svc = _find(objects, "Service", name, ns)
    assert parts.port in [p["port"] for p in svc["spec"]["ports"]], url_or_host
    return svc, parts.port


def _created_buckets(objects) -> set[str]:
    job = _find(objects, "Job", "minio-buckets", "ckptflow")
    script = " ".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
    return set(re.findall(r"local/([a-z0-9-]+)", script))


def test_s3_secret_points_at_the_in_cluster_minio(objects):
    secret = _find(objects, "Secret", "ckptflow-s3", "ckptflow")
    data = secret["stringData"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"} <= set(data)
    svc, _ = _service_port(objects, data["AWS_ENDPOINT_URL"])
    assert svc["metadata"]["name"] == "minio"
    assert _created_buckets(objects) == {"ckptflow", "ckptflow-archive"}


def test_mlflow_stores_artifacts_in_a_created_bucket(objects):
    mlflow = _find(objects, "Deployment", "mlflow", "ckptflow")
    container = mlflow["spec"]["template"]["spec"]["containers"][0]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"])
    assert urlsplit(args["artifacts-destination"]).netloc in _created_buckets(objects)
    assert args["backend-store-uri"].startswith("sqlite:////mlflow/")
    # The in-cluster name that workflow pods use must pass MLflow's Host-header check.
    assert "mlflow.ckptflow.svc:5000" in args["allowed-hosts"].split(",")
    env = {e["name"] for e in container["env"]}
    assert {"MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env


def test_workflow_rbac_grants_what_the_executor_needs(objects):
    role = _find(objects, "Role", "ckptflow-workflow", "ckptflow")
    assert {
        "apiGroups": ["argoproj.io"],
        "resources": ["workflowtaskresults"],
        "verbs": ["create", "patch"],
    } in role["rules"]


def test_controller_config_validates_against_argo_schema(objects):
    config = _find(objects, "ConfigMap", "workflow-controller-configmap", "argo")
    assert set(config["data"]) <= CONTROLLER_KEYS
    repo = yaml.safe_load(config["data"]["artifactRepository"])
    validate_definition(repo, "io.argoproj.workflow.v1alpha1.ArtifactRepository")
    s3 = repo["s3"]
    _service_port(objects, s3["endpoint"])
    assert s3["bucket"] in _created_buckets(objects)
    # Workflows run in `ckptflow`: the artifact keys' Secret must exist there.
    for ref in (s3["accessKeySecret"], s3["secretKeySecret"]):
        assert ref["key"] in _secret_keys(_find(objects, "Secret", ref["name"], "ckptflow"))

    links = yaml.safe_load(config["data"]["links"])
    for link in links:
        validate_definition(link, "io.argoproj.workflow.v1alpha1.Link")
    run_link = next(link for link in links if link["scope"] == "workflow")
    # The parent run is named after the workflow (workflows/staged_workflow.py): the link searches
    # the experiment for that run name.
    url = urlsplit(run_link["url"])
    assert re.fullmatch(r"/experiments/\d+", url.fragment.split("?")[0])
    assert "searchFilter=attributes.run_name%3D%22${metadata.name}%22" in url.fragment
    # The link's host port reaches MLflow's node port through k3d.
    mlflow_svc = _find(objects, "Service", "mlflow", "ckptflow")
    assert k3d_port_map()[url.port] == mlflow_svc["spec"]["ports"][0]["nodePort"]


def test_workflow_defaults_match_the_deployment(objects):
    """ckptflow.workflows.config's platform defaults name what deploy/k8s creates."""
    config = pytest.importorskip(
        "ckptflow.workflows.config", reason="workflows (hera) not installed"
    )
    platform = config.PlatformConfig()
    ns = platform.namespace
    _find(objects, "Namespace", ns)
    _find(objects, "ServiceAccount", platform.service_account, ns)
    secret = _find(objects, "Secret", platform.s3_secret, ns)
    assert {platform.s3_access_key_key, platform.s3_secret_key_key} <= _secret_keys(secret)
    svc, _ = _service_port(objects, platform.s3_endpoint)
    assert svc["metadata"]["name"] == "minio"
    svc, port = _service_port(objects, platform.mlflow_tracking_uri)
    mlflow = _find(objects, "Deployment", "mlflow", ns)["spec"]["template"]["spec"]
    allowed = next(a for a in mlflow["containers"][0]["args"] if a.startswith("--allowed-hosts="))
    host = urlsplit(platform.mlflow_tracking_uri).netloc
    assert host in allowed.split("=", 1)[1].split(","), f"MLflow would reject Host {host}"
    assert platform.storage_root.removeprefix("s3://").split("/")[0] in _created_buckets(objects)
    makefile = (K8S_DIR.parents[1] / "Makefile").read_text()
    assert f"IMAGE ?= {platform.image}" in makefile, "make image must build platform.image"


def _rendered_containers():
    """Every container and script of every rendered workflow."""
    render = pytest.importorskip(
        "ckptflow.workflows.render", reason="workflows (hera) not installed"
    )
    for name in render.BUILDER_NAMES:
        manifest = render.builder(name).build(render.config([])).to_dict()
        spec = manifest["spec"].get("workflowSpec", manifest["spec"])
        for template in spec["templates"]:
            for kind in ("container", "script"):
                if kind in template:
                    yield name, template["name"], template[kind]


def test_s3_secret_comment_says_how_each_consumer_reads_it(objects):
    """Workflow pods take the keys one secretKeyRef per variable, never envFrom: the
    Secret's header says so, and names envFrom only where deploy/k8s uses it."""
    config = pytest.importorskip("ckptflow.workflows.config", reason="workflows not installed")
    platform = config.PlatformConfig()
    want = {
        ("AWS_ACCESS_KEY_ID", platform.s3_secret, platform.s3_access_key_key),
        ("AWS_SECRET_ACCESS_KEY", platform.s3_secret, platform.s3_secret_key_key),
    }
    seen = 0
    for workflow, template, container in _rendered_containers():
        assert "envFrom" not in container, f"{workflow}/{template}"
        refs = {
            (
                e["name"],
                e["valueFrom"]["secretKeyRef"]["name"],
                e["valueFrom"]["secretKeyRef"]["key"],
            )
            for e in container.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        assert refs in (set(), want), f"{workflow}/{template}: {refs}"
        seen += bool(refs)
    assert seen, "no rendered step reads the S3 Secret"
    header = (K8S_DIR / "s3-secret.yaml").read_text().split("\napiVersion:")[0]
    assert "secretKeyRef" in header and "envFrom: secretRef" not in header
    env_from = [
        owner["metadata"]["name"]
        for owner, spec in _pod_specs(objects)
        for c in spec["containers"]
        if any(
            s.get("secretRef", {}).get("name") == platform.s3_secret for s in c.get("envFrom", [])
        )
    ]
    assert ("envFrom" in header) == bool(env_from), env_from
