"""Issue 35's bad input in a real 2-rank pretrain run on one host (audit): `replicas` >= the
gang's nodes (both ranks on this machine, as a plain local run) and a local volume too small for
one step (local_size_mib=1, known after the first local save): one clear warning each, training
goes on to its last step, and the durable tier saves every durable step the normal way."""

from __future__ import annotations

import json
from pathlib import Path

from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import health, tier
from tests.steps.test_pretrain import blank_db, launch

ARGS = [
    "--model", "tiny", "--max-steps", "8", "--batch-size", "8", "--seq-len", "32",
    "--warmup-steps", "3", "--ckpt-every", "4", "--seed", "0", "--local-every", "2",
    "--replicas", "1", "--local-size-mib", "1",
]  # fmt: skip


def test_replicas_on_one_host_and_a_volume_too_small_cost_a_warning_each(tmp_path):
    root, local = str(tmp_path / "run"), str(tmp_path / "local")
    blank_db(str(tmp_path / "template"), root)
    log = tmp_path / "ranks.log"  # not capfd: the fork server may predate this test's capture
    argv = ["--run-root", root, *ARGS, "--local-dir", local]
    assert launch(2, argv, stderr=str(log)) == [0, 0]
    err = log.read_text()
    ck = Checkpointer(f"{root}/ckpt")
    assert ck.committed_steps() == [4, 8]  # the durable tier never skipped
    for step in (4, 8):
        ck.verify(step)
    saves = [e for e in health.read_events(ck.storage)[0] if e.kind == "save"]
    assert all(e.outcome == "ok" for e in saves) and sorted(e.step for e in saves) == [4, 8]
    assert json.loads(Path(f"{root}/FINISHED").read_text())["last_step"] == 8
    off = [ln for ln in err.splitlines() if "local tier off" in ln]
    assert len(off) == 2, err[-3000:]  # one line per rank, not one per step
    assert "local_size_mib=1" in off[0] and "local_volume_size" in off[0]
    assert tier.list_pieces(local, tier.run_key(ck.root)) == []  # its steps deleted, no PIECE
    one_node = [ln for ln in err.splitlines() if "replica" in ln.lower() and "node" in ln]
    assert 1 <= len(one_node) <= 2, err[-3000:]  # one clear line per rank
    assert "Traceback" not in err
