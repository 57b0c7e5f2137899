"""The rendered rendezvous really forms a process group: the rank pods' command, taken from the
manifest, hosts (index 0) or finds the generation published in the run root and all-reduces;
and it survives the loss of rank 0's pod (issue 34): a new generation, the stale one skipped.

Only the training module is swapped for a small all-reduce script; every other argument is
the manifest's, with Argo's variables filled in as the local runner fills them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ckptflow.steps import rdzv
from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.render import manifests

from ckptflow.core.storage import Storage

SCRIPT = Path(__file__).with_name("rdzv_allreduce.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_commands(tmp_path: Path, port: int) -> dict:
    """The rank template's command for each node rank, the training swapped for the script."""
    cfg = apply_overrides(PipelineConfig(), [f"pretrain.rdzv_port={port}", "pretrain.ranks=2"])
    doc = manifests("pretrain", cfg)[0]
    tpl = {t["name"]: t for t in doc["spec"]["templates"]}
    assert "rdzv" not in tpl  # no pod besides the ranks
    fill = {
        "{{inputs.parameters.run_root}}": str(tmp_path / "run"),
        "{{workflow.uid}}": uuid.uuid4().hex,
    }
    for p in doc["spec"]["arguments"]["parameters"]:
        fill["{{workflow.parameters." + p["name"] + "}}"] = p["value"]
    command = tpl["pretrain-rank"]["container"]["command"]
    assert command[:3] == ["python", "-m", "ckptflow.steps.rdzv"]
    assert command[-2:] == ["-m", "ckptflow.steps.pretrain"]
    out = {}
    for rank in (0, 1):
        argv = []
        for arg in command[:-2]:
            arg = arg.replace("{{inputs.parameters.node_rank}}", str(rank))
            for k, v in fill.items():
                arg = arg.replace(k, v)
            argv.append(arg)
        out[rank] = [sys.executable, *argv[1:], str(SCRIPT), str(tmp_path)]
    return out


def start(cmd: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PET_LOCAL_ADDR="127.0.0.1")  # status.podIP, as the runner sets it
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a pod: killed as a whole
    )


def finish(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_ranks_form_a_group_through_rank_0s_published_store(tmp_path):
    cmds = rank_commands(tmp_path, _free_port())
    ranks = [start(cmds[1]), start(cmds[0])]  # rank 1 first: it waits for a generation
    try:
        for r in ranks:
            out, _ = r.communicate(timeout=180)
            assert r.returncode == 0, out
    finally:
        finish(ranks)
    results = sorted(p.read_text() for p in tmp_path.glob("rank*"))
    assert results == ["3 2", "3 2"]
    assert rdzv.newest(Storage(str(tmp_path / "run"))).number == 1


def _published_host(tmp_path: Path, root: Storage, tries: int = 3):
    """Rank 0 started until it has published generation 1: its commands and process. The
    port `_free_port` found free may be taken by another test's store before rank 0 binds it
    (parallel workers): rank 0 then exits at once, and a fresh port is tried."""
    for _ in range(tries):
        cmds = rank_commands(tmp_path, _free_port())
        host = start(cmds[0])
        deadline = time.monotonic() + 120
        while rdzv.newest(root) is None and host.poll() is None:
            assert time.monotonic() < deadline, "rank 0 published no generation in 120 s"
            time.sleep(0.2)
        if rdzv.newest(root) is not None:
            return cmds, host
        out, _ = host.communicate(timeout=30)
    raise AssertionError(f"rank 0 exited {host.returncode} {tries} times: {out}")


def test_the_rendezvous_survives_the_loss_of_rank_0s_pod(tmp_path):
    root = Storage(str(tmp_path / "run"))
    cmds, host = _published_host(tmp_path, root)
    procs = [host]  # generation 1, then its pod is lost before the gang forms
    try:
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(timeout=30)
        # rank 1 finds generation 1 stale and waits; rank 0's retry publishes generation 2
        procs.append(start(cmds[1]))
        time.sleep(3)
        procs.append(start(cmds[0]))
        for r in procs[1:]:
            out, _ = r.communicate(timeout=180)
            assert r.returncode == 0, out
    finally:
        finish(procs)
    assert rdzv.newest(root).number == 2
    assert sorted(p.read_text() for p in tmp_path.glob("rank*")) == ["3 2", "3 2"]
