"""`python -m ckptflow.steps.pretrain`: pretrain the GPT on the generated corpus, resumable exactly.

Runs under torchrun on any number of ranks (gloo on CPU, nccl on GPU) with FSDP2. On start it
resumes from the newest valid checkpoint under `<run-root>/ckpt` (model, optimizer, scheduler,
every rank's RNG and the data position), falling back past a corrupt newest one. It saves every
`--ckpt-every` steps and at the end (async by default), records each committed checkpoint as an
MLflow LoggedModel, and finally writes `<run-root>/FINISHED` so the evaluator knows to stop.

    python -m torch.distributed.run --nproc-per-node 2 -m ckptflow.steps.pretrain \
        --run-root /tmp/run1 --model tiny --max-steps 40 --ckpt-every 10
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib import training as tr
from ckptflow.steps.lib.data import VOCAB, Corpus, ShardedLoader
from ckptflow.steps.lib.model import config_for, count_parameters

from ckptflow import env
from ckptflow.contract import PretrainArgs, parse
from ckptflow.core import runroot

log = logging.getLogger("ckptflow.pretrain")


def parse_args(argv=None) -> PretrainArgs:
    return parse(PretrainArgs, argv, description=__doc__.split("\n")[0], check=tr.check_loop_args)


def _train(cfg, dinfo, mcfg, ck, lineage, model, optimizer, scheduler, loader) -> int:
    """Resume, train to --max-steps with checkpoints, wait for the last save; the last step."""
    start = tr.resume(ck, model, optimizer, scheduler, loader, dinfo, lineage)
    run_storage = env.open_storage(cfg.run_root)
    if dinfo.is_main and start < cfg.max_steps and runroot.finished(run_storage):
        # training continues (e.g. --max-steps was raised): watchers must not stop early
        runroot.clear_finished(run_storage)
    spec = tr.LoopSpec(
        max_steps=cfg.max_steps,
        ckpt_every=cfg.ckpt_every,
        async_save=cfg.async_save,
        log_every=cfg.log_every,
        grad_clip=cfg.grad_clip,
        tokens_per_step=cfg.batch_size * cfg.seq_len,
        fail_at_step=cfg.fail_at_step or None,
    )
    meta = {
        "step_kind": "pretrain",
        "config": asdict(cfg),
        "model_config": mcfg.to_dict(),
        "task": cfg.task,
    }
    loop = tr.CheckpointedLoop(
        spec,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        ck=ck,
        dinfo=dinfo,
        lineage=lineage,
        metadata=meta,
    )
    last = loop.run(start)
    ck.close()
    return last


def run(cfg: PretrainArgs, dinfo: tr.DistInfo) -> int:
    tr.set_deterministic(cfg.seed)
    mcfg = config_for(cfg.model, seq_len=cfg.seq_len, dropout=cfg.dropout)
    if mcfg.vocab_size < len(VOCAB):
        raise ValueError(f"model vocab {mcfg.vocab_size} < {len(VOCAB)} characters")
    model = tr.build_model(mcfg, dinfo, cfg.seed)
    optimizer = tr.make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = tr.make_scheduler(optimizer, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
    loader = ShardedLoader(
        Corpus(cfg.task, cfg.seed),
        seq_len=cfg.seq_len,
        global_batch=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        rank=dinfo.rank,
        world_size=dinfo.world_size,
    )
    ck = Checkpointer(
        cfg.ckpt_root, full_every=cfg.full_every, compression_level=cfg.compression_level
    )
    lineage = None
    if dinfo.is_main:
        lineage = lin.Lineage.for_run_root(cfg.run_root)
        lineage.start_run(
            "pretrain",
            experiment=cfg.experiment,
            step_kind="pretrain",
            parent_run_id=cfg.mlflow_parent_run_id or None,
            params={**asdict(cfg), "model_config": mcfg.to_dict(), "world_size": dinfo.world_size},
        )
        log.info(
            "model %s: %d parameters, %d ranks",
            cfg.model,
            count_parameters(model),
            dinfo.world_size,
        )
    try:
        last = _train(cfg, dinfo, mcfg, ck, lineage, model, optimizer, scheduler, loader)
    except tr.SimulatedKill:
        return tr.KILLED_EXIT  # abandon everything, as a kill would
    except BaseException:
        if lineage:
            lineage.close("FAILED")
        raise
    run_storage = env.open_storage(cfg.run_root)
    if dinfo.is_main:
        finish = {"last_step": last, "finished_at": time.time(), "ckpt_root": cfg.ckpt_root}
        runroot.write_finished(run_storage, finish)
        lin.write_outputs(cfg.output_dir, {"ckpt_root": cfg.ckpt_root, "last_step": str(last)})
        lineage.close("FINISHED")
        log.info("finished at step %d; FINISHED written under %s", last, cfg.run_root)
    return 0


def main(argv=None) -> int:
    cfg = parse_args(argv)
    dinfo = tr.init_distributed()
    lin.setup_logging(dinfo.rank)
    try:
        return run(cfg, dinfo)
    finally:
        tr.shutdown_distributed()


if __name__ == "__main__":
    raise SystemExit(main())
