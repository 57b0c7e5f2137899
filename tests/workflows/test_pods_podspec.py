"""The pure parts of pods (no root needed): quantities, hostnames, volumes, the downward API,
names, and `available()` naming what is missing."""

from __future__ import annotations

import os

import pytest
from ckptflow.workflows.runner.pods import check, naming
from ckptflow.workflows.runner.pods.podspec import (
    Volume,
    check_hostname,
    downward_env,
    parse_cpu,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64Mi", 64 << 20),
        ("1Mi", 1 << 20),
        ("2Gi", 2 << 30),
        ("1G", 10**9),
        ("500k", 500_000),
        ("1e3", 1000),
        ("1.5Ki", 1536),
        ("2048", 2048),
        (4096, 4096),
        ("100m", 1),  # 0.1 byte rounds up
    ],
)
def test_parse_quantity(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "64MB", "-1Mi", "0", "Mi", "1..2", "1e999", True, "9Ei"])
def test_parse_quantity_refuses(text):
    with pytest.raises(ValueError, match="quantity|positive|range"):
        parse_quantity(text)


@pytest.mark.parametrize(("text", "expected"), [("500m", 0.5), ("2", 2.0), (1.5, 1.5), ("1", 1.0)])
def test_parse_cpu(text, expected):
    assert parse_cpu(text) == expected


@pytest.mark.parametrize("text", ["0", "0.0001", "abc", "5000"])
def test_parse_cpu_refuses(text):
    with pytest.raises(ValueError):
        parse_cpu(text)


@pytest.mark.parametrize("name", ["a", "train-0", "wf-abc.step-1", "x" * 63])
def test_hostname_ok(name):
    assert check_hostname(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", "x" * 64, "a b", "a/b", "a_b"])
def test_hostname_refused_with_the_fix(name):
    with pytest.raises(ValueError, match="1-63 letters"):
        check_hostname(name)


def test_volume_validation():
    assert Volume("/data/").target == "/data"
    for bad in ("data", "/", "/a/../b"):
        with pytest.raises(ValueError):
            Volume(bad, name="v")
    with pytest.raises(ValueError, match="shared host path"):
        Volume("/data", host_path="/srv", memory=True)
    with pytest.raises(ValueError, match="sizeLimit"):
        Volume("/data", memory=True, size_limit=0)


ENV = [
    {"name": "PLAIN", "value": "x"},
    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
    {"name": "NOPE", "valueFrom": {"fieldRef": {"fieldPath": 'metadata.labels["missing"]'}}},
    {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a/b']"}}},
    {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
]


def test_downward_env_resolves_field_refs_only():
    got = downward_env("pod-1", "ml", "10.244.0.5", {"app": "train"}, {"a/b": "note"}, ENV)
    assert got == {
        "IP": "10.244.0.5",
        "NAME": "pod-1",
        "NS": "ml",
        "APP": "train",
        "NOPE": "",  # as Kubernetes: a missing label is an empty string
        "NOTE": "note",
    }


def test_downward_env_host_fields_when_given():
    env = [
        {"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    got = downward_env("p", "d", "1.2.3.4", None, None, env, host_ip="10.0.0.1", node_name="n")
    assert got == {"H": "10.0.0.1", "N": "n"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, "env X: "),
        ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}, "not available"),
        ({"name": "X", "valueFrom": {"fieldRef": {}}}, "needs a fieldPath"),
        ({"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, "no name"),
    ],
)
def test_downward_env_refuses_unknown_fields(entry, message):
    with pytest.raises(ValueError, match=message):
        downward_env("p", "d", "1.2.3.4", {}, {}, [entry])


def test_tags_fit_interface_names_and_name_their_owner():
    tag = naming.new_tag()
    assert tag != naming.new_tag()
    assert len(tag + naming.pod_suffix(naming.MAX_POD_INDEX)) <= 15  # IFNAMSIZ - 1
    assert len(naming.base36(4194304, naming.PID_DIGITS)) == naming.PID_DIGITS
    assert naming.owner_pid(tag + "b") == (tag, os.getpid())
    assert naming.owner_pid("eth0") is None
    assert naming.owner_alive(os.getpid(), naming.start_time(os.getpid()))
    assert not naming.owner_alive(os.getpid(), "0")  # same pid, other start: a reused pid
    with pytest.raises(ValueError):
        naming.pod_suffix(naming.MAX_POD_INDEX + 1)


def test_available_names_root_when_not_root(monkeypatch):
    monkeypatch.setattr(check.os, "geteuid", lambda: 1000)
    why = check.available.__wrapped__()
    assert why is not None and "root" in why


def test_available_names_a_missing_tool(monkeypatch):
    monkeypatch.setattr(check.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        check.shutil, "which", lambda name, path=None: None if name == "ip" else "/x"
    )
    assert "`ip`" in check.available.__wrapped__()
