"""`python -m ckptflow.steps.evaluate`: evaluate each committed checkpoint of a run exactly once.

Runs beside training as one plain process and never blocks it: it polls `<run-root>/ckpt`,
claims each newly committed step with an exclusive create of `step-XXXXXXXX/eval.claim` (so two
evaluators never evaluate the same step), loads the model alone from it, resharded into this
single process, and computes validation loss and exact match. The result goes next to the
checkpoint as `eval.json`, which the catalog and `ckptflow.steps.select` read:

    {"step": 20, "status": "ok", "metrics": {"val_loss": 1.23, "exact_match": 0.05},
     "task": "add", "model_id": "m-...", "mlflow_run_id": "...", "evaluated_at": 1.7e9, ...}

and to MLflow, linked to the checkpoint's LoggedModel by `model_id` at that step. A restarted
evaluator skips steps that have an eval.json; uncommitted steps are never touched.

    python -m ckptflow.steps.evaluate --run-root R                    # every committed step, then exit
    python -m ckptflow.steps.evaluate --run-root R --until-finished   # follow training until FINISHED
    python -m ckptflow.steps.evaluate --run-root R --step 20          # one checkpoint
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import warnings

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib import plumbing
from ckptflow.steps.lib.data import Corpus
from ckptflow.steps.lib.evaluation import evaluate
from ckptflow.steps.lib.model import GPT, ModelConfig

from ckptflow import env
from ckptflow.contract import EvaluateArgs, parse
from ckptflow.core import health, runroot
from ckptflow.core.layout import step_dir
from ckptflow.core.runroot import CLAIM
from ckptflow.core.storage import AlreadyExists
from ckptflow.core.storage_errors import transient

log = logging.getLogger("ckptflow.evaluate")


def _outage(exc: BaseException) -> bool:
    """True when `exc`, or an error it was raised from, is the store being unreachable or
    throttling (the load wraps storage errors in its own)."""
    for _ in range(8):
        if exc is None:
            return False
        if transient(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _claim_body() -> bytes:
    """A claim: who holds it and when it was last refreshed (claim_time reads "at")."""
    return json.dumps(
        {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
    ).encode()


def parse_args(argv=None) -> EvaluateArgs:
    return parse(EvaluateArgs, argv, description=__doc__.split("\n")[0])


class Evaluator:
    """Claims, evaluates and records steps of one checkpoint root."""

    def __init__(self, cfg: EvaluateArgs, lineage: lin.Lineage):
        self.cfg, self.lineage = cfg, lineage
        self.run = env.open_storage(cfg.run_root)
        self.ckpt = runroot.ckpt_root(self.run)
        self.ck = Checkpointer(self.ckpt.uri, storage=self.ckpt)
        self.evaluated: list[int] = []
        self.failed: list[int] = []
        self.claimed = ""  # the claim file of the step being evaluated

    # -- claims --------------------------------------------------------------------------------
    def done(self, step: int) -> bool:
        return runroot.has_eval(self.ckpt, step)

    def claim(self, step: int) -> bool:
        """Exclusively create this step's claim; take over a stale one under the next number."""
        d = step_dir(step)
        gens = sorted(
            int(n.rsplit(".", 1)[1]) if n != CLAIM else 0
            for n in self.ckpt.listdir(d)
            if n.startswith(CLAIM)
        )
        gen = 0
        if gens:
            last = gens[-1]
            name = CLAIM if last == 0 else f"{CLAIM}.{last}"
            at = runroot.claim_time(self.ckpt, f"{d}/{name}")
            age = 0.0 if at is None else time.time() - at  # gone or damaged: as before, busy
            if age < self.cfg.claim_ttl_seconds:
                return False  # someone is on it
            gen = last + 1
            log.warning(
                "step %d: claim %s is %.0fs old without a result; taking over", step, name, age
            )
        rel = f"{d}/{CLAIM if gen == 0 else f'{CLAIM}.{gen}'}"
        try:
            self.ckpt.write(rel, _claim_body(), exclusive=True)
        except AlreadyExists:
            return False
        self.claimed = rel
        return True

    @contextlib.contextmanager
    def _heartbeat(self, rel: str):
        """Keep the claim `rel` fresh while the evaluation runs (its "at" rewritten every
        quarter of the ttl): a live evaluator's claim is never taken over, so the ttl can be
        short and a killed evaluator's step goes on within minutes, not an hour."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.cfg.claim_ttl_seconds / 4):
                with contextlib.suppress(Exception):  # a missed beat only ages the claim
                    self.ckpt.write(rel, _claim_body(), atomic=True)

        thread = threading.Thread(target=beat, name="claim-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    # -- one step ------------------------------------------------------------------------------
    def evaluate_step(self, step: int) -> runroot.EvalRecord:
        """Load the model from `step`, evaluate it, record the result; returns the record."""
        t0 = time.perf_counter()
        meta = self.ck.manifest(step).get("metadata", {})
        mcfg = ModelConfig.from_dict(meta["model_config"])
        task = self.cfg.task or meta.get("task", "add")
        seed = int(meta.get("config", {}).get("seed", 0))
        torch.manual_seed(0)
        model = GPT(mcfg)
        state = {"model": model.state_dict()}
        self.ck.load(state, step=step)  # reshards into this one process; verifies every byte
        model.load_state_dict(state["model"])
        metrics = evaluate(
            model,
            Corpus(task, seed),
            seq_len=mcfg.seq_len,
            n_batches=self.cfg.eval_batches,
            batch_size=self.cfg.eval_batch_size,
            n_exact=self.cfg.exact_match_n,
        )
        uri = self.ckpt.url(step_dir(step))
        model_id = (meta.get("mlflow") or {}).get("model_id") or self.lineage.find_checkpoint_model(
            uri
        )
        self.lineage.log_input_model(model_id, "evaluated")
        self.lineage.log_dataset(task, seed, "evaluation")  # the validation problems it scored
        self.lineage.log_metrics(metrics, step, model_id=model_id)
        return runroot.EvalRecord(
            step=step,
            status="ok",
            metrics=metrics,
            task=task,
            model_id=model_id,
            mlflow_run_id=self.lineage.run_id,
            uri=uri,
            evaluated_at=time.time(),
            seconds=time.perf_counter() - t0,
            evaluator={"host": socket.gethostname(), "pid": os.getpid()},
        )

    def process(self, step: int) -> None:
        """Evaluate `step` unless it is done or claimed; a failure is recorded, not raised.

        Exactly once: the record is an exclusive create and the result is reported only after
        it (a kill before it reports nothing and the step is evaluated again; a takeover that
        recorded first wins). An unreachable store releases the claim and records nothing, so
        an outage does not mark the step failed for good: the next poll evaluates it."""
        if self.done(step) or not self.claim(step):
            return
        try:
            with self._heartbeat(self.claimed):
                record = self.evaluate_step(step)
        except Exception as exc:  # noqa: BLE001 - record it and go on with the other steps
            if _outage(exc):
                log.warning("step %d: %s; released, evaluated again on the next poll", step, exc)
                with contextlib.suppress(Exception):
                    self.ckpt.delete([self.claimed])
                return
            log.error("step %d: evaluation failed: %s: %s", step, type(exc).__name__, exc)
            record = runroot.EvalRecord(
                step=step,
                status="failed",
                error=f"{type(exc).__name__}: {exc}"[:2000],
                evaluated_at=time.time(),
            )
        try:
            runroot.write_eval(self.ckpt, record, exclusive=True)
        except AlreadyExists:
            log.warning("step %d: recorded by another evaluator meanwhile; theirs stays", step)
            return
        if record.ok:
            log.info(
                "step %d: %s", step, " ".join(f"{k} {v:.4f}" for k, v in record.metrics.items())
            )
        else:
            self.failed.append(step)
        health.record(
            self.ckpt,
            "evaluate",
            step=step,
            outcome=record.status,
            duration_s=record.seconds or 0.0,
            error=record.error or "",
        )
        self.evaluated.append(step)

    # -- the run -------------------------------------------------------------------------------
    def follow(self) -> bool:
        """Poll until FINISHED and every committed step has a result; False at the timeout.
        With `forever` (a daemon beside training) never return: Argo fails a daemon that
        exits by itself, its DAG stops it."""
        deadline = time.monotonic() + self.cfg.timeout_seconds
        while True:
            finished = runroot.finished(self.run)  # read before listing: no step is missed
            steps = self.ck.committed_steps()
            for step in steps:
                self.process(step)
            if self.cfg.forever:
                time.sleep(self.cfg.poll_seconds)
                continue
            if not self.cfg.until_finished:
                return True
            if finished and all(self.done(s) for s in steps):
                return True
            if time.monotonic() > deadline:
                log.warning(
                    "timeout after %.0fs: FINISHED=%s, %d step(s) without results",
                    self.cfg.timeout_seconds,
                    finished,
                    sum(not self.done(s) for s in steps),
                )
                return False
            time.sleep(self.cfg.poll_seconds)

    def summary(self, metric: str = "val_loss") -> tuple[int | None, list[int]]:
        """(best step by `metric`, steps whose stored evaluation failed) over committed steps.

        Failures recorded by an earlier evaluator count too, so a restart still exits non-zero.
        """
        best, failed = None, []
        evals = runroot.read_evals(self.ckpt, self.ck.committed_steps())
        for step, rec in evals.items():
            if not rec.ok:
                failed.append(step)
                continue
            value = rec.metric(metric)
            if value is not None and (best is None or value < best[0]):
                best = (value, step)
        return (best[1] if best else None), failed


def evaluate_run(cfg: EvaluateArgs, run: plumbing.StepRun) -> None:
    """Evaluate --step, or every committed step (following the run with --until-finished);
    FAILED with exit code 1 when an evaluation failed."""
    ev = Evaluator(cfg, run.lineage)
    if cfg.step >= 0:
        if cfg.step not in ev.ck.committed_steps():
            raise plumbing.StepError(
                f"step {cfg.step} is not committed under {ev.ckpt.uri} "
                f"(committed: {ev.ck.committed_steps() or 'none'}): pick a committed step"
            )
        ev.process(cfg.step)
        if not ev.evaluated and not ev.done(cfg.step):
            log.warning("step %d is claimed by another evaluator; not evaluated here", cfg.step)
    else:
        ev.follow()
    best, failed = ev.summary()
    if cfg.step >= 0:
        failed = [s for s in failed if s == cfg.step]
    run.outputs.update(evaluated=ev.evaluated, best_step="" if best is None else str(best))
    log.info("evaluated steps %s; failed %s; best step by val_loss %s", ev.evaluated, failed, best)
    if failed:
        run.fail(1)


def run_name(cfg: EvaluateArgs) -> str:
    """`evaluate-pretrain-follow` beside training, `-final` once it has FINISHED (the pass
    after it), `-step20` for one step: the pipeline's two evaluators differ by name."""
    if cfg.step >= 0:
        suffix = f"step{cfg.step}"
    elif cfg.forever:
        suffix = "follow"
    elif cfg.until_finished:
        try:
            suffix = "final" if runroot.finished(env.open_storage(cfg.run_root)) else "follow"
        except Exception:  # noqa: BLE001 - a name must not stop the step; follow() says why
            suffix = "follow"
    else:
        suffix = ""
    return lin.run_label("evaluate", cfg.run_root, suffix)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    # one process on purpose: DCP's note that it loads without a process group is noise here
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    with plumbing.step_run("evaluate", cfg, log, run_name=run_name(cfg)) as run:
        evaluate_run(cfg, run)
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
