"""Each checkpoint's evaluation recorded exactly once, whatever kills or outages come between
(issue 15 (c), (d)): the record is an exclusive create, the result is reported only once it is
recorded, a live claim is kept fresh by a heartbeat and a dead one is taken over soon, and an
unreachable store releases the claim instead of recording a failure.

The model evaluation is replaced by a recording stub: the claim protocol is what is under test.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.evaluate import Evaluator

from ckptflow.contract import EvaluateArgs
from ckptflow.core import runroot
from ckptflow.core.layout import step_dir
from ckptflow.core.storage import Storage
from ckptflow.core.storage_errors import StorageError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Stub(Evaluator):
    """An Evaluator whose evaluation is `body(step)` (default: a fixed result)."""

    def __init__(self, cfg, body=None):
        super().__init__(cfg, lineage=None)
        self.body = body or (lambda step: None)
        self.calls: list[int] = []

    def evaluate_step(self, step: int) -> runroot.EvalRecord:
        self.calls.append(step)
        self.body(step)
        return runroot.EvalRecord(step, status="ok", metrics={"val_loss": 1.0})


@pytest.fixture
def root(tmp_path) -> str:
    run_root = str(tmp_path / "run")
    Checkpointer(f"{run_root}/ckpt", threads=1).save(10, {"w": torch.ones(4)})
    return run_root


def _cfg(root: str, **kw) -> EvaluateArgs:
    return EvaluateArgs(run_root=root, poll_seconds=0.05, timeout_seconds=30, **kw)


def _results(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "val_loss" in r.getMessage()]


def test_a_record_made_by_a_takeover_meanwhile_is_kept_and_not_reported_twice(root, caplog):
    ckpt = Storage(f"{root}/ckpt")
    theirs = runroot.EvalRecord(10, status="ok", metrics={"val_loss": 0.5})
    # while this evaluator computes, one that took its claim over records the step first
    ev = Stub(_cfg(root), body=lambda step: runroot.write_eval(ckpt, theirs))
    with caplog.at_level(logging.INFO, logger="ckptflow.evaluate"):
        ev.process(10)
    assert runroot.read_eval(ckpt, 10).metrics == {"val_loss": 0.5}  # the first record stays
    assert ev.evaluated == [] and _results(caplog) == []  # and is the only one reported


def test_a_kill_before_the_record_reports_no_result(root, caplog, monkeypatch):
    ckpt = Storage(f"{root}/ckpt")

    def killed(*a, **kw):
        raise KeyboardInterrupt("evaluator pod killed")

    monkeypatch.setattr(runroot, "write_eval", killed)
    with (
        caplog.at_level(logging.INFO, logger="ckptflow.evaluate"),
        pytest.raises(KeyboardInterrupt),
    ):
        Stub(_cfg(root)).process(10)
    assert _results(caplog) == []  # a result line means "recorded"; nothing was
    monkeypatch.undo()
    assert not runroot.has_eval(ckpt, 10)


def test_a_live_claim_is_kept_fresh_and_a_dead_one_is_taken_over(root):
    ttl = 1.5
    started = threading.Event()

    def slow(step):
        started.set()
        time.sleep(3 * ttl)  # an evaluation longer than the claim's time to live

    busy = Stub(_cfg(root, claim_ttl_seconds=ttl), body=slow)
    worker = threading.Thread(target=busy.process, args=(10,))
    worker.start()
    started.wait(10)
    time.sleep(2 * ttl)
    other = Stub(_cfg(root, claim_ttl_seconds=ttl))
    assert not other.claim(10)  # the heartbeat keeps a live evaluator's claim
    worker.join(30)
    assert busy.evaluated == [10] and runroot.has_eval(Storage(f"{root}/ckpt"), 10)

    # a claim nobody refreshes (its evaluator was killed) goes to the next one after the ttl
    Checkpointer(f"{root}/ckpt", threads=1).save(20, {"w": torch.zeros(4)})
    ckpt = Storage(f"{root}/ckpt")
    dead = {"host": "gone", "pid": 1, "at": time.time() - 2 * ttl}
    ckpt.write(f"{step_dir(20)}/{runroot.CLAIM}", json.dumps(dead).encode(), exclusive=True)
    late = Stub(_cfg(root, claim_ttl_seconds=ttl))
    late.process(20)
    assert late.evaluated == [20]


def test_the_default_claim_ttl_lets_a_retried_evaluator_go_on_within_minutes():
    assert EvaluateArgs(run_root="r").claim_ttl_seconds <= 180


def test_an_unreachable_store_releases_the_claim_and_records_no_failure(root):
    ckpt = Storage(f"{root}/ckpt")
    outage = [True]

    def body(step):
        if outage[0]:
            raise StorageError("s3://b/run/ckpt: cannot reach the storage endpoint", "unreachable")

    ev = Stub(_cfg(root), body=body)
    ev.process(10)
    assert not runroot.has_eval(ckpt, 10)  # not marked failed for good
    assert not [n for n in ckpt.listdir(step_dir(10)) if n.startswith(runroot.CLAIM)]
    assert ev.failed == [] and ev.evaluated == []
    outage[0] = False
    ev.process(10)  # the next poll evaluates it
    assert ev.evaluated == [10] and runroot.read_eval(ckpt, 10).ok
