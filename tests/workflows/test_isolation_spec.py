"""The pure parts of `--isolate` (runner/isolation.py): no root, nothing started."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ckptflow.workflows.runner import isolation
from ckptflow.workflows.runner.pods import Volume


def test_a_hostname_is_the_pod_name_cut_to_63_characters():
    assert isolation.pod_hostname("wf-123") == "wf-123"
    long = "w" * 70 + "-1234567890"
    assert isolation.pod_hostname(long) == "w" * 63
    assert isolation.pod_hostname("wf_a(0)") == "wf-a-0"


def test_probes_aim_at_the_pod():
    pod = SimpleNamespace(ip="10.244.0.7", enter_argv=lambda argv: ["nsenter", "-t", "1", *argv])
    tcp = isolation.pod_probe({"tcpSocket": {"port": 80}}, pod)
    assert tcp == {"tcpSocket": {"port": 80, "host": "10.244.0.7"}}
    http = isolation.pod_probe({"httpGet": {"port": 80, "host": "10.0.0.1"}}, pod)
    assert http["httpGet"]["host"] == "10.0.0.1"  # an explicit host stays
    run = isolation.pod_probe({"exec": {"command": ["cat", "/tmp/ready"]}}, pod)
    assert run["exec"]["command"] == ["nsenter", "-t", "1", "cat", "/tmp/ready"]


def _run(tmp_path, volumes=()):
    spec = {"volumes": list(volumes), "volumeClaimTemplates": [{"metadata": {"name": "work"}}]}
    return SimpleNamespace(spec=spec, workdir=str(tmp_path))


def test_volumes_become_pod_mounts_at_their_mount_path(tmp_path):
    run = _run(tmp_path, [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}])
    body = {
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "container": {
            "volumeMounts": [
                {"name": "shm", "mountPath": "/dev/shm"},
                {"name": "scratch", "mountPath": "/data", "readOnly": True},
                {"name": "work", "mountPath": "/mnt/work", "subPath": "a"},
            ]
        },
    }
    got = isolation.pod_volumes(run, body, ["/tmp/runner/script-dir"])
    assert got[0] == Volume("/dev/shm", memory=True, size_limit=1 << 30, name="shm")
    assert got[1] == Volume("/data", read_only=True, name="scratch")
    assert got[2] == Volume("/mnt/work", host_path=str(tmp_path / "volumes" / "work" / "a"))
    assert (tmp_path / "volumes" / "work" / "a").is_dir()
    assert got[3] == Volume(
        "/tmp/runner/script-dir", host_path="/tmp/runner/script-dir", read_only=True, name="runner"
    )


def test_an_emptydir_subpath_is_refused(tmp_path):
    body = {
        "volumes": [{"name": "e", "emptyDir": {}}],
        "container": {"volumeMounts": [{"name": "e", "mountPath": "/x", "subPath": "y"}]},
    }
    with pytest.raises(ValueError, match="subPath"):
        isolation.pod_volumes(_run(tmp_path), body, [])


def test_secret_references_are_the_names_only_their_pods_see():
    spec = {
        "templates": [
            {"name": "a", "container": {"env": [
                {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                {"name": "PLAIN", "value": "1"},
            ]}},
        ]
    }  # fmt: skip
    assert isolation._secret_names(spec) == {"KEY", "CFG"}


def test_run_pipeline_local_isolate_where_pods_cannot_work_is_one_line(
    monkeypatch, capsys, tmp_path
):
    from ckptflow.workflows.local import main

    monkeypatch.setattr(isolation, "available", lambda: "pods need root; run as root")
    rc = main(["pretrain", "--local", "--isolate", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().count("\n") == 0 and "--isolate: pods need root" in err


def test_the_isolate_config_reaches_services_only_through_the_manifest(tmp_path):
    from ckptflow.workflows.local import local_config
    from ckptflow.workflows.render import manifests

    cfg = local_config(
        tmp_path,
        s3_endpoint="http://10.244.0.1:9000",
        overrides=[],
        mlflow_uri="http://10.244.0.1:5000",
    )
    assert cfg.platform.mlflow_tracking_uri == "http://10.244.0.1:5000"  # a server, no SQLite file
    assert cfg.platform.storage_root.startswith("s3://")
    tpl = {t["name"]: t for t in manifests("pretrain", cfg)[0]["spec"]["templates"]}
    env = {e["name"]: e for e in tpl["pretrain-rank"]["container"]["env"]}
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://10.244.0.1:9000"
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://10.244.0.1:5000"
    assert "secretKeyRef" in env["AWS_ACCESS_KEY_ID"]["valueFrom"]  # keys by reference only
