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
from dataclasses import asdict, dataclass

from ckptflow.steps.checkpoint import Checkpointer, Storage
from ckptflow.steps.lib import distributed, rng, state
from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib.data import VOCAB, Corpus
from ckptflow.steps.lib.loop import (
    CheckpointedLoop,
    LoopSpec,
    TrainObjects,
    check_loop_args,
    mark_finished,
)
from ckptflow.steps.lib.model import config_for, count_parameters

log = logging.getLogger("ckptflow.pretrain")


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that decides a pretraining run (logged as MLflow params, saved in metadata)."""

    run_root: str  # run root URI: checkpoints under ckpt/, FINISHED, default mlflow.db
    model: str = "tiny"  # named model size (ckptflow.steps.lib.model.SIZES)
    max_steps: int = 40  # optimizer steps to train in total (across resumes)
    batch_size: int = 8  # global sequences per optimizer step (all ranks and micro-steps)
    seq_len: int = 64  # tokens per sequence
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 5  # linear warm-up steps before cosine decay
    min_lr_ratio: float = 0.1  # final learning rate as a fraction of the peak
    weight_decay: float = 0.1  # AdamW weight decay on matrices
    grad_clip: float = 1.0  # gradient-norm clip (0 disables)
    grad_accum: int = 1  # micro-steps per optimizer step
    dropout: float = 0.0  # dropout probability in the model
    task: str = "add"  # corpus task (ckptflow.steps.lib.data.TASKS)
    ckpt_every: int = 10  # save every K steps (and always at the last step)
    full_every: int = 1  # every F-th save is full, the others are deltas against it
    async_save: bool = True  # save in the background; training stalls only for the snapshot
    compression_level: int = 1  # zstd level of the checkpoint engine
    seed: int = 0  # seeds the model init, the corpus and every RNG
    log_every: int = 1  # log training metrics to MLflow every N steps
    experiment: str = lin.EXPERIMENT  # MLflow experiment when there is no parent run
    mlflow_parent_run_id: str = ""  # nest this step's MLflow run under the pipeline's run
    output_dir: str = ""  # where Argo output parameters are written (ckpt_root, last_step)
    fail_at_step: int = 0  # testing: exit without cleanup right after this step (0: never)

    @property
    def ckpt_root(self) -> str:
        return Storage(self.run_root).url("ckpt")


def parse_args(argv=None) -> PretrainConfig:
    p = lin.arg_parser(PretrainConfig, "python -m ckptflow.steps.pretrain", __doc__.split("\n")[0])
    cfg = PretrainConfig(**vars(p.parse_args(argv)))
    check_loop_args(p, cfg)
    return cfg


def _train(cfg, dinfo, mcfg, ck, lineage, objs: TrainObjects) -> int:
    """Resume, train to --max-steps with checkpoints, wait for the last save; the last step."""
    start = state.resume(ck, *objs, dinfo, lineage)
    run_storage = Storage(cfg.run_root)
    if dinfo.is_main and start < cfg.max_steps and run_storage.exists("FINISHED"):
        # training continues (e.g. --max-steps was raised): watchers must not stop early
        run_storage.delete(["FINISHED"])
    spec = LoopSpec.from_config(cfg, cfg.seq_len)
    meta = {
        "step_kind": "pretrain",
        "config": asdict(cfg),
        "model_config": mcfg.to_dict(),
        "task": cfg.task,
    }
    loop = CheckpointedLoop(spec, objs, ck=ck, dinfo=dinfo, lineage=lineage, metadata=meta)
    last = loop.run(start)
    ck.close()
    return last


def train(cfg: PretrainConfig, dinfo: distributed.DistInfo, lineage) -> int:
    """Build the model, optimizer, data and Checkpointer from `cfg`, train; the last step."""
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
        last = train(cfg, dinfo, run.lineage)
        if dinfo.is_main:
            mark_finished(run, cfg.run_root, cfg.ckpt_root, last)
            log.info("finished at step %d; FINISHED written under %s", last, cfg.run_root)
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
