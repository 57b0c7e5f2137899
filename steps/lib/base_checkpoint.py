"""The base checkpoint of a fine-tune: which step `--base-root`/`--base-step` name, its lineage.

`resolve_base` turns `--base-root`/`--base-step` into a committed step and the lineage of that
checkpoint (its MLflow LoggedModel and run), `pin_base` keeps that step from being deleted
while fine-tunes reference its objects, and `base_tags` names it on MLflow runs and models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ckptflow.steps.lib.eval_results import best_step, direction, known_metrics, read_evals

from ckptflow import env
from ckptflow.core import layout, rootreader, runroot
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage


@dataclass(frozen=True)
class BaseRef:
    """The base checkpoint of a fine-tune and its lineage."""

    ckpt_root: str  # checkpoint root URI of the pretraining run
    step: int  # the committed step loaded
    uri: str  # that step's URI (what the LoggedModel records)
    selected_by: str  # "latest", "best:METRIC:MODE" or "step"
    model_id: str | None = None  # MLflow LoggedModel of the checkpoint
    run_id: str | None = None  # MLflow run of the pretraining
    model_config: dict = field(default_factory=dict)  # decoder shape, from the manifest
    task: str = ""  # pretraining task
    seed: int = 0  # pretraining seed
    world_size: int = 0  # ranks that saved it
    stored_bytes: int = 0  # stored size of the base checkpoint (all objects it needs)
    metrics: dict = field(default_factory=dict)  # its eval.json metrics, when evaluated

    def as_dict(self) -> dict:
        return asdict(self)


def pick_step(ckpt: Storage, spec: str, latest: int | None) -> tuple[int, str]:
    """Resolve `latest`, `best:METRIC[:min|max]` or a step number; (step, how it was chosen)."""
    committed = rootreader.committed_steps(ckpt)
    if not committed:
        raise CheckpointError(
            f"no committed checkpoint under {ckpt.uri}: run the pretraining first or fix --base-root"
        )
    if spec == "latest":
        if latest is None:
            raise CheckpointError(f"no valid checkpoint under {ckpt.uri}")
        return latest, "latest"
    if spec.startswith("best:"):
        metric, _, mode = spec[5:].partition(":")
        mode = direction(metric, mode)
        evals = read_evals(ckpt)
        found = best_step(evals, metric, mode)
        if found is None:
            raise CheckpointError(
                f"--base-step {spec}: no evaluated step under {ckpt.uri} has metric {metric!r} "
                f"(metrics found: {', '.join(known_metrics(evals)) or 'none'}); run "
                "ckptflow.steps.evaluate on the base run or pick a step"
            )
        return found[0], f"best:{metric}:{mode}"
    try:
        step = int(spec)
    except ValueError:
        raise ValueError(
            f"--base-step {spec!r}: use latest, best:METRIC[:min|max] or a step number"
        ) from None
    if step not in committed:
        raise CheckpointError(
            f"--base-step {step} is not committed under {ckpt.uri} (committed: {committed})"
        )
    return step, "step"


def resolve_base(base_ck, spec: str) -> BaseRef:
    """The base step named by `spec` in the Checkpointer `base_ck`, with its lineage."""
    ckpt = base_ck.storage
    step, how = pick_step(ckpt, spec, base_ck.latest() if spec == "latest" else None)
    m = base_ck.manifest(step)
    meta = m.get("metadata") or {}
    if "model_config" not in meta:
        raise CheckpointError(
            f"step {step} under {ckpt.uri} has no model_config in its metadata: "
            "fine-tune a checkpoint written by ckptflow.steps.pretrain"
        )
    rec = read_evals(ckpt).get(step) or runroot.EvalRecord(step)
    mlf = meta.get("mlflow") or {}
    return BaseRef(
        ckpt_root=ckpt.url(),
        step=step,
        uri=ckpt.url(layout.step_dir(step)),
        selected_by=how,
        model_id=mlf.get("model_id") or rec.model_id,
        run_id=mlf.get("run_id"),
        model_config=dict(meta["model_config"]),
        task=str(meta.get("task", "")),
        seed=int((meta.get("config") or {}).get("seed", 0)),
        world_size=int(m["world_size"]),
        stored_bytes=int(m["stats"]["stored_bytes"]),
        metrics=dict(rec.metrics) if rec.ok else {},
    )


def pin_base(base: BaseRef, user: str) -> bool:
    """Pin the base step (PIN, created once) so retention never deletes objects a fine-tune
    references. Returns True when this call pinned it."""
    st = env.open_storage(base.ckpt_root)
    return runroot.pin(st, base.step, f"base of fine-tune {user}", exclusive=True)


def base_tags(base) -> dict:
    """Tags naming the base checkpoint (LoggedModel id and URI) and the pretraining run."""
    tags = {"ckptflow.base_ckpt_uri": base.uri, "ckptflow.base_step": base.step}
    if base.model_id:
        tags["ckptflow.base_model_id"] = base.model_id
    if base.run_id:
        tags["ckptflow.base_run_id"] = base.run_id
    return tags
