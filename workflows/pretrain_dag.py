"""Distributed pretraining as an Argo DAG: N rank pods (rank 0 hosting the rendezvous), evaluators.

Rendezvous design (issue 34). torchrun's c10d rendezvous needs one TCP store every rank can
reach. The rank pod of index 0 hosts it and publishes its address, one generation per start of
that pod, in the run's storage (`<run_root>/rendezvous/`); every rank pod runs

    python -m ckptflow.steps.rdzv --run-root R --node-rank {{item}} --port PORT
        --join-timeout-s T -- --nnodes=N --nproc-per-node=P --rdzv-backend=c10d
        --rdzv-id={{workflow.uid}} --rdzv-conf=is_host=false,join_timeout=T
        --max-restarts=R -m ckptflow.steps.pretrain ...

which finds the newest live generation (a stale one, its pod gone, is detected and retried)
and runs torchrun with `--rdzv-endpoint` set to it (steps/rdzv.py explains why not a separate
daemon or a Service). No pod exists besides the ranks, and every pod has a retryStrategy: a
lost rank 0 comes back as a new generation. A lost rank's peers fail within the process-group
timeout (`pretrain.pg_timeout_s`), so the whole gang comes back (Argo retries each) and
resumes from the newest valid checkpoint; torchrun's `--max-restarts` re-forms the group in
place when only a worker failed. `is_host=false` keeps torchrun from opening a second store.
Under the local runner the same manifest runs unchanged (every pod's IP is 127.0.0.1, or its
own namespace's under --isolate).

The background evaluator (`ckptflow.steps.evaluate --forever`, a daemon) runs beside the ranks in
the same DAG, evaluating each committed checkpoint once, until the DAG ends and stops it (Argo
fails a daemon that exits by itself); `evaluate-final` (`--until-finished`) follows the ranks and
exits once the run's FINISHED marker is there and every step has a result. Only URIs pass
between tasks, the checkpoints themselves go through object storage.
"""

from __future__ import annotations

from dataclasses import replace

from ckptflow.workflows import parameters
from ckptflow.workflows.config import ConfigError, PipelineConfig, PretrainConfig
from ckptflow.workflows.evaluate_template import evaluator
from ckptflow.workflows.gang_scheduling import mark_ranks, podgroup_template
from ckptflow.workflows.local_tier import local_size_mib, local_volume
from ckptflow.workflows.metrics import save_metrics
from ckptflow.workflows.parameters import ref
from ckptflow.workflows.staged_workflow import Stage, staged_workflow
from ckptflow.workflows.templates import param, run_root, step
from hera.workflows import DAG, Parameter, Workflow
from hera.workflows.models import Sequence

from ckptflow.contract import PretrainArgs, RdzvArgs, to_argv

DAG_NAME = "pretrain"
# The rank's step arguments that are workflow parameters (ckptflow.workflows.parameters).
KNOB_ARGS = {
    "model": ref("model"),
    "task": ref("pretrain_task"),
    "max_steps": ref("pretrain_steps"),
    "lr": ref("pretrain_lr"),
    "ckpt_every": ref("ckpt_every"),
    "full_every": ref("full_every"),
}


def torchrun_args(c: PretrainConfig) -> list[str]:
    """torchrun's arguments joining this rank to the daemon-hosted c10d rendezvous."""
    return [
        f"--nnodes={ref('ranks')}",
        f"--nproc-per-node={c.procs_per_rank}",
        "--rdzv-backend=c10d",
        "--rdzv-id={{workflow.uid}}",
        f"--rdzv-conf=is_host=false,join_timeout={c.rdzv_join_timeout_s}",
        f"--max-restarts={c.max_restarts}",
    ]


def rendezvous_args(c: PretrainConfig) -> list[str]:
    """The rank pod's command up to torchrun's arguments: `ckptflow.steps.rdzv`, which hosts
    (index 0) or finds the rendezvous of this generation, then runs torchrun there."""
    rdzv = RdzvArgs(
        run_root="",
        port=c.rdzv_port,
        join_timeout_s=float(c.rdzv_join_timeout_s),
        # a survivor of a lost rendezvous host leaves within the same bound as a survivor of
        # a lost peer (issue 34): the planner's detection holds for both
        host_lost_s=float(c.train.pg_timeout_s),
    )
    argv = to_argv(rdzv, run_root=param("run_root"), node_rank=param("node_rank"))
    return ["python", "-m", "ckptflow.steps.rdzv", *argv, "--"]


def add_pretrain_dag(cfg: PipelineConfig) -> DAG:
    """Add the pretraining templates and their DAG (inputs run_root, parent_run_id).

    Call inside a Workflow context; the DAG is invoked as a task of the caller's DAG.
    """
    p, c = cfg.platform, cfg.pretrain
    if c.ranks < 1 or c.procs_per_rank < 1:
        raise ConfigError("pretrain.ranks and pretrain.procs_per_rank must be at least 1")
    # the local tier's budget is its volume's size (platform.local_volume_size); its folder is
    # always on the command line when the tier is on, even the default: the local runner maps a
    # mount path where it appears, and a step's own default would be this machine's /ckpt-local
    args = replace(c.train, local_size_mib=local_size_mib(p.local_volume_size))
    local_arg = {"local_dir": c.train.local_dir} if c.train.local_every > 0 else {}
    train = to_argv(
        args,
        run_root=param("run_root"),
        mlflow_parent_run_id=param("parent_run_id"),
        **KNOB_ARGS,
        **local_arg,
    )
    rank = step(
        "pretrain-rank",
        "pretrain",
        train,
        platform=p,
        resources=c.rank_resources,
        inputs=("run_root", "parent_run_id", "node_rank"),
        output_names=PretrainArgs.OUTPUTS,
        metrics=save_metrics("pretrain-rank"),
        launcher=torchrun_args(c),
        wrapper=rendezvous_args(c),
        retries=c.retries,
        backoff_s=c.retry_backoff_s,
        timeout=ref("pretrain_timeout"),  # "" by default: no deadline
        retry_elsewhere=c.retry_elsewhere,
        shm_size=c.shm_size,
        grace_s=c.grace_s,
    )
    local = local_volume(p, c.train)  # the local checkpoint tier's volume, when it is on
    if local is not None:
        rank.volumes = [*(rank.volumes or []), local]
    # all ranks start together or none does (platform.gang_scheduler): their gang's markings,
    # and the run's PodGroup made before them where the scheduler needs one
    mark_ranks(rank, p, ref("ranks"))
    group = podgroup_template(p, ref("ranks"))
    # Argo fails a daemon whose pod exits 0 (operator.go), so the background evaluator never
    # exits by itself (--forever): its DAG stops it. The final one is a regular task that
    # exits once the run is FINISHED and every step has a result.
    kinds = {
        "background": (replace(c.evaluator, forever=True), True),
        "final": (replace(c.evaluator, until_finished=True), False),
    }
    background, final = (
        evaluator(
            f"evaluate-{kind}",
            args,
            ("run_root", "parent_run_id"),
            platform=p,
            resources=c.evaluator_resources,
            retries=c.retries,
            backoff_s=c.retry_backoff_s,
            timeout=ref("evaluator_timeout"),
            daemon=daemon,
        )
        for kind, (args, daemon) in kinds.items()
    )
    refs = {"run_root": param("run_root"), "parent_run_id": param("parent_run_id")}
    with DAG(
        name=DAG_NAME, inputs=[Parameter(name="run_root"), Parameter(name="parent_run_id")]
    ) as dag:
        ranks = rank(
            name="rank",
            arguments={**refs, "node_rank": "{{item}}"},
            with_sequence=Sequence(count=ref("ranks")),
        )
        # The background evaluator is a daemon that never exits: when the ranks fail, failFast
        # starts nothing more and the DAG ends (Failed) at once, stopping it, rather than
        # waiting for a FINISHED that never comes (issue 15). When they succeed, `evaluate-final` follows
        # the run to its end beside it: every checkpoint is evaluated once (claims).
        background(name="evaluate", arguments=refs)
        last = final(name="evaluate-final", arguments=refs)
        ranks >> last
        if group is not None:
            group(name="podgroup") >> ranks
    return dag


def ui_text(cfg: PipelineConfig) -> tuple[str, str]:
    """The Argo UI's title and description of the pretraining workflow (the knobs are its
    parameters: the text names what they do, not values a submission may change)."""
    c, t = cfg.pretrain, cfg.pretrain.train
    mode = "async" if t.async_save else "sync"
    return (
        f"ckptflow pretrain: N ranks x {c.procs_per_rank} processes",
        f"checkpointed pretraining ({mode} saves), background evaluation of each checkpoint",
    )


def build_pretrain(cfg: PipelineConfig) -> Workflow:
    """Pretraining alone: start_run -> (N ranks, evaluator); finish_run on exit."""
    root = run_root(cfg.platform, cfg.pretrain.run_root, "pretrain")
    stage = Stage("pretrain", add_pretrain_dag, {"run_root": root})
    title, description = ui_text(cfg)
    return staged_workflow(
        cfg,
        [stage],
        prefix=f"{cfg.name}-pretrain",
        title=title,
        description=description,
        arguments=parameters.arguments(cfg, parameters.PRETRAIN),
    )
