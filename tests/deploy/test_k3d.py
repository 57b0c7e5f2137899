"""The k3d recipe: its cluster config, the Argo Server patches and the cluster scripts."""

from __future__ import annotations

import json
import re
import subprocess
from urllib.parse import urlsplit

import jsonschema
import yaml
from ckptflow.workflows.config import PlatformConfig

from tests.deploy.schemas import K3D_CONFIG, REPO, k3d_port_map, validate_definition

DEPLOY = REPO / "deploy"
ARGO_MANIFEST = "https://github.com/argoproj/argo-workflows/releases/download/v4.1.2/install.yaml"

_NODE_FILTERS = {
    "type": "array",
    "items": {"type": "string", "pattern": r"^(loadbalancer|all|(server|agent):(\*|\d+))$"},
}
# The part of k3d's `k3d.io/v1alpha5` Simple config that the recipe uses; unknown fields fail.
K3D_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "servers", "image"],
    "properties": {
        "apiVersion": {"const": "k3d.io/v1alpha5"},
        "kind": {"const": "Simple"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9-]+$"}},
        },
        "servers": {"type": "integer", "minimum": 1},
        "agents": {"type": "integer", "minimum": 0},
        "image": {"type": "string", "pattern": r"^rancher/k3s:v\d+\.\d+\.\d+-k3s\d+$"},
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["port", "nodeFilters"],
                "properties": {
                    "port": {
                        "type": "string",
                        "pattern": r"^(\d+\.\d+\.\d+\.\d+:)?\d+:\d+(/tcp|/udp)?$",
                    },
                    "nodeFilters": _NODE_FILTERS,
                },
            },
        },
        "options": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "k3d": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"wait": {"type": "boolean"}, "timeout": {"type": "string"}},
                },
                "k3s": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "extraArgs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "arg": {"type": "string", "pattern": "^--"},
                                    "nodeFilters": _NODE_FILTERS,
                                },
                            },
                        }
                    },
                },
                "kubeconfig": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "updateDefaultKubeconfig": {"type": "boolean"},
                        "switchCurrentContext": {"type": "boolean"},
                    },
                },
            },
        },
    },
}


def test_k3d_config_is_valid_and_pinned():
    config = yaml.safe_load(K3D_CONFIG.read_text())
    jsonschema.Draft7Validator(K3D_SCHEMA).validate(config)
    ports = k3d_port_map()
    assert len(ports) == len(config["ports"]), "a host port is mapped twice"
    for entry in config["ports"]:
        assert entry["port"].startswith("127.0.0.1:"), "dev services stay on loopback"
    # The header comment documents every mapping.
    for host, node in ports.items():
        assert re.search(rf"#\s+{host} -> {node}\b", K3D_CONFIG.read_text()), (host, node)


def test_argo_server_patches_are_valid():
    ops = json.loads((DEPLOY / "k3d" / "argo-server-patch.json").read_text())
    assert {op["op"] for op in ops} <= {"add", "replace"}
    by_path = {op["path"]: op["value"] for op in ops}
    args = by_path["/spec/template/spec/containers/0/args"]
    assert args[0] == "server" and "--auth-mode=server" in args and "--secure=false" in args
    probe = by_path["/spec/template/spec/containers/0/readinessProbe"]
    validate_definition(probe, "io.k8s.api.core.v1.Probe")
    # --secure=false serves plain HTTP: an HTTPS probe would never pass.
    assert probe["httpGet"]["scheme"] == "HTTP"

    service = yaml.safe_load((DEPLOY / "k3d" / "argo-server-service-patch.yaml").read_text())
    assert service["spec"]["type"] == "NodePort"
    (port,) = service["spec"]["ports"]
    validate_definition(port, "io.k8s.api.core.v1.ServicePort")
    assert k3d_port_map()[2746] == port["nodePort"]


def test_default_argo_ui_is_the_servers_scheme_and_port():
    """`submit` and the printed links use platform.argo_ui: https against a server run with
    --secure=false fails the TLS handshake."""
    ops = json.loads((DEPLOY / "k3d" / "argo-server-patch.json").read_text())
    args = next(op["value"] for op in ops if op["path"].endswith("/containers/0/args"))
    url = urlsplit(PlatformConfig().argo_ui)
    assert url.scheme == ("http" if "--secure=false" in args else "https"), url.geturl()
    assert url.hostname == "localhost" and url.port in k3d_port_map()
    service = yaml.safe_load((DEPLOY / "k3d" / "argo-server-service-patch.yaml").read_text())
    assert k3d_port_map()[url.port] == service["spec"]["ports"][0]["nodePort"]


def test_cluster_scripts_parse_and_use_the_pinned_argo_release():
    up = (DEPLOY / "cluster-up.sh").read_text()
    for script in ("cluster-up.sh", "cluster-down.sh"):
        path = DEPLOY / script
        assert path.stat().st_mode & 0o111, f"{script} is not executable"
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert "ARGO_VERSION=v4.1.2" in up
    url = ARGO_MANIFEST.replace("v4.1.2", "${ARGO_VERSION}")
    assert f"ARGO_MANIFEST={url}" in up
    assert "--server-side" in up  # v4's full CRDs exceed client-side apply's size limit
    for ref in re.findall(r"deploy/[\w./-]+", up):
        assert (REPO / ref).exists(), f"cluster-up.sh names a missing {ref}"
    # The URLs it prints are the host ports k3d maps.
    for host_port in (2746, 5050, 9090, 9091):
        assert host_port in k3d_port_map() and f"localhost:{host_port}" in up


def test_makefile_targets_call_the_recipe():
    makefile = (REPO / "Makefile").read_text()
    for target in ("image", "cluster", "cluster-down", "e2e"):
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), target
    assert "-f images/step.Dockerfile" in makefile
    assert "deploy/cluster-up.sh" in makefile and "deploy/cluster-down.sh" in makefile


def test_ci_workflow_runs_the_recipe_with_a_pinned_k3d():
    ci = yaml.safe_load((REPO / ".github" / "workflows" / "e2e.yml").read_text())
    assert re.fullmatch(r"v\d+\.\d+\.\d+", ci["env"]["K3D_VERSION"])
    (job,) = ci["jobs"].values()
    runs = [s.get("run", "") for s in job["steps"]]
    for command in ("make image", "make cluster", "make e2e", "make cluster-down"):
        assert any(r.strip() == command for r in runs), command
    cleanup = next(s for s in job["steps"] if s.get("run", "").strip() == "make cluster-down")
    assert cleanup["if"] == "always()"
    # The schema checks run before the cluster, on the vendored schema alone.
    offline = next(r for r in runs if "pytest" in r and "-m" not in r.split("pytest", 1)[1])
    assert "tests/deploy" in offline and "tests/workflows/test_render.py" in offline
    assert not any("shared" in r for r in runs), "the hosted runner has no ../shared"
