"""The checkpointed training loop shared by pretrain and finetune: what it trains
(`TrainObjects`) and how (`LoopSpec`), both from the step's config; train to `max_steps`, save
every `ckpt_every` steps with metadata, record each committed checkpoint in MLflow; the
fine-tune's variant of it; FINISHED at the end; and the checks of the loop's arguments.

The fine-tune's loop also evaluates each saved step on the fine-tune task right away, by every
rank (FSDP2 gathers parameters collectively), while the model is still at that step; once the
checkpoint is committed, rank 0 writes the result next to it as `eval.json` and links the
metrics to the checkpoint's MLflow LoggedModel, which also gets the base's tags.

`TrainObjects` and `LoopSpec`, built from the step's config, are in loop_setup.py.
"""

from __future__ import annotations

import logging
import os
import time

from ckptflow.steps.lib.base_checkpoint import base_tags
from ckptflow.steps.lib.distributed import DistInfo
from ckptflow.steps.lib.loop_setup import LoopSpec, TrainObjects
from ckptflow.steps.lib.optim import train_step
from ckptflow.steps.lib.plumbing import Abandon, Progress, StepError, StepRun
from ckptflow.steps.lib.preempt import FLAG, Preempted
from ckptflow.steps.lib.preflight import leave_pod
from ckptflow.steps.lib.state import rng_entry, train_state
from ckptflow.steps.lib.straggler import StragglerFound, StragglerMonitor, busy_clock
from ckptflow.steps.lib.tier_loop import TierSaves

from ckptflow import env
from ckptflow.core import liveness, runroot
from ckptflow.core.layout import step_dir

log = logging.getLogger("ckptflow.training")


KILLED_EXIT = 75  # exit code of a simulated kill (--fail-at-step)
STRAGGLER_EXIT = 5  # a persistent straggler failed the run (--straggler-fail)


class SimulatedKill(Abandon):
    """Raised at --fail-at-step in a plain (non-torchrun) process; torchrun ranks hard-exit.

    `step_run` then abandons everything, as a kill would, and exits with KILLED_EXIT."""

    exit_code = KILLED_EXIT


class CheckpointedLoop:
    """Train to `max_steps`, saving every `ckpt_every` steps (and at the end) with metadata.

    Each save first creates a PENDING LoggedModel (rank 0) whose id goes into the checkpoint's
    metadata; once the save is committed the model is finalised with its manifest hash and
    sizes, and the save metrics are logged at that step.

    At each step boundary the ranks agree whether one of them was preempted (`preemption`,
    a collective; see preempt.py): if so every rank saves that step, waits for the commit and
    raises `Preempted`. Per-rank step times go to the straggler monitor (`names`: every rank's
    "pod P on node N", from preflight); a straggler that fails the run is saved for likewise.
    """

    def __init__(
        self,
        spec: LoopSpec,
        objs: TrainObjects,
        *,
        ck,
        dinfo: DistInfo,
        lineage=None,
        metadata: dict | None = None,
        preemption=None,
        names: list[str] | None = None,
        restored=None,
        tier=None,
    ):
        self.spec, (self.model, self.optimizer, self.scheduler, self.loader) = spec, objs
        self.restored = restored  # how the resume restored (tier.restore.Restored), if told
        # the local tier (tier/setup.TierParts): local saves, drains (steps/lib/tier_loop.py)
        self.tiers = TierSaves(tier, ck) if tier is not None else None
        self.ck, self.dinfo = ck, dinfo
        self.lineage = lineage if dinfo.is_main else None
        self.metadata = metadata or {}
        self.pending: list[tuple] = []
        self.skip: set[int] = set()
        self.last_metrics: dict = {}
        self.saved: list[tuple] = []  # (stats, stored bytes) of each committed save
        self.preemption = FLAG if preemption is None else preemption
        where = names or [f"rank {r}" for r in range(dinfo.world_size)]
        self.stragglers = StragglerMonitor(spec.straggler, dinfo, where, self.lineage)

    def run(self, start_step: int) -> int:
        # Steps above the resume point are committed only when resume fell back past them as
        # corrupt; checkpoints are immutable, so those saves are skipped (and said so).
        self.skip = {s for s in self.ck.committed_steps() if s > start_step}

        progress = Progress(self.spec.max_steps, enabled=self.dinfo.is_main, initial=start_step)
        self.start_step = start_step
        # rank 0 marks progress; a restart in this root records its recovery's time
        how = {}
        if self.restored is not None and self.restored.step is not None:
            how = {"source": self.restored.source, "store_bytes": self.restored.store_bytes}
        self.liveness = (
            liveness.Tracker(self.ck.storage, start_step, **how) if self.dinfo.is_main else None
        )
        try:
            for step in range(start_step, self.spec.max_steps):
                self._one_step(step + 1, progress)
            self._finish_saves(self.spec.max_steps)
        finally:
            progress.close()  # the terminal's logging goes back to plain lines
        return self.spec.max_steps

    def _one_step(self, done: int, progress: Progress) -> None:
        """Train to step `done`; show, save, agree at the boundary and reap what is due."""
        self._train_one(done)
        progress.update(done, self.last_metrics)
        if self.liveness is not None:
            self.liveness.progressed(done)
        if self.spec.fail_at_step == done:
            self._die(done)
        saved = done % self.spec.ckpt_every == 0 or done == self.spec.max_steps
        if saved:
            self.save(done)
        elif self.tiers is not None and self.tiers.due(done):
            self.save_local(done)
        self._boundary(done, saved)
        self._reap(block=False)

    def _train_one(self, done: int) -> None:
        """One optimizer step; its metrics (wall and busy times, see straggler.py) and MLflow log."""
        t0, busy0 = time.perf_counter(), busy_clock()
        batch = self.loader.next_step()
        fetch_s = time.perf_counter() - t0
        m = train_step(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            self.dinfo.device,
            self.spec.grad_clip,
        )
        dt, busy1 = time.perf_counter() - t0, busy_clock()
        local_s = fetch_s + m.pop("optim_s", 0.0)
        busy = busy1 - busy0 if busy0 is not None and busy1 is not None else local_s
        m.update(
            step_time_s=dt,
            busy_step_s=busy,
            tokens_per_s=self.spec.tokens_per_step / max(dt, 1e-9),
        )
        self.last_metrics = m
        if done == self.start_step + 1:
            self._prepare(done)
        if self.lineage and done % self.spec.log_every == 0:
            self.lineage.log_metrics(m, done)

    def _prepare(self, done: int) -> None:
        """The state is complete after one optimizer step: the snapshot buffers are allocated
        in the background now, not in the first async save's stall. With the local tier
        taking every durable step (drained), only its own buffers (one host copy, not two)."""
        state = train_state(self.model, self.optimizer, self.scheduler, self.loader, done)
        if self.tiers is not None:
            self.tiers.prepare(state)
        if self.spec.async_save and not (
            self.tiers is not None and self.tiers.covers(self.spec.ckpt_every)
        ):
            self.ck.prepare(state)

    def _boundary(self, done: int, saved: bool) -> None:
        """What every rank does between two steps, collectively: agree on a preemption (then
        save and leave), compare step times (a failing straggler: save and leave too)."""
        if done == self.spec.max_steps:
            return  # the last step is saved anyway; the run ends normally
        if self.preemption.agree(self.dinfo.device):
            self._leave(done, saved, "preempted (SIGTERM)")
            raise Preempted(done)
        m = self.last_metrics
        try:
            self.stragglers.add(done, m["busy_step_s"], m["step_time_s"])
        except StragglerFound as exc:
            self._leave(done, saved, "a persistent straggler fails the run")
            if exc.rank == self.dinfo.rank:
                leave_pod()  # its retry is kept off this node
            raise StepError(str(exc), STRAGGLER_EXIT) from None

    def _leave(self, done: int, saved: bool, why: str) -> None:
        """Commit step `done` (unless just saved) and every save in flight, before leaving."""
        log.warning("%s at step %d: saving it before exiting", why, done)
        if not saved:
            self.save(done)
        self._finish_saves(done)
        log.warning("step %d committed; exiting for a retry that resumes there", done)

    def _die(self, step: int) -> None:
        log.warning("--fail-at-step %d: exiting without cleanup, as if killed", step)
        if env.torchrun_rank_info() is not None:
            logging.shutdown()
            os._exit(KILLED_EXIT)
        raise SimulatedKill(step)

    def save(self, step: int) -> None:
        uri = self.ck.storage.url(step_dir(step))
        if step in self.skip:
            log.warning(
                "not saving step %d: a corrupt checkpoint of that step exists (%s); "
                "remove it with `ckptflow ckpt gc` to save there again",
                step,
                uri,
            )
            return
        if self.tiers is not None:  # a drain failed before: every rank knows it by now
            self._reap(block=True)
        model_id = self.lineage.begin_checkpoint(step, uri) if self.lineage else None
        state, meta = self._state(step, model_id)
        block = not self.spec.async_save
        try:
            if self.tiers is not None:  # a local step too: the local save, then its drain
                handle = self.tiers.durable(step, state, meta, block)
            else:
                handle = self.ck.save(step, state, block=block, metadata=meta)
        except Exception as exc:
            if self.lineage:
                self.lineage.fail_checkpoint(model_id, str(exc))
            raise
        self.pending.append((handle, step, uri, model_id))

    def save_local(self, step: int) -> None:
        """A local-tier save of `step` alone (async; its failure is the tier's warning)."""
        state, meta = self._state(step, None)
        self.tiers.local(step, state, meta)

    def _state(self, step: int, model_id: str | None) -> tuple[dict, dict]:
        """What a save of `step` saves: the training state and the checkpoint's metadata."""
        state = train_state(self.model, self.optimizer, self.scheduler, self.loader, step)
        state.update(rng_entry(self.dinfo.rank, self.dinfo.device))
        meta = {
            **self.metadata,
            "data": self.loader.state_dict(),
            "world_size": self.dinfo.world_size,
            "metrics": self.last_metrics,
            "mlflow": {
                "model_id": model_id,
                "run_id": self.lineage.run_id if self.lineage else None,
            },
        }
        return state, meta

    def _finish_saves(self, step: int) -> None:
        """Wait for every save in flight; a durable copy still owed (a failed drain) is a
        normal save of `step`, the state the loop holds now."""
        self._reap(block=True)
        if self.tiers is not None and self.tiers.owed:
            self.save(step)
            self._reap(block=True)

    def _reap(self, block: bool) -> None:
        """Finish the saves that are done (all when `block`): lineage for committed ones."""
        while self.pending and (block or self.pending[0][0].done()):
            handle, step, uri, model_id = self.pending.pop(0)
            try:
                stats = handle.wait()
            except Exception as exc:
                if self.lineage:
                    self.lineage.fail_checkpoint(model_id, str(exc))
                if self.tiers is not None and self.tiers.failed(step, exc):
                    continue  # a drain's: the durable copy is owed (tier_loop.py)
                raise
            log.info(
                "checkpoint %d committed: %s stall %.3fs, background %.3fs, %d bytes written",
                step,
                stats.kind,
                stats.stall_s,
                stats.background_s,
                stats.bytes_written,
            )
            self.saved.append((stats, None))
            if self.lineage:
                self._log_committed(step, uri, model_id, stats)

    def model_params(self) -> dict:
        """Extra params of each checkpoint's LoggedModel (the fine-tune names its base)."""
        return {}

    def _log_committed(self, step: int, uri: str, model_id: str | None, stats) -> None:
        from ckptflow.core import rootreader

        m = self.ck.manifest(step)
        self.saved[-1] = (stats, m["stats"]["stored_bytes"])
        digest = rootreader.read_commit(self.ck.storage, step)["manifest_xxh3"]
        sizes = {"kind": m["kind"], "world_size": m["world_size"], **m["stats"]}
        sizes.update(self.model_params())
        self.lineage.log_checkpoint(step, uri, digest, sizes, model_id=model_id)
        self.lineage.log_metrics(
            {
                "save_stall_s": stats.stall_s,
                "save_background_s": stats.background_s,
                "save_wait_s": stats.wait_s,
                "save_bytes_raw": stats.bytes_raw,
                "save_bytes_written": stats.bytes_written,
                "save_gib_per_s": stats.gib_per_s,
                "save_duration_s": stats.background_s or stats.stall_s,
                "ckpt_stored_bytes": m["stats"]["stored_bytes"],
            },
            step,
        )


class FinetuneLoop(CheckpointedLoop):
    """`CheckpointedLoop` + evaluation of each saved step + the base's tags on each model."""

    def __init__(self, *args, evaluate, write_eval, base, **kw):
        super().__init__(*args, **kw)
        self.evaluate_now, self.write_eval, self.base = evaluate, write_eval, base
        self.results: dict[int, dict] = {}

    def save(self, step: int) -> None:
        super().save(step)
        if step not in self.skip:
            self.results[step] = self.evaluate_now()  # every rank: the model is at `step` now

    def _reap(self, block: bool) -> None:
        before = {p[1]: p[3] for p in self.pending}  # step -> model_id of saves in flight
        super()._reap(block)
        left = {p[1] for p in self.pending}
        for step, model_id in before.items():
            if step not in left and step in self.results:  # committed just now
                self.write_eval(step, self.results.pop(step), model_id)

    def model_params(self) -> dict:
        """The base, as params too: the LoggedModel page shows params, not tags."""
        return {k.removeprefix("ckptflow."): v for k, v in base_tags(self.base).items()}

    def _log_committed(self, step, uri, model_id, stats) -> None:
        super()._log_committed(step, uri, model_id, stats)
        if self.lineage:
            self.lineage.set_model_tags(model_id, base_tags(self.base))


def save_outputs(saved: list[tuple]) -> dict[str, str]:
    """The step's save outputs (Argo Prometheus metrics, ckptflow.workflows.metrics): mean
    save time and stall, the last checkpoint's stored bytes, the number committed."""
    if not saved:
        return {"save_seconds": "0", "stall_seconds": "0", "ckpt_bytes": "0", "saves": "0"}
    n = len(saved)
    size = next((b for _, b in reversed(saved) if b is not None), 0)
    return {
        "save_seconds": f"{sum(s.background_s or s.stall_s for s, _ in saved) / n:.6g}",
        "stall_seconds": f"{sum(s.stall_s for s, _ in saved) / n:.6g}",
        "ckpt_bytes": str(int(size)),
        "saves": str(n),
    }


def mark_finished(run: StepRun, run_root: str, ckpt_root: str, last: int, **extra) -> None:
    """FINISHED under the run root (what tells the evaluator to stop) with the last step and
    `extra`, and the step's outputs ckpt_root and last_step."""
    doc = {"last_step": last, "finished_at": time.time(), "ckpt_root": ckpt_root, **extra}
    runroot.write_finished(env.open_storage(run_root), doc)
    run.outputs.update(ckpt_root=ckpt_root, last_step=str(last))


def check_loop_args(parser, cfg) -> None:
    """Reject a task name the corpus does not know with parser.error (`parse`'s check: the
    step counts' minimums are checked by the contract, `at_least=1` on LoopArgs)."""
    from ckptflow.steps.lib.data import check_task

    try:
        check_task(cfg.task)
    except ValueError as exc:
        parser.error(f"--task: {exc}")
