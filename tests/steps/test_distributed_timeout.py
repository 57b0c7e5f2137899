"""A rank whose peer freezes mid-training exits within the process-group timeout (issue 34).

The way a node loss fails: no FIN, no RST, the peer simply stops answering. Two real
`python -m ckptflow.steps.pretrain` processes form a gloo group with torchrun's environment;
rank 1 is frozen with SIGSTOP while both train; rank 0 must exit with PEER_LOST_EXIT and one
line within `--pg-timeout-s` plus start-up slack, not after gloo's default 30 minutes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from ckptflow.steps.lib.distributed import PEER_LOST_EXIT

from tests.steps import distworkers as dw

PG_TIMEOUT_S = 5
# a loaded CI machine: the op in flight, MLflow's end-of-run write, the interpreter's exit
SLACK_S = 25


def _rank(rank: int, port: int, run_root: str, out=subprocess.PIPE) -> subprocess.Popen:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    argv = [
        "--run-root", run_root, "--max-steps", "1000000", "--ckpt-every", "1000000",
        "--batch-size", "4", "--seq-len", "16", "--log-every", "1000000",
        "--preflight-factor", "0", "--pg-timeout-s", str(PG_TIMEOUT_S),
    ]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "ckptflow.steps.pretrain", *argv],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _collect(proc: subprocess.Popen, lines: list[str], ready: threading.Event) -> None:
    for line in proc.stdout:
        lines.append(line)
        if "parameters, 2 ranks" in line:  # rank 0 built the model: training starts
            ready.set()


def test_survivor_of_a_frozen_peer_exits_within_the_pg_timeout(tmp_path):
    port = dw.free_port()
    root = str(tmp_path / "run")
    peer_log = tmp_path / "rank1.log"
    with peer_log.open("w") as out:  # the frozen rank's own lines, to say why if it left
        survivor, frozen = _rank(0, port, root), _rank(1, port, root, out)
    lines: list[str] = []
    ready = threading.Event()
    reader = threading.Thread(target=_collect, args=(survivor, lines, ready), daemon=True)
    reader.start()
    try:
        assert ready.wait(240), "".join(lines[-20:])
        time.sleep(3)  # both ranks deep in the training loop's collectives
        assert survivor.poll() is None and frozen.poll() is None, "".join(
            lines[-20:] + ["rank 1:\n", peer_log.read_text()[-3000:]]
        )
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        code = survivor.wait(PG_TIMEOUT_S + SLACK_S)
        took = time.monotonic() - stopped
    finally:
        for p in (survivor, frozen):
            p.kill()
            p.wait()
    reader.join(5)
    out = "".join(lines)
    assert code == PEER_LOST_EXIT, out[-3000:]
    assert took >= PG_TIMEOUT_S - 0.5, f"left after {took:.1f}s, before the timeout"
    errors = [line for line in lines if " ERROR " in line or "Traceback" in line]
    assert len(errors) == 1 and "a collective failed" in errors[0], out[-3000:]
    print(f"survivor exited {took:.1f}s after its peer froze (pg_timeout_s={PG_TIMEOUT_S})")
