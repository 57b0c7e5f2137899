"""minio-compose.yaml parses, pins every image, health-checks every service, and agrees
with the cluster manifests and the project's pins."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from tests.deploy.schemas import K8S_DIR, REPO, is_pinned_image

COMPOSE = REPO / "minio-compose.yaml"
SERVICE_KEYS = {
    "image",
    "command",
    "entrypoint",
    "environment",
    "ports",
    "volumes",
    "healthcheck",
    "depends_on",
    "restart",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_parses_with_known_keys_only(compose):
    assert set(compose) <= {"name", "services", "volumes"}
    assert set(compose["services"]) == {"minio", "buckets", "mlflow"}
    for name, service in compose["services"].items():
        assert set(service) <= SERVICE_KEYS, f"{name}: unknown keys {set(service) - SERVICE_KEYS}"


def test_every_service_has_a_pinned_image_and_a_healthcheck(compose):
    for name, service in compose["services"].items():
        assert is_pinned_image(service["image"]), f"{name}: {service['image']} is not pinned"
        check = service["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL") and len(check["test"]) > 1, name
        assert "disable" not in check, name


def test_dependencies_exist_and_one_shots_are_awaited(compose):
    services = compose["services"]
    for name, service in services.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert spec["condition"] in CONDITIONS
    # `up --wait` treats an exited container as a failure unless a service waits for it to
    # complete: every one-shot job is awaited that way.
    awaited = {
        dep
        for s in services.values()
        for dep, spec in s.get("depends_on", {}).items()
        if spec["condition"] == "service_completed_successfully"
    }
    one_shots = {n for n, s in services.items() if s.get("restart") == "no"}
    assert one_shots == awaited == {"buckets"}


def test_ports_and_credentials_are_documented(compose):
    text = COMPOSE.read_text()
    header = text.split("\nname:")[0]
    for service in compose["services"].values():
        for mapping in service.get("ports", []):
            host = mapping.split(":")[-2]
            assert re.search(rf"#\s+{host}\s", header), f"port {host} not documented"
    assert "DEVELOPMENT ONLY" in header and "minioadmin" in header
    minio = compose["services"]["minio"]["environment"]
    assert f"{minio['MINIO_ROOT_USER']} / {minio['MINIO_ROOT_PASSWORD']}" in header
    # The `minio` tests' skip message names this endpoint.
    assert "CKPTFLOW_MINIO_ENDPOINT=http://127.0.0.1:9000" in header
    named = {v.split(":")[0] for s in compose["services"].values() for v in s.get("volumes", [])}
    assert named <= set(compose["volumes"])


def test_every_published_port_is_bound_to_loopback(compose):
    """The development credentials must not be reachable from other machines: a bare
    "HOST:CONTAINER" publishes on every interface."""
    published = [(n, m) for n, s in compose["services"].items() for m in s.get("ports", [])]
    assert published
    for name, mapping in published:
        assert isinstance(mapping, str), f'{name}: write ports as "127.0.0.1:HOST:CONTAINER"'
        ip, host, container = mapping.split(":")
        assert ip == "127.0.0.1", f"{name}: {mapping} is published beyond loopback"
        assert host.isdigit() and container.isdigit(), mapping
    assert "127.0.0.1 only" in COMPOSE.read_text().split("\nname:")[0]


def test_buckets_and_mlflow_artifacts(compose):
    script = compose["services"]["buckets"]["command"][0]
    buckets = set(re.findall(r"local/([a-z0-9-]+)", script.split("mc mb", 1)[1].splitlines()[0]))
    assert buckets == {"ckptflow", "ckptflow-archive"}
    mlflow = compose["services"]["mlflow"]
    args = dict(a.lstrip("-").split("=", 1) for a in mlflow["command"] if a.startswith("--"))
    assert args["artifacts-destination"].removeprefix("s3://").split("/")[0] in buckets
    assert args["backend-store-uri"].startswith("sqlite:////mlflow/")
    assert "mlflow:5000" in args["allowed-hosts"].split(",")
    env = mlflow["environment"]
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert (
        env["AWS_ACCESS_KEY_ID"] == compose["services"]["minio"]["environment"]["MINIO_ROOT_USER"]
    )


def test_images_match_the_cluster_and_the_tested_mlflow(compose):
    cluster_images = set(
        re.findall(r"image: (\S+)", "".join(p.read_text() for p in K8S_DIR.glob("*.yaml")))
    )
    assert {s["image"] for s in compose["services"].values()} == cluster_images
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    mlflow_pin = next(d for d in pins["optional-dependencies"]["steps"] if d.startswith("mlflow=="))
    version = mlflow_pin.split("==")[1]
    assert compose["services"]["mlflow"]["image"].startswith(f"ghcr.io/mlflow/mlflow:v{version}")
