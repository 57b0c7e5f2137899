"""Submitting with `ckptflow submit` and reading workflows back, for the cluster tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

from tests.e2e.conftest import ARGO, NAMESPACE, kubectl_json

FINISHED = ("Succeeded", "Failed", "Error")


def small_settings(storage_root: str) -> list[str]:
    """`--set` overrides: a pipeline small enough for a 4-CPU CI runner, on this cluster."""
    image = os.environ.get("CKPTFLOW_E2E_IMAGE")
    settings = [
        f"platform.storage_root={storage_root}",
        f"platform.argo_ui={ARGO}",
        "platform.pod_gc=",  # keep pods: the tests read their state
        "pretrain.ranks=2",
        "pretrain.max_steps=40",
        "pretrain.ckpt_every=10",
        "pretrain.rank_resources.cpu=500m",
        "pretrain.rank_resources.memory=2Gi",
        "pretrain.evaluator_resources.cpu=250m",
        "pretrain.evaluator_resources.memory=1Gi",
        "finetune.max_steps=20",
        "finetune.ckpt_every=10",
        "finetune.resources.cpu=500m",
        "finetune.resources.memory=2Gi",
    ]
    return settings + ([f"platform.image={image}"] if image else [])


def unique_root(kind: str) -> str:
    return f"s3://ckptflow/e2e/{kind}-{uuid.uuid4().hex[:8]}"


def submit(name: str, settings: list[str], *, wait: bool, timeout_s: int) -> tuple[int, str, str]:
    """Run `ckptflow submit NAME`; returns (exit code, output, workflow name)."""
    cmd = [sys.executable, "-m", "ckptflow.cli", "submit", name, "--namespace", NAMESPACE]
    cmd += ["--host", ARGO, *(a for s in settings for a in ("--set", s))]
    if wait:
        cmd += ["--wait", "--poll", "5", "--timeout", str(timeout_s)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 120)
    output = done.stdout + done.stderr
    found = re.search(r"Workflow (\S+) submitted", output)
    assert found, f"`ckptflow submit {name}` printed no workflow name:\n{output}"
    return done.returncode, output, found.group(1)


def workflow(name: str) -> dict:
    return kubectl_json("get", "workflow", name)


def wait_finished(name: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        wf = workflow(name)
        if wf.get("status", {}).get("phase") in FINISHED:
            return wf
        time.sleep(5)
    raise AssertionError(f"workflow {name} did not finish within {timeout_s}s")


def outputs(wf: dict, parameter: str) -> list[str]:
    """Values of an output parameter across all nodes of the workflow."""
    values = []
    for node in wf.get("status", {}).get("nodes", {}).values():
        for p in node.get("outputs", {}).get("parameters", []):
            if p["name"] == parameter and "value" in p:
                values.append(p["value"])
    return sorted(set(values))


def global_output(wf: dict, parameter: str) -> str:
    for p in wf["status"].get("outputs", {}).get("parameters", []):
        if p["name"] == parameter:
            return p["value"]
    raise AssertionError(f"workflow output {parameter} missing")
