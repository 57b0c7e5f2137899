"""The cluster model's command-line options, `--cluster PROFILE.yaml` and `--fail-node
NODE@SECONDS`, declared and read once for both commands that take them: `ckptflow run FILE`
(ckptflow/run_cli.py) and `ckptflow run pipeline|pretrain|finetune --local`
(workflows/local.py). Two copies had drifted apart in their help texts already."""

from __future__ import annotations

from ckptflow.workflows.runner.cluster import Cluster, ClusterError, load_profile
from ckptflow.workflows.runner.nodelifecycle import FailNode, fail_nodes_of

__all__ = ["add_options", "failures", "profile"]


def add_options(parser) -> None:
    """Add `--cluster` and `--fail-node` to an argparse parser (which has `--isolate`)."""
    parser.add_argument(
        "--cluster", metavar="PROFILE.yaml",
        help="with --isolate: the nodes pods are scheduled on (name, labels, taints, "
        "allocatable); default this machine as one node",
    )  # fmt: skip
    parser.add_argument(
        "--fail-node", action="append", default=[], metavar="NODE@SECONDS",
        help="with --cluster: NODE fails silently SECONDS after its first pod started (pods "
        "frozen, traffic dropped); NotReady, eviction and Argo's retry follow (repeatable)",
    )  # fmt: skip


def profile(args) -> Cluster | None:
    """The cluster of `--cluster` (None: the runner's default one-node cluster); ClusterError
    (one line) for a profile that cannot be used, or `--cluster` without `--isolate` (without
    it tasks are processes, which nothing schedules)."""
    if not args.cluster:
        return None
    if not args.isolate:
        raise ClusterError(
            "--cluster schedules pods: add --isolate (without it tasks are processes)"
        )
    return load_profile(args.cluster)


def failures(args, cluster: Cluster | None) -> list[FailNode]:
    """The `--fail-node` failures on `cluster` (nodelifecycle.fail_nodes_of); ClusterError
    (its one line) for a usage mistake: no cluster, no such node, a node twice, no freezer."""
    try:
        return fail_nodes_of(args.fail_node, cluster)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
