"""`python -m ckptflow.steps.finetune`: fine-tune a pretraining checkpoint on another task, in M workers.

Loads a pretraining checkpoint (a step, the latest valid one, or the best by an evaluated
metric) saved by N ranks into this job's M ranks (FSDP2, or a replicated model whose load is
cooperative: each rank reads about 1/M of it), freezes the leading blocks, and trains on a
different generated task. Checkpoints go under `<run-root>/ckpt`, a root whose marker names the
base step: frozen tensors are referenced there, not stored again, so a fine-tune checkpoint
stores only what changed. Each checkpoint is evaluated on the fine-tune task when it is saved
(`eval.json` beside it, for `ckptflow.steps.select`); a kill is resumed exactly from the newest valid
checkpoint. MLflow: the run and each checkpoint's LoggedModel name the base checkpoint (its
LoggedModel id and URI) and the pretraining run.

    python -m torch.distributed.run --nproc-per-node 2 -m ckptflow.steps.finetune \
        --base-root /tmp/pre --base-step latest --run-root /tmp/ft/a --task rev \
        --lr 1e-3 --freeze-blocks 1 --max-steps 20 --ckpt-every 10
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import distributed, eval_results, evaluation, preflight, rng, state
from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib.base_checkpoint import BaseRef, base_tags, pin_base, resolve_base
from ckptflow.steps.lib.data import Corpus
from ckptflow.steps.lib.loop import (
    FinetuneLoop,
    LoopSpec,
    TrainObjects,
    check_loop_args,
    mark_finished,
    save_outputs,
)
from ckptflow.steps.lib.model import GPT, ModelConfig, count_parameters, freeze_all_but_last
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from ckptflow import env
from ckptflow.contract import FinetuneArgs, parse
from ckptflow.core import rootreader, runroot

log = logging.getLogger("ckptflow.finetune")


def parse_args(argv=None) -> FinetuneArgs:
    return parse(FinetuneArgs, argv, description=__doc__.split("\n")[0], check=check_loop_args)


# -- model ---------------------------------------------------------------------------------------
def build_model(mcfg: ModelConfig, cfg: FinetuneArgs, dinfo: distributed.DistInfo):
    """The decoder with its leading blocks frozen (before sharding, so FSDP2 sees it), wrapped
    for this job. Returns (wrapped model, plain module, trainable parameter names)."""
    if cfg.freeze_blocks > mcfg.n_layer:
        raise ValueError(
            f"--freeze-blocks {cfg.freeze_blocks} exceeds the base model's {mcfg.n_layer} blocks"
        )
    torch.manual_seed(cfg.seed)
    module = GPT(mcfg).to(dinfo.device)
    trainable = freeze_all_but_last(module, mcfg.n_layer - cfg.freeze_blocks)
    if cfg.parallel == "fsdp":
        for block in module.blocks:
            fully_shard(block)
        fully_shard(module)
        return module, module, trainable
    if dinfo.world_size > 1:
        ids = [dinfo.device.index] if dinfo.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids), module, trainable
    return module, module, trainable


def load_base(model, base_ck: Checkpointer, base: BaseRef) -> None:
    """The base weights into this job's layout (resharded; cooperative when replicated)."""
    state = {"model": get_model_state_dict(model)}
    base_ck.load(state, step=base.step)
    set_model_state_dict(model, state["model"])
    info = base_ck.last_load
    log.info(
        "loaded base step %d (saved by %d ranks) in %.2fs: %d bytes read here, %d received",
        base.step,
        base.world_size,
        info.seconds,
        info.bytes_read,
        info.bytes_received,
    )


# -- lineage -------------------------------------------------------------------------------------
def record_base(lineage: lin.Lineage, base: BaseRef, mcfg, dinfo, trainable) -> None:
    """The base on this step's MLflow run: params, tags naming it, its LoggedModel as an input."""
    lineage.log_params(
        {
            "model_config": mcfg.to_dict(),
            "world_size": dinfo.world_size,
            "trainable": ",".join(trainable),
            "base": {k: v for k, v in base.as_dict().items() if k != "model_config"},
        }
    )
    lineage.set_tags(base_tags(base))
    lineage.log_input_model(base.model_id, "base")  # MLflow's own lineage


# -- the run -------------------------------------------------------------------------------------
def open_base(cfg: FinetuneArgs) -> tuple[Checkpointer, BaseRef]:
    """The base checkpoint: when resuming, the one this run root was started from (its marker
    names it, whatever --base-step resolves to now: the pretraining may have gone on); else
    the step --base-step names under --base-root."""
    parent = rootreader.read_parent(env.open_storage(cfg.ckpt_root))
    if parent is None:
        st, spec = eval_results.ckpt_storage(cfg.base_root), cfg.base_step
    else:
        st, spec = env.open_storage(parent["uri"]), str(parent["step"])
        log.info("resuming a fine-tune of %s step %s (its root names that base)", st.uri, spec)
    base_ck = Checkpointer(st.uri, storage=st)
    return base_ck, resolve_base(base_ck, spec)


def start_point(cfg, ck, base_ck, base, objs: TrainObjects, dinfo, lineage, evaluate):
    """(step to start from, the base's metrics on this task): a resume of this run root, else
    the base loaded, evaluated and pinned."""
    if ck.committed_steps():
        prev = ck.manifest(ck.latest())["metadata"]
        base_metrics = dict(prev.get("base", {}).get("metrics_on_task") or {})
        return state.resume(ck, *objs, dinfo, lineage), base_metrics
    load_base(objs.model, base_ck, base)
    if cfg.init_from:  # weights (or state) from elsewhere, over the base's
        state.init_from(ck, objs, cfg.init_from, cfg.init_state, dinfo, lineage)
    base_metrics = evaluate()
    if lineage:
        lineage.log_metrics({f"base_{k}": v for k, v in base_metrics.items()}, 0)
        try:
            pin_base(base, cfg.run_root)
        except Exception as exc:  # noqa: BLE001 - a read-only base is usable, only unprotected
            log.warning("could not pin base step %d (%s): pin it by hand", base.step, exc)
    return 0, base_metrics


def metadata(cfg: FinetuneArgs, mcfg, trainable, base: BaseRef, base_metrics: dict) -> dict:
    """What each checkpoint's manifest records about the fine-tune and its base."""
    return {
        "step_kind": "finetune",
        "config": asdict(cfg),
        "model_config": mcfg.to_dict(),
        "task": cfg.task,
        "trainable": trainable,
        "base": {**base.as_dict(), "metrics_on_task": base_metrics},
        **({"init_from": {"uri": cfg.init_from, "state": cfg.init_state}} if cfg.init_from else {}),
    }


def train(cfg: FinetuneArgs, dinfo: distributed.DistInfo, lineage):
    """Open the base, build this job's model, optimizer, data and Checkpointer, train;
    (last step, the Checkpointer, the base, the saves committed)."""
    rng.set_deterministic(cfg.seed)
    base_ck, base = open_base(cfg)
    mcfg = ModelConfig.from_dict(base.model_config)
    seq_len = cfg.seq_len or mcfg.seq_len
    model, module, trainable = build_model(mcfg, cfg, dinfo)
    if dinfo.is_main:
        record_base(lineage, base, mcfg, dinfo, trainable)
    ck = Checkpointer(
        cfg.ckpt_root, full_every=cfg.full_every, compression_level=cfg.compression_level
    )
    ck.inherit(base_ck, base.step)  # frozen tensors: referenced in the base, never stored again
    corpus = Corpus(cfg.task, cfg.seed)
    objs = TrainObjects.from_config(cfg, model, corpus, seq_len, dinfo)
    evaluate = functools.partial(
        evaluation.evaluate,
        module,
        corpus,
        seq_len=seq_len,
        n_batches=cfg.eval_batches,
        batch_size=cfg.eval_batch_size,
        n_exact=cfg.exact_match_n,
        device=dinfo.device,
    )
    spec = preflight.PreflightSpec.from_config(cfg)
    names = preflight.run(dinfo, env.open_storage(cfg.run_root), spec, lineage)
    start, base_metrics = start_point(cfg, ck, base_ck, base, objs, dinfo, lineage, evaluate)
    if dinfo.is_main:
        log.info(
            "fine-tuning %s (%d parameters, trainable: %s) on %s from step %d; base on this "
            "task: %s",
            cfg.run_root,
            count_parameters(module),
            ", ".join(trainable),
            cfg.task,
            start,
            evaluation.fmt(base_metrics),
        )
    record = evaluation.Recorder(ck, cfg.task, lineage, base_metrics)
    if start and not runroot.has_eval(ck.storage, start):
        metrics = evaluate()  # a resume, killed between the commit and its eval.json
        mid = (ck.manifest(start)["metadata"].get("mlflow") or {}).get("model_id")
        record(start, metrics, mid)
    loop = FinetuneLoop(
        LoopSpec.from_config(cfg, seq_len),
        objs,
        ck=ck,
        dinfo=dinfo,
        lineage=lineage,
        metadata=metadata(cfg, mcfg, trainable, base, base_metrics),
        evaluate=evaluate,
        write_eval=record,
        base=base,
        names=names,
    )
    last = loop.run(start)
    ck.close()
    return last, ck, base, loop.saved


def finish(cfg: FinetuneArgs, run, ck: Checkpointer, base: BaseRef, last: int) -> None:
    """FINISHED, outputs, and the stored size of the checkpoints relative to the base."""
    sizes = {s: ck.manifest(s)["stats"] for s in ck.committed_steps()}
    own = {s: st["new_bytes"] for s, st in sizes.items()}
    ratio = max(own.values()) / base.stored_bytes if own and base.stored_bytes else 0.0
    mark_finished(
        run,
        cfg.run_root,
        cfg.ckpt_root,
        last,
        base=base.uri,
        stored_bytes=own,
        base_stored_bytes=base.stored_bytes,
        max_fraction_of_base=ratio,
    )
    run.lineage.log_metrics({"ckpt_fraction_of_base": ratio}, last)
    log.info(
        "finished at step %d; each checkpoint stored at most %.1f%% of the base's %d bytes "
        "(frozen tensors referenced from %s)",
        last,
        100 * ratio,
        base.stored_bytes,
        base.uri,
    )


def main(argv=None) -> int:
    cfg = parse_args(argv)
    with distributed.ranked_step_run("finetune", cfg, log) as (dinfo, run):
        last, ck, base, saved = train(cfg, dinfo, run.lineage)
        if dinfo.is_main:
            finish(cfg, run, ck, base, last)
            run.outputs.update(save_outputs(saved))
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
