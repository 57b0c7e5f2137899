"""`python -m ckptflow.steps.rdzv`: generations published in the run root, stale ones detected.

The full path (the rendered rank command forming a group, rank 0 lost and back as a new
generation) is tests/workflows/test_rendezvous.py.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ckptflow.steps import rdzv
from torch.distributed import TCPStore

from ckptflow.core.storage import Storage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_start_of_rank_0_is_a_new_generation_and_the_newest_live_one_is_found(tmp_path):
    st = Storage(str(tmp_path / "run"))
    port = free_port()
    store, first = rdzv.host_store(st, "127.0.0.1", port)
    assert first.number == 1 and rdzv.find_store(st, 5) == first
    del store  # rank 0's pod lost: its store with it
    assert not rdzv.live(first)  # a dead host is stale
    store, second = rdzv.host_store(st, "127.0.0.1", free_port())
    assert second.number == 2 and second.nonce != first.nonce
    assert rdzv.newest(st) == second and rdzv.find_store(st, 5) == second
    del store


def test_an_address_now_serving_another_store_is_stale(tmp_path):
    st = Storage(str(tmp_path / "run"))
    port = free_port()
    store, gen = rdzv.host_store(st, "127.0.0.1", port)
    del store
    # another run's store (or a later generation) took the same address: a different nonce
    other = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    other.set(rdzv.NONCE_KEY, "someone-else")
    assert rdzv.newest(st) == gen and not rdzv.live(gen)
    del other


def test_no_live_generation_ends_after_the_join_timeout_in_one_line(tmp_path, caplog):
    st = Storage(str(tmp_path / "run"))
    store, _gen = rdzv.host_store(st, "127.0.0.1", free_port())
    del store
    caplog.set_level(logging.INFO)
    with pytest.raises(SystemExit) as exc:
        rdzv.find_store(st, 2.0)
    assert exc.value.code == rdzv.RDZV_TIMEOUT_EXIT
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "no live rendezvous" in error.getMessage() and "generation 1" in error.getMessage()
    with pytest.raises(SystemExit):  # nothing published at all
        rdzv.find_store(Storage(str(tmp_path / "empty")), 1.0)


@pytest.mark.parametrize(
    "blob",
    [
        b"{not json",
        b"x" * 5000,
        json.dumps({"generation": 9, "host": "h", "port": 1, "nonce": "n"}).encode(),  # 9 != 2
        json.dumps({"generation": 2, "host": "h", "port": 70000, "nonce": "n"}).encode(),
        json.dumps({"generation": 2, "host": "h"}).encode(),
    ],
)
def test_a_damaged_newest_generation_is_skipped(tmp_path, blob):
    st = Storage(str(tmp_path / "run"))
    store, gen = rdzv.host_store(st, "127.0.0.1", free_port())
    st.write(f"{rdzv.FOLDER}/gen-000002.json", blob)
    st.write(f"{rdzv.FOLDER}/notes.txt", b"foreign names are ignored")
    assert rdzv.newest(st) == gen
    del store


def test_a_taken_port_is_one_line():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit, match=f"cannot listen on port {port}"):
            rdzv.host_store(Storage("/var/tmp/unused-rdzv-root"), "127.0.0.1", port)


def test_arguments_split_at_the_double_dash(tmp_path):
    assert rdzv.split(["--run-root", "r", "--", "--nnodes=2", "-m", "x"]) == (
        ["--run-root", "r"],
        ["--nnodes=2", "-m", "x"],
    )
    assert rdzv.main(["--run-root", str(tmp_path)]) == 2  # no torchrun arguments


def test_a_probe_of_a_dead_host_is_bounded():
    # nothing listens: TCPStore's client retries connecting for the probe's timeout, no longer
    gen = rdzv.Generation(1, "127.0.0.1", free_port(), "n")
    start = time.monotonic()
    assert not rdzv.live(gen)
    assert time.monotonic() - start < rdzv.PROBE_S + 25  # a busy CI box; TCP alone: ~15 min


def test_a_rank_whose_host_stops_answering_kills_torchrun_and_its_workers(caplog):
    # a stand-in torchrun with one worker under it, both alive until killed
    code = (
        "import subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(w.pid, flush=True); time.sleep(120)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = int(child.stdout.readline())
    answers = iter([True, True])  # answers twice, then its pod is lost
    gen = rdzv.Generation(3, "10.0.0.9", 29400, "n")
    start = time.monotonic()
    code = rdzv.supervise(
        child, gen, watch_host_s=1.0, probe=lambda g: next(answers, False), period_s=0.2
    )
    took = time.monotonic() - start
    assert code == rdzv.HOST_LOST_EXIT and 1.0 <= took < 10, took
    assert child.poll() is not None
    time.sleep(0.5)
    state = Path(f"/proc/{worker}/stat")
    assert not state.exists() or state.read_text().split()[2] == "Z"  # the worker went too
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "generation 3" in line and "10.0.0.9:29400" in line and "has not answered" in line


def test_a_rank_whose_host_answers_waits_for_torchrun():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(4)"]
    )
    gen = rdzv.Generation(1, "h", 1, "n")
    assert rdzv.supervise(child, gen, watch_host_s=0.5, probe=lambda g: True, period_s=0.1) == 4
