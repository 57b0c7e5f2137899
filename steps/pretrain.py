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
from dataclasses import asdict

from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier import peers
from ckptflow.steps.checkpoint.tier.restore import TierSource, gang_group
from ckptflow.steps.checkpoint.tier.setup import TierSettings, start_tier
from ckptflow.steps.lib import distributed, preflight, rng, state
from ckptflow.steps.lib.data import VOCAB, Corpus
from ckptflow.steps.lib.loop import (
    CheckpointedLoop,
    LoopSpec,
    TrainObjects,
    check_loop_args,
    mark_finished,
    save_outputs,
)
from ckptflow.steps.lib.model import config_for, count_parameters

from ckptflow import env
from ckptflow.contract import PretrainArgs, parse
from ckptflow.core import runroot, tier

log = logging.getLogger("ckptflow.pretrain")


def parse_args(argv=None) -> PretrainArgs:
    return parse(PretrainArgs, argv, description=__doc__.split("\n")[0], check=check_loop_args)


def _train(cfg, dinfo, mcfg, ck, lineage, objs: TrainObjects) -> tuple[int, list]:
    """Preflight, resume, train to --max-steps with checkpoints, wait for the last save; the
    last step and the saves committed (for the step's save outputs)."""
    run_storage = env.open_storage(cfg.run_root)
    names = preflight.run(dinfo, run_storage, preflight.PreflightSpec.from_config(cfg), lineage)
    source, side = local_tier(cfg, ck, dinfo)
    found = state.restore_training(ck, objs, dinfo, lineage, source)
    start = found.step or 0
    parts = start_tier(ck, TierSettings.from_args(cfg), side)  # this rank's local saves
    if parts is not None:
        parts.local.forget_after(start)  # a local step above it is of an abandoned timeline
    if cfg.init_from and found.step is None:  # a fresh run, started from elsewhere
        start = state.init_from(ck, objs, cfg.init_from, cfg.init_state, dinfo, lineage)
    if dinfo.is_main and start < cfg.max_steps and runroot.finished(run_storage):
        # training continues (e.g. --max-steps was raised): watchers must not stop early
        runroot.clear_finished(run_storage)
    spec = LoopSpec.from_config(cfg, cfg.seq_len)
    meta = {
        "step_kind": "pretrain",
        "config": asdict(cfg),
        "model_config": mcfg.to_dict(),
        "task": cfg.task,
    }
    if cfg.init_from:
        meta["init_from"] = {"uri": cfg.init_from, "state": cfg.init_state}
    loop = CheckpointedLoop(
        spec,
        objs,
        ck=ck,
        dinfo=dinfo,
        lineage=lineage,
        metadata=meta,
        names=names,
        restored=found,
        tier=parts,
    )
    try:
        last = loop.run(start)
        ck.close()
    finally:
        if parts is not None:
            parts.close()  # the last local save, its PIECE handed to the replicator
        if side is not None:
            side.close()
    return last, loop.saved


def local_tier(cfg, ck, dinfo) -> tuple:
    """(where the resume finds the local tier, the peers' side channel) with
    --local-every > 0, else (None, None). The side channel starts before the resume (a
    collective: a holder must serve while a rank on a new node fetches its piece)."""
    if not cfg.local_every:
        return None, None
    key = tier.run_key(ck.root)
    group = gang_group(ck)  # gloo: the gathered addresses need no CUDA tensors
    side = peers.start(
        group, dinfo.rank, cfg.local_dir, key, replicas=cfg.replicas, keep=cfg.local_keep
    )
    directory = side.directory if side is not None else None
    return TierSource(cfg.local_dir, key, directory, peers.fetch), side


def train(cfg: PretrainArgs, dinfo: distributed.DistInfo, lineage) -> tuple[int, list]:
    """Build the model, optimizer, data and Checkpointer from `cfg`, train; the last step and
    the saves committed."""
    rng.set_deterministic(cfg.seed)
    mcfg = config_for(cfg.model, seq_len=cfg.seq_len, dropout=cfg.dropout)
    if mcfg.vocab_size < len(VOCAB):
        raise ValueError(f"model vocab {mcfg.vocab_size} < {len(VOCAB)} characters")
    model = distributed.build_model(mcfg, dinfo, cfg.seed)
    objs = TrainObjects.from_config(cfg, model, Corpus(cfg.task, cfg.seed), cfg.seq_len, dinfo)
    ck = Checkpointer(
        cfg.ckpt_root, full_every=cfg.full_every, compression_level=cfg.compression_level
    )
    if dinfo.is_main:
        lineage.log_params({"model_config": mcfg.to_dict(), "world_size": dinfo.world_size})
        log.info(
            "model %s: %d parameters, %d ranks",
            cfg.model,
            count_parameters(model),
            dinfo.world_size,
        )
    return _train(cfg, dinfo, mcfg, ck, lineage, objs)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    with distributed.ranked_step_run("pretrain", cfg, log) as (dinfo, run):
        last, saved = train(cfg, dinfo, run.lineage)
        if dinfo.is_main:
            mark_finished(run, cfg.run_root, cfg.ckpt_root, last)
            run.outputs.update(save_outputs(saved))
            log.info("finished at step %d; FINISHED written under %s", last, cfg.run_root)
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
