"""The rendered rendezvous really forms a process group: the rank pods' torchrun command,
taken from the manifest, joins the `ckptflow.steps.rdzv` daemon's store and all-reduces.

Only the training module is swapped for a small all-reduce script; every torchrun argument
is the manifest's, with Argo's variables filled in as the local runner fills them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.render import manifests

SCRIPT = Path(__file__).with_name("rdzv_allreduce.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"rendezvous store never listened on {port}")


def test_ranks_form_a_group_through_the_daemon(tmp_path):
    port = _free_port()
    cfg = apply_overrides(PipelineConfig(), [f"pretrain.rdzv_port={port}", "pretrain.ranks=2"])
    doc = manifests("pretrain", cfg)[0]
    tpl = {t["name"]: t for t in doc["spec"]["templates"]}
    fill = {"{{inputs.parameters.rdzv_host}}": "127.0.0.1", "{{workflow.uid}}": uuid.uuid4().hex}
    # the workflow parameters' defaults (ranks: 2), as the runner substitutes them
    for p in doc["spec"]["arguments"]["parameters"]:
        fill["{{workflow.parameters." + p["name"] + "}}"] = p["value"]

    def argv(container: dict) -> list[str]:
        out = []
        for arg in container["command"] + container.get("args", []):
            for k, v in fill.items():
                arg = arg.replace(k, v)
            out.append(arg)
        assert out[0] == "python"
        return [sys.executable, *out[1:]]

    daemon = subprocess.Popen(
        argv(tpl["rdzv"]["container"]),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ranks = []
    try:
        _wait_for_port(port, daemon)
        cmd = argv({"command": tpl["pretrain-rank"]["container"]["command"]})
        assert cmd[-2:] == ["-m", "ckptflow.steps.pretrain"]
        cmd = [*cmd[:-2], str(SCRIPT), str(tmp_path)]
        ranks = [
            subprocess.Popen(
                cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for _ in range(2)
        ]
        for r in ranks:
            out, _ = r.communicate(timeout=120)
            assert r.returncode == 0, out
    finally:
        for p in [*ranks, daemon]:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    assert daemon.returncode == 0  # SIGTERM (Argo stopping a daemon) is a clean stop
    results = sorted(p.read_text() for p in tmp_path.glob("rank*"))
    assert results == ["3 2", "3 2"]
