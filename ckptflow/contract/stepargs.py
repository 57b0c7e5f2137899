"""The arguments of each step: one frozen dataclass per `python -m ckptflow.steps.NAME`.

The step parses its command line into it (`parse`), the workflow builders embed it and render it
(`to_argv`), and docs/contracts.md's argument tables are written from it
(`python -m ckptflow.contract.docs`). Torch-free and hera-free: both sides import it.

Class attributes name the step's module (`STEP`), how the workflows launch it (`RUNS_AS`) and
the files it writes into `--output-dir`, which Argo reads as output parameters (`OUTPUTS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ckptflow.contract.argv import arg

EXPERIMENT = "ckptflow"  # MLflow experiment of runs without a parent (= lineage.EXPERIMENT)
PARENT_DOC = "nest this step's MLflow run under the pipeline's run"
EXPERIMENT_DOC = "MLflow experiment when there is no parent run"
PARALLEL = ("fsdp", "ddp")  # how finetune wraps its model
# what a training step reports of its saves (Argo Prometheus metrics: ckptflow.workflows.metrics)
SAVE_OUTPUTS = ("save_seconds", "stall_seconds", "ckpt_bytes", "saves")
# The named model sizes and corpus tasks (keys of ckptflow.steps.lib.model.SIZES and
# ckptflow.steps.lib.data.TASKS, written out torch-free; tests/contract keeps them equal).
MODELS = ("tiny", "small", "medium", "base", "large")
TASKS = ("add", "sub", "mul", "rev", "sort")
INIT_STATES = ("weights", "full")  # what --init-from fills


@dataclass(frozen=True)
class StartRunArgs:
    """The parent run's identity and the pipeline configuration it records."""

    STEP: ClassVar[str] = "start_run"
    RUNS_AS: ClassVar[str] = "plain"
    OUTPUTS: ClassVar[tuple[str, ...]] = ("run_id",)

    experiment: str = arg(EXPERIMENT, "MLflow experiment (created when missing)")
    run_name: str = arg("pipeline", "the parent run's name (the workflow name in Argo)")
    workflow_name: str = arg("", "Argo workflow name (default: ARGO_WORKFLOW_NAME)")
    workflow_uid: str = arg("", "Argo workflow uid (default: ARGO_WORKFLOW_UID)")
    namespace: str = arg("", "Kubernetes namespace (default: ARGO_NAMESPACE)")
    config_json: str = arg(
        "{}", "the run's configuration as params: a JSON object or Argo's parameter list"
    )
    run_root: str = arg(
        "", "local run root: its mlflow.db serves when MLFLOW_TRACKING_URI is unset"
    )
    output_dir: str = arg("", "where Argo output parameters are written (run_id)")


@dataclass(frozen=True, kw_only=True)
class LoopArgs:
    """The checkpointed training loop's arguments, shared by pretrain and finetune."""

    max_steps: int = arg(40, "optimizer steps to train in total (across resumes)", at_least=1)
    batch_size: int = arg(8, "global sequences per optimizer step (all ranks and micro-steps)")
    warmup_steps: int = arg(5, "linear warm-up steps before cosine decay")
    min_lr_ratio: float = arg(0.1, "final learning rate as a fraction of the peak")
    grad_clip: float = arg(1.0, "gradient-norm clip (0 disables)")
    grad_accum: int = arg(1, "micro-steps per optimizer step")
    ckpt_every: int = arg(10, "save every K steps, and at the last step", at_least=1)
    full_every: int = arg(
        1, "every F-th save is full, the others are deltas against it", at_least=1
    )
    async_save: bool = arg(True, "save in the background; training stalls only for the snapshot")
    compression_level: int = arg(1, "zstd level of the checkpoint engine")
    seed: int = arg(0, "seeds the model init, the data and every RNG")
    log_every: int = arg(1, "log training metrics to MLflow every N steps")
    experiment: str = arg(EXPERIMENT, EXPERIMENT_DOC)
    mlflow_parent_run_id: str = arg("", PARENT_DOC)
    output_dir: str = arg("", "where Argo output parameters are written (ckpt_root, last_step)")
    fail_at_step: int = arg(0, "testing: exit without cleanup right after this step (0: never)")
    init_from: str = arg(
        "",
        "a fresh run starts from this checkpoint: a ckptflow root or step, a DCP folder, a "
        'torch.save file or safetensors ("": none; a resume ignores it)',
    )
    init_state: str = arg(
        "weights",
        "what --init-from fills: weights (the model) | full (also optimizer, scheduler, data, step)",
        choices=INIT_STATES,
    )
    preflight_factor: float = arg(
        3.0, "fail preflight for a rank this many times slower than its peers (0: no preflight)"
    )
    preflight_store_mib: int = arg(
        4, "MiB each rank writes to and reads from the store in preflight", at_least=1
    )
    straggler_every: int = arg(
        10, "compare per-rank step times every N steps (0: never)", at_least=0
    )
    straggler_factor: float = arg(
        2.0, "a rank this many times slower than its peers' median is a straggler", at_least=1.0
    )
    straggler_windows: int = arg(
        3, "consecutive slow comparisons that make a straggler persistent", at_least=1
    )
    straggler_fail: bool = arg(False, "a persistent straggler fails the run (after a save)")
    pg_timeout_s: int = arg(
        120,
        "process-group timeout: a collective waiting this long on a lost or frozen peer fails "
        "the rank, so the gang restarts (gloo's own default is 30 min)",
        at_least=1,
    )

    @property
    def ckpt_root(self) -> str:
        """The checkpoint root under the run root (each step declares its own run_root)."""
        from ckptflow.core import runroot

        return runroot.ckpt_uri(self.run_root)


@dataclass(frozen=True, kw_only=True)
class PretrainArgs(LoopArgs):
    """Everything that decides a pretraining run (logged as MLflow params, saved in metadata)."""

    STEP: ClassVar[str] = "pretrain"
    RUNS_AS: ClassVar[str] = "torchrun (N ranks)"
    OUTPUTS: ClassVar[tuple[str, ...]] = ("ckpt_root", "last_step", *SAVE_OUTPUTS)

    run_root: str = arg(doc="run root URI: checkpoints under ckpt/, FINISHED, default mlflow.db")
    model: str = arg("tiny", "named model size (ckptflow.steps.lib.model.SIZES)", choices=MODELS)
    task: str = arg("add", "corpus task (ckptflow.steps.lib.data.TASKS)", choices=TASKS)
    seq_len: int = arg(64, "tokens per sequence")
    lr: float = arg(3e-3, "peak learning rate")
    weight_decay: float = arg(0.1, "AdamW weight decay on matrices")
    dropout: float = arg(0.0, "dropout probability in the model")
    local_every: int = arg(
        0,
        "also save every K steps to the node-local tier (0: off); ckpt_every still decides "
        "object storage",
        at_least=0,
    )
    local_dir: str = arg("/ckpt-local", "node-local directory of the local tier (a pod volume)")
    local_keep: int = arg(
        2, "local steps each rank keeps (fewer when the volume cannot hold them)", at_least=1
    )
    local_size_mib: int = arg(
        0, "the local volume's size in MiB (0: the free space of local_dir)", at_least=0
    )
    replicas: int = arg(
        0, "copies of each rank's local shard kept by ranks on other nodes", at_least=0
    )


@dataclass(frozen=True)
class EvaluateArgs:
    """What to evaluate and how long to follow the run."""

    STEP: ClassVar[str] = "evaluate"
    RUNS_AS: ClassVar[str] = "plain"
    OUTPUTS: ClassVar[tuple[str, ...]] = ("evaluated", "best_step")

    run_root: str = arg(doc="run root URI (checkpoints under ckpt/, FINISHED marker)")
    step: int = arg(-1, "evaluate only this step (-1: every committed step)")
    until_finished: bool = arg(False, "keep polling until FINISHED appears and all steps are done")
    forever: bool = arg(
        False, "keep following the run until stopped, never exiting by itself (a daemon)"
    )
    poll_seconds: float = arg(10.0, "pause between polls of the checkpoint root")
    timeout_seconds: float = arg(6 * 3600.0, "give up following the run after this long")
    claim_ttl_seconds: float = arg(
        120.0, "a claim not refreshed for this long (its evaluator died) is taken over"
    )
    task: str = arg(
        "", 'task to evaluate on ("": the task the checkpoint was trained on)', choices=("", *TASKS)
    )
    eval_batches: int = arg(4, "validation batches for the loss")
    eval_batch_size: int = arg(16, "sequences per validation batch")
    exact_match_n: int = arg(64, "validation prompts for exact match")
    experiment: str = arg(EXPERIMENT, EXPERIMENT_DOC)
    mlflow_parent_run_id: str = arg("", PARENT_DOC)
    output_dir: str = arg("", "where Argo output parameters are written (evaluated, best_step)")


@dataclass(frozen=True, kw_only=True)
class FinetuneArgs(LoopArgs):
    """Everything that decides a fine-tune variant (logged as MLflow params, saved in metadata).

    Each save is evaluated on the fine-tune task (eval.json beside it).
    """

    STEP: ClassVar[str] = "finetune"
    RUNS_AS: ClassVar[str] = "torchrun (M ranks)"
    OUTPUTS: ClassVar[tuple[str, ...]] = ("ckpt_root", "last_step", *SAVE_OUTPUTS)

    base_root: str = arg(doc="pretraining run root (or its checkpoint root)")
    run_root: str = arg(doc="this variant's run root: ckpt/, FINISHED, default mlflow.db")
    base_step: str = arg("latest", "latest | best:METRIC[:min|max] | a step number")
    task: str = arg(
        "rev",
        "fine-tuning task (ckptflow.steps.lib.data.TASKS), unlike pretraining's",
        choices=TASKS,
    )
    seq_len: int = arg(0, "tokens per sequence (0: the base model's seq_len)")
    lr: float = arg(1e-3, "peak learning rate")
    warmup_steps: int = arg(2, "linear warm-up steps before cosine decay")
    weight_decay: float = arg(0.0, "AdamW weight decay on trainable matrices")
    freeze_blocks: int = arg(
        1, "leading blocks kept frozen (embeddings always; ln_f and head train)", at_least=0
    )
    parallel: str = arg(
        "fsdp", "fsdp (FSDP2 shards) | ddp (replicated model, cooperative load)", choices=PARALLEL
    )
    eval_batches: int = arg(4, "validation batches for the loss")
    eval_batch_size: int = arg(16, "sequences per validation batch")
    exact_match_n: int = arg(64, "validation prompts for exact match")


@dataclass(frozen=True)
class SelectArgs:
    """Which variants to compare, how, and where the winner goes."""

    STEP: ClassVar[str] = "select"
    RUNS_AS: ClassVar[str] = "plain"
    OUTPUTS: ClassVar[tuple[str, ...]] = ("chosen", "model_version", "export_uri", "failed")

    candidates: str = arg(
        doc="comma-separated run roots of the variants; PARENT/* names each under it"
    )
    metric: str = arg("val_loss", "eval.json metric to rank by")
    mode: str = arg("min", "which direction is better", choices=("min", "max"))
    export_uri: str = arg("", 'folder under which the export is written ("": no export)')
    dtype: str = arg("fp32", "dtype of the exported weights", choices=("fp32", "bf16"))
    model_name: str = arg("ckptflow", "MLflow registered model name")
    force: bool = arg(False, "move `champion` to this candidate even when it is not better")
    require_finished: bool = arg(True, "a variant without its FINISHED marker counts as failed")
    experiment: str = arg(EXPERIMENT, EXPERIMENT_DOC)
    mlflow_parent_run_id: str = arg("", PARENT_DOC)
    output_dir: str = arg("", "where Argo output parameters go (chosen, model_version, ...)")


@dataclass(frozen=True)
class FinishRunArgs:
    """Which run to close and how the workflow ended."""

    STEP: ClassVar[str] = "finish_run"
    RUNS_AS: ClassVar[str] = "plain (exit handler)"
    OUTPUTS: ClassVar[tuple[str, ...]] = ()

    run_id: str = arg("", "the parent run (start_run's output); empty: nothing to do")
    status: str = arg("Succeeded", "Argo's workflow.status (Succeeded, Failed, Error)")
    run_root: str = arg(
        "", "local run root: its mlflow.db serves when MLFLOW_TRACKING_URI is unset"
    )
    output_dir: str = arg("", "unused (every step accepts it)")


@dataclass(frozen=True)
class RdzvArgs:
    """A rank pod's rendezvous: rank 0 hosts the store and publishes it, the others find it."""

    STEP: ClassVar[str] = "rdzv"
    RUNS_AS: ClassVar[str] = "plain, wrapping torchrun (every rank pod)"
    OUTPUTS: ClassVar[tuple[str, ...]] = ()

    run_root: str = arg(doc="run root URI: generations are published under rendezvous/")
    node_rank: int = arg(0, "this pod's index among the ranks; 0 hosts the store", at_least=0)
    host: str = arg("", 'address rank 0 publishes ("": its pod IP from the downward API)')
    port: int = arg(29400, "TCP port of the store rank 0 hosts")
    join_timeout_s: float = arg(
        300.0, "how long a rank looks for a live generation before it fails", at_least=1.0
    )
    host_lost_s: float = arg(
        120.0,
        "a rank whose rendezvous host has not answered this long stops torchrun and fails "
        "(0: never; the builder passes the process-group timeout)",
        at_least=0.0,
    )
    output_dir: str = arg("", "accepted like every step's; the rendezvous writes no outputs")


@dataclass(frozen=True)
class DrillArgs:
    """What a verification drill checks (the retention CronWorkflow runs it)."""

    STEP: ClassVar[str] = "drill"
    RUNS_AS: ClassVar[str] = "plain (cron)"
    OUTPUTS: ClassVar[tuple[str, ...]] = ("verified", "corrupt", "loaded_step")

    ckpt_root: str = arg(doc="checkpoint root URI to drill")
    newest: int = arg(2, "read every byte of the newest N committed steps", at_least=0)
    test_load: bool = arg(True, "load the latest valid step into its model and run it once")
    output_dir: str = arg("", "where Argo output parameters go (verified, corrupt, loaded_step)")


# In the order of the image's STEP_MODULES (images/step.Dockerfile) and docs/contracts.md.
STEP_ARGS: tuple[type, ...] = (
    StartRunArgs,
    PretrainArgs,
    EvaluateArgs,
    FinetuneArgs,
    SelectArgs,
    FinishRunArgs,
    RdzvArgs,
    DrillArgs,
)
