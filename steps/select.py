"""`python -m ckptflow.steps.select`: the fan-in: pick the best fine-tune variant, export and register it.

Reads every candidate's evaluation results from storage (`<candidate>/ckpt/step-*/eval.json`,
never values passed through Argo), takes each candidate's best evaluated step by `--metric`
and `--mode`, and the best of those. A candidate that failed (no run, not finished, no
successful evaluation with that metric) is reported and skipped; when all failed, select
fails with the list of causes. The chosen checkpoint's weights are exported to safetensors
(`<export-uri>/<variant>-step-XXXXXXXX-<dtype>/`), registered as a new MLflow model version
whose tags name the source checkpoint, runs and data, and the `champion` / `fallback` aliases
move only when the candidate beats the champion (or with `--force`).

    python -m ckptflow.steps.select --candidates /r/finetune/a,/r/finetune/b --metric val_loss \
        --mode min --export-uri /r/export --dtype bf16 --model-name ckptflow-tiny
"""

from __future__ import annotations

import json
import logging
import posixpath
from dataclasses import dataclass

from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import eval_results, plumbing, registry, run_report
from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib.export import export_step
from ckptflow.steps.lib.lineage_values import BAD_MODEL_NAME_CHARS

from ckptflow import env
from ckptflow.contract import SelectArgs, parse
from ckptflow.core import rootreader, runroot
from ckptflow.core.layout import step_dir
from ckptflow.core.uris import join_uri

log = logging.getLogger("ckptflow.select")


def _check(p, cfg: SelectArgs) -> None:
    if not [c for c in cfg.candidates.split(",") if c.strip()]:
        p.error("--candidates names no run root")


def parse_args(argv=None) -> SelectArgs:
    return parse(SelectArgs, argv, description=__doc__.split("\n")[0], check=_check)


@dataclass(frozen=True)
class Candidate:
    """A variant's best evaluated checkpoint."""

    name: str  # the variant (last part of its run root)
    run_root: str  # its run root URI
    ckpt_root: str  # its checkpoint root URI
    step: int  # best step
    value: float  # its metric
    eval: runroot.EvalRecord  # its evaluation record


def variant_name(uri: str) -> str:
    return posixpath.basename(uri.rstrip("/")) or "model"


def assess(uri: str, cfg: SelectArgs) -> Candidate:
    """A candidate's best step; raises ValueError naming why the variant cannot be used."""
    run = env.open_storage(uri)
    ckpt = eval_results.ckpt_storage(uri)
    if not rootreader.committed_steps(ckpt):
        raise ValueError(f"no committed checkpoint under {ckpt.url()} (the variant failed early)")
    if cfg.require_finished and not runroot.finished(run):
        raise ValueError(f"no FINISHED marker under {run.url()}: the variant did not finish")
    evals = eval_results.read_evals(ckpt)
    failed = sorted(s for s, r in evals.items() if not r.ok)
    best = eval_results.best_step(evals, cfg.metric, cfg.mode)
    if best is None:
        why = f"no successful evaluation with metric {cfg.metric!r}"
        if failed:
            why += f"; evaluation failed at steps {failed}: {evals[failed[-1]].error or '?'}"
        found = eval_results.known_metrics(evals)
        raise ValueError(f"{ckpt.url()}: {why} (metrics found: {', '.join(found) or 'none'})")
    step, value = best
    return Candidate(variant_name(uri), run.url(), ckpt.url(), step, value, evals[step])


def candidate_uris(candidates: str) -> list[str]:
    """The run roots `--candidates` names; `PARENT/*` stands for every folder directly under
    PARENT (the variants of a run whose grid is a workflow parameter), in name order."""
    out = []
    for uri in (c.strip() for c in candidates.split(",")):
        if uri.endswith("/*"):
            parent = uri[:-2]
            st = env.open_storage(parent)
            out += [join_uri(parent, n) for n in sorted(st.listdir()) if not st.is_file(n)]
        elif uri:
            out.append(uri)
    return out


def choose(cfg: SelectArgs) -> tuple[Candidate | None, list[Candidate], dict[str, str]]:
    """(winner, every usable candidate, failures uri -> cause)."""
    ok, failures = [], {}
    for uri in candidate_uris(cfg.candidates):
        try:
            cand = assess(uri, cfg)
        except Exception as exc:  # noqa: BLE001 - a broken variant is reported, not fatal
            failures[uri] = f"{type(exc).__name__}: {exc}"
            log.warning("skipping candidate %s: %s", uri, failures[uri])
            continue
        log.info("candidate %s: best step %d, %s %.6g", uri, cand.step, cfg.metric, cand.value)
        ok.append(cand)
    winner = None
    for cand in ok:  # the first listed wins a tie
        if winner is None or eval_results.better(cand.value, winner.value, cfg.mode):
            winner = cand
    return winner, ok, failures


def lineage_tags(cand: Candidate, meta: dict, manifest_hash: str, exported) -> dict:
    """Tags of the model version naming its source checkpoint, runs and data."""
    base = meta.get("base") or {}
    mlf = meta.get("mlflow") or {}
    tags = {
        "ckptflow.source_checkpoint": f"{cand.ckpt_root}/{step_dir(cand.step)}",
        "ckptflow.source_step": cand.step,
        "ckptflow.source_variant": cand.name,
        "ckptflow.source_model_id": mlf.get("model_id") or cand.eval.model_id or "",
        "ckptflow.source_run_id": mlf.get("run_id") or "",
        "ckptflow.manifest_hash": manifest_hash,
        "ckptflow.data": json.dumps(
            {
                "task": meta.get("task"),
                "seed": (meta.get("config") or {}).get("seed"),
                "position": (meta.get("data") or {}).get("position"),
            }
        ),
        "ckptflow.base_checkpoint": base.get("uri", ""),
        "ckptflow.base_model_id": base.get("model_id") or "",
        "ckptflow.base_run_id": base.get("run_id") or "",
    }
    if exported is not None:
        tags.update(
            {
                "ckptflow.export_uri": exported.uri,
                "ckptflow.export_sha256": exported.sha256,
                "ckptflow.export_dtype": exported.dtype,
            }
        )
    return {k: v for k, v in tags.items() if v != ""}


def export_dir(cfg: SelectArgs, cand: Candidate) -> str:
    return join_uri(cfg.export_uri, runroot.export_name(cand.name, cand.step, cfg.dtype))


def tracking_root(cfg: SelectArgs) -> str:
    """The run that holds the export folder: its local MLflow store is the one used when
    MLFLOW_TRACKING_URI is unset ("" for none)."""
    return posixpath.dirname(cfg.export_uri.rstrip("/")) if cfg.export_uri else ""


def export(cfg: SelectArgs, winner: Candidate, chosen_uri: str):
    """The winner's weights (exported to safetensors with --export-uri, streamed shard by
    shard): (its manifest's metadata, its manifest hash, the Exported or None)."""
    winner_root = env.open_storage(winner.ckpt_root)
    with Checkpointer(winner_root.uri, storage=winner_root) as ck:
        meta = ck.manifest(winner.step)["metadata"]
    if "model_config" not in meta:
        raise ValueError(
            f"step {winner.step} under {winner.ckpt_root} has no model_config: not a model "
            "checkpoint"
        )
    digest = rootreader.read_commit(winner_root, winner.step)["manifest_xxh3"]
    if not cfg.export_uri:
        return meta, digest, None
    info = {
        "source_checkpoint": chosen_uri,
        "source_step": str(winner.step),
        "manifest_hash": digest,
        "metric": cfg.metric,
        "metric_value": repr(winner.value),
    }
    exported = export_step(
        winner.ckpt_root, winner.step, export_dir(cfg, winner), dtype=cfg.dtype, info=info
    )
    log.info(
        "exported %d tensors (%s, %d bytes) to %s",
        exported.tensors,
        cfg.dtype,
        exported.bytes,
        exported.weights_uri,
    )
    return meta, digest, exported


def log_pyfunc(client, lineage: lin.Lineage, winner: Candidate, exported, tags) -> str:
    """The export as a LoggedModel MLflow can load (`mlflow.pyfunc.load_model`, see
    steps.lib.pyfunc_model), an output of select's run; its model_id."""
    from ckptflow.steps.lib import pyfunc_model

    if not (lineage.run_id and lineage.experiment_id):
        raise RuntimeError("select's MLflow run could not be created")
    return pyfunc_model.log(
        client,
        experiment_id=lineage.experiment_id,
        run_id=lineage.run_id,
        name="".join(  # MLflow refuses some characters in a LoggedModel's name
            "_" if c in BAD_MODEL_NAME_CHARS else c
            for c in runroot.export_name(winner.name, winner.step, exported.dtype)
        ),
        export_uri=exported.uri,
        tags={k: v for k, v in tags.items() if k.startswith("ckptflow.")},
    )


def register(cfg: SelectArgs, lineage: lin.Lineage, winner: Candidate, exported, tags) -> str:
    """A new model version in the MLflow registry (the export, else the chosen checkpoint),
    aliases moved on evidence; its version ("" when MLflow is not configured)."""
    uri = lineage.tracking_uri
    if uri is None:
        log.warning("MLflow is not configured (MLFLOW_TRACKING_URI): model not registered")
        return ""
    model_id = tags.get("ckptflow.source_model_id")
    run_id = tags.get("ckptflow.source_run_id") if model_id else lineage.run_id
    try:
        client = registry.client_for(uri)
        if exported is not None:  # a loadable pyfunc model, an output of this run
            model_id, run_id = log_pyfunc(client, lineage, winner, exported, tags), lineage.run_id
            # the chosen checkpoint's evaluation, on the model's page too
            metrics = {k: v for k, v in winner.eval.metrics.items() if isinstance(v, int | float)}
            lineage.log_metrics(metrics, winner.step, model_id=model_id)
        decision = registry.register(
            client,
            cfg.model_name,
            source=exported.uri if exported else tags["ckptflow.source_checkpoint"],
            # without an export: the checkpoint's LoggedModel and the run that saved it (not
            # loadable by MLflow: its weights are external)
            run_id=run_id,
            metric=cfg.metric,
            value=winner.value,
            mode=cfg.mode,
            tags={**tags, "ckptflow.select_run_id": lineage.run_id or ""},
            force=cfg.force,
            model_id=model_id,
            description=(
                f"{winner.name} step {winner.step}: {cfg.metric} {winner.value:.4g} "
                f"({cfg.mode}); chosen from {len(candidate_uris(cfg.candidates))} variant(s)"
            ),
        )
    except Exception as exc:  # noqa: BLE001 - said plainly; the export stays where it is
        raise plumbing.StepError(
            f"could not register {cfg.model_name} in the MLflow registry at {uri} "
            f"({type(exc).__name__}: {str(exc)[:300]}); check MLFLOW_TRACKING_URI and rerun "
            f"select (the export is at {exported.uri if exported else '-'})",
            exit_code=1,
        ) from exc
    lineage.set_tags(
        {"ckptflow.model_version": decision.version, "ckptflow.promoted": decision.promoted}
    )
    log.info(
        "%s v%s: %s (champion v%s, fallback v%s)",
        cfg.model_name,
        decision.version,
        decision.reason,
        decision.champion,
        decision.fallback,
    )
    return decision.version


def write_report(cfg: SelectArgs, lineage: lin.Lineage, winner: Candidate, ok) -> str:
    """The run report (steps.lib.run_report) under the pipeline's run root, logged to the
    pipeline's MLflow run and this one; its URI ("" without an export folder, or on failure:
    a report must never fail the selection)."""
    root = tracking_root(cfg)
    if not root:
        return ""
    try:
        client = lineage.client if lineage.enabled else None
        series = run_report.collect([(c.name, c.ckpt_root) for c in ok], client)
        label = run_report.chosen_label(series, winner.name)
        title = (
            f"{variant_name(root)}: selected {winner.name} step {winner.step} "
            f"({cfg.metric} {winner.value:.4g})"
        )
        png = run_report.render(series, (label, winner.step), title)
        storage = env.open_storage(root)
        storage.write(run_report.NAME, png)
    except Exception as exc:  # noqa: BLE001 - said, and the pipeline goes on
        log.warning("run report not written: %s: %s", type(exc).__name__, exc)
        return ""
    for rid in {cfg.mlflow_parent_run_id or lineage.run_id, lineage.run_id} - {None, ""}:
        lineage.log_artifact_bytes(run_report.NAME, png, run_id=rid)
    uri = storage.url(run_report.NAME)
    log.info("run report: %s", uri)
    return uri


def select_variant(cfg: SelectArgs, run: plumbing.StepRun) -> None:
    """Choose, export and register the best variant; StepError when every candidate failed."""
    lineage = run.lineage
    winner, ok, failures = choose(cfg)
    lineage.log_params({"failed_candidates": json.dumps(failures)[: lin.MAX_PARAM_LEN]})
    if winner is None:
        causes = "\n".join(f"  {u}: {c}" for u, c in failures.items())
        raise plumbing.StepError(f"every candidate failed:\n{causes}", exit_code=1)
    chosen_uri = f"{winner.ckpt_root}/{step_dir(winner.step)}"
    log.info(
        "chosen: %s (%s %.6g, %d usable, %d failed)",
        chosen_uri,
        cfg.metric,
        winner.value,
        len(ok),
        len(failures),
    )
    meta, digest, exported = export(cfg, winner, chosen_uri)
    lineage.log_metrics({cfg.metric: winner.value}, winner.step)
    tags = lineage_tags(winner, meta, digest, exported)
    lineage.set_tags({"ckptflow.chosen": chosen_uri})
    for cand in ok:  # every candidate an input of this run: MLflow's lineage of the choice
        lineage.log_input_model(cand.eval.model_id, "candidate")
    if tags.get("ckptflow.source_model_id") not in {c.eval.model_id for c in ok}:
        lineage.log_input_model(tags.get("ckptflow.source_model_id"), "chosen")
    version = register(cfg, lineage, winner, exported, tags)
    write_report(cfg, lineage, winner, ok)
    run.outputs.update(
        chosen=chosen_uri,
        model_version=version,
        export_uri=exported.uri if exported else "",
        failed=json.dumps(failures),
    )


def main(argv=None) -> int:
    cfg = parse_args(argv)
    with plumbing.step_run(
        "select", cfg, log, run_root=tracking_root(cfg), run_name="select"
    ) as run:
        select_variant(cfg, run)
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
