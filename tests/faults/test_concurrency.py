"""Concurrency: two writers racing for one step, GC while a save is in flight, two evaluators.

Races are forced, not hoped for: a barrier holds both writers right before their exclusive
create of the commit marker, and a gate holds a save in the middle of its data (or right before
its marker) while GC runs.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CheckpointError

from ckptflow.core import layout, rootreader
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage
from tests.faults import harness
from tests.steps import ckpt_helpers as h


class BarrierStorage(Storage):
    """Every writer using one of these waits at `barrier` right before writing COMMIT."""

    def __init__(self, uri: str, barrier):
        super().__init__(uri)
        self.barrier = barrier

    def write(self, rel, data, *, exclusive=False, **kw):
        if rel.endswith(f"/{layout.COMMIT}") and rel.startswith("step-"):
            self.barrier.wait(60)
        return super().write(rel, data, exclusive=exclusive, **kw)


def _race_threads(root: str) -> tuple[list, list]:
    barrier = threading.Barrier(2)
    states = [harness.crash_state(10), harness.crash_state(20)]
    results: list = [None, None]

    def writer(i: int) -> None:
        try:
            ck = Checkpointer("unused", storage=BarrierStorage(root, barrier), threads=2)
            ck.save(7, states[i])
            results[i] = "committed"
        except CheckpointError as exc:
            results[i] = exc

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return states, results


def _check_one_winner(root: str, states: list, results: list) -> None:
    winners = [i for i, r in enumerate(results) if r == "committed"]
    assert len(winners) == 1, results
    loser = results[1 - winners[0]]
    assert isinstance(loser, CheckpointError)
    assert "committed by another writer" in str(loser) and "new step number" in str(loser)
    ck = Checkpointer(root)
    assert ck.committed_steps() == [7]
    target = h.zeros_like_state(states[0])
    assert ck.load(target) == 7
    h.assert_same(states[winners[0]], target)
    ck.verify(7)
    # the loser's manifest and intent are orphans: gc removes them after the grace period
    st = Storage(root)
    before = {e.path for e in st.walk(layout.step_dir(7))}
    assert sum(p.rsplit("/", 1)[-1].startswith("manifest-") for p in before) == 2
    report = gc(root, "last=3", apply=True, grace_s=60, now=time.time() + 120)
    assert len(report.orphan_files) == 2, report.lines()
    after = {e.path.rsplit("/", 1)[-1] for e in st.walk(layout.step_dir(7))}
    assert sum(n.startswith("manifest-") for n in after) == 1
    assert set(h.object_files(st)) == {layout.object_path(k) for k in Checkpointer(root).needs(7)}
    target = h.zeros_like_state(states[0])
    assert Checkpointer(root).load(target) == 7
    h.assert_same(states[winners[0]], target)


def test_two_writers_one_step_local_threads(tmp_path, fault):
    root = str(tmp_path / "ckpt")  # empty: both also race for the root marker
    states, results = _race_threads(root)
    _check_one_winner(root, states, results)
    fault(
        "concurrency",
        "two writers (threads) commit the same step at the same instant, local",
        detail="one commits; the other gets a clear error; gc removes its manifest",
    )


@pytest.mark.s3
@pytest.mark.slow
def test_two_writers_one_step_s3_threads(s3_bucket, fault):
    root = f"s3://{s3_bucket}/ckpt"
    states, results = _race_threads(root)
    _check_one_winner(root, states, results)
    fault(
        "concurrency",
        "two writers (threads) commit the same step at the same instant, S3",
        detail="one commits; the other gets a clear error; gc removes its manifest",
    )


def _proc_writer(root: str, i: int, barrier, out_dir: str) -> None:
    try:
        ck = Checkpointer("unused", storage=BarrierStorage(root, barrier), threads=2)
        ck.save(7, harness.crash_state(10 * (i + 1)))
        result = "committed"
    except CheckpointError as exc:
        result = str(exc)
    with open(os.path.join(out_dir, f"writer{i}"), "w") as f:
        f.write(result)


def test_two_writer_processes_one_step(tmp_path, fault):
    import multiprocessing

    root = str(tmp_path / "ckpt")
    barrier = multiprocessing.get_context("fork").Barrier(2)
    pids = []
    for i in range(2):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _proc_writer(root, i, barrier, str(tmp_path))
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    assert [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids] == [0, 0]
    results = [(tmp_path / f"writer{i}").read_text() for i in range(2)]
    states = [harness.crash_state(10), harness.crash_state(20)]
    results = [r if r == "committed" else CheckpointError(r) for r in results]
    _check_one_winner(root, states, results)
    fault(
        "concurrency",
        "two writer processes commit the same step at the same instant, local",
        detail="one commits; the other gets a clear error; gc removes its manifest",
    )


class GateStorage(Storage):
    """Holds the save at a point: after `after` object writes, or right before COMMIT."""

    def __init__(self, uri: str, where: str, after: int = 2):
        super().__init__(uri)
        self.where, self.after, self.n = where, after, 0
        self.reached, self.release = threading.Event(), threading.Event()
        self._lock = threading.Lock()

    def write(self, rel, data, *, exclusive=False, **kw):
        if self.where == "data" and rel.startswith(f"{layout.OBJECTS}/"):
            with self._lock:
                self.n += 1
                hold = self.n > self.after
            if hold:
                self.reached.set()
                self.release.wait(60)
        if self.where == "commit" and rel.endswith(f"/{layout.COMMIT}"):
            self.reached.set()
            self.release.wait(60)
        return super().write(rel, data, exclusive=exclusive, **kw)


def _age(root: str, rels: list[str], seconds: float) -> None:
    st = Storage(root)
    t = time.time() - seconds
    for rel in rels:
        os.utime(st.path(rel), (t, t))


@pytest.mark.parametrize("where", ["data", "commit"])
def test_gc_during_a_save_never_removes_in_flight_data(tmp_path, where, fault):
    root = str(tmp_path / "ckpt")
    st = Storage(root)
    old = harness.crash_state(1)
    Checkpointer(root, threads=2).save(1, old)
    # garbage from a crash two hours ago, so this GC has something to delete
    code = harness.run_forked(
        harness.save_then_maybe_die, root, "before_commit", 2, harness.crash_state(2), True
    )
    assert code == -9
    old_files = [e.path for e in st.walk() if "step-00000001" not in e.path]
    _age(root, [e.path for e in st.walk()], 7200)
    garbage = set(h.object_files(st)) - {layout.object_path(k) for k in Checkpointer(root).needs(1)}
    assert garbage and old_files

    gate = GateStorage(root, where)
    ck = Checkpointer("unused", storage=gate, threads=1)
    new = harness.crash_state(3)
    new["layer0"] = old["layer0"].clone()  # deduplicated against step 1: must survive too
    handle = ck.save(3, new, block=False)
    assert gate.reached.wait(60)
    in_flight = {e.path for e in st.walk() if e.mtime > time.time() - 600}
    report = gc(root, "last=1", apply=True)  # the real clock and the default grace period
    assert 3 in report.in_progress and 3 not in report.leftovers, report.lines()
    assert 2 in report.leftovers
    left = {e.path for e in st.walk()}
    assert in_flight <= left, f"gc removed in-flight files: {sorted(in_flight - left)}"
    assert not (garbage & left), "the crashed save's old objects were collected"
    gate.release.set()
    handle.wait()
    ck.close()
    ck = Checkpointer(root)
    assert ck.committed_steps() == [1, 3]
    ck.verify(3)
    target = h.zeros_like_state(new)
    assert ck.load(target) == 3
    h.assert_same(new, target)
    fault(
        "concurrency",
        "gc --yes while a save is in flight "
        + ("(mid-data)" if where == "data" else "(before its commit marker)"),
        detail="in-flight files kept, old garbage collected, save commits and loads",
    )


# -- two evaluators --------------------------------------------------------------------------------
def _evaluator_proc(run_root: str, name: str) -> None:
    """A real ckptflow.steps.evaluate Evaluator (claims, eval.json) whose model evaluation is replaced
    by a record of who evaluated what: the claim protocol is what is under test."""
    from ckptflow.steps.evaluate import Evaluator

    from ckptflow.contract import EvaluateArgs
    from ckptflow.core.runroot import EvalRecord

    class Recording(Evaluator):
        def evaluate_step(self, step: int) -> EvalRecord:
            time.sleep(0.02)  # widen the window in which a second evaluator could also start
            with open(os.path.join(run_root, "evaluations.log"), "a") as f:
                f.write(f"{name} {step}\n")
            return EvalRecord(step, status="ok", metrics={"val_loss": 1.0 / (step + 1)})

    cfg = EvaluateArgs(
        run_root=run_root, until_finished=True, poll_seconds=0.02, timeout_seconds=120
    )
    assert Recording(cfg, lineage=None).follow()


def test_two_evaluators_never_evaluate_a_checkpoint_twice(tmp_path, fault):
    pytest.importorskip("ckptflow.steps.evaluate")
    run_root = str(tmp_path / "run")
    ckpt = f"{run_root}/ckpt"
    os.makedirs(ckpt)
    pids = []
    for name in ("A", "B"):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _evaluator_proc(run_root, name)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    ck = Checkpointer(ckpt, threads=1)
    steps = list(range(1, 13))
    for s in steps:  # training commits steps while both evaluators poll
        ck.save(s, {"w": torch.full((8,), float(s))})
        time.sleep(0.01)
    Storage(run_root).write("FINISHED", json.dumps({"last_step": steps[-1]}).encode())
    assert [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids] == [0, 0]
    lines = (tmp_path / "run" / "evaluations.log").read_text().split()
    done = [int(s) for s in lines[1::2]]
    assert sorted(done) == steps, f"each step evaluated exactly once: {sorted(done)}"
    st = Storage(ckpt)
    for s in steps:
        assert json.loads(st.read(f"{layout.step_dir(s)}/eval.json"))["status"] == "ok"
    assert rootreader.committed_steps(st) == steps
    by = {n: lines[0::2].count(n) for n in ("A", "B")}
    fault(
        "concurrency",
        "two evaluators follow one root while 12 steps are committed",
        cases=len(steps),
        detail=f"each step evaluated once (A {by['A']}, B {by['B']})",
    )
