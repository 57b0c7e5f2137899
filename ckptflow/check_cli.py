"""`ckptflow check [--cluster PROFILE.yaml] [--deploy DIR] [-p NAME=VALUE] MANIFEST...`.

Lists, before submit, what would hang or be rejected on that cluster, one line each (see
`ckptflow.workflows.runner.cluster_check`): exit 0 when nothing, 1 when anything, 2 for a usage
error (a manifest or profile that cannot be read). Needs neither hera nor torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckptflow.contract import cli_args
from ckptflow.run_cli import parse_parameters
from ckptflow.workflows.runner import SpecError, load_documents
from ckptflow.workflows.runner.cluster import ClusterError, default_cluster, load_profile
from ckptflow.workflows.runner.cluster_check import check_manifests, deploy_objects

__all__ = ["build_parser", "main"]

# the repository's deploy/ (a source checkout); `--deploy` names another
REPO_DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def build_parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(
        prog="ckptflow check",
        description="List what would hang or be rejected on a cluster before submitting: a pod "
        "that fits no node, a gang larger than the cluster, a retry that can never be scheduled, "
        "/dev/shm above the memory limit, restricted Pod Security Standard violations, a Sensor "
        "or service account deploy/ does not create. Exit code: 0 none, 1 some, 2 usage.",
    )
    p.add_argument("manifests", nargs="+", metavar="MANIFEST", help="rendered manifests (YAML)")
    p.add_argument(
        "--cluster", metavar="PROFILE.yaml",
        help="the cluster's nodes (as for `ckptflow run --cluster`); default this machine",
    )  # fmt: skip
    p.add_argument(
        "--deploy", metavar="DIR", default=None,
        help="the cluster's installed objects (default: ./deploy, else the repository's)",
    )  # fmt: skip
    p.add_argument(
        "-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
        help="a workflow parameter as it will be submitted (default: its default)",
    )  # fmt: skip
    return p


def _deploy_dir(given: str | None) -> Path:
    if given:
        path = Path(given)
        if not path.is_dir():
            raise ClusterError(f"--deploy {given}: no such directory")
        return path
    return Path("deploy") if Path("deploy").is_dir() else REPO_DEPLOY


def main(argv: list[str] | None = None) -> int:
    args = cli_args.parse(build_parser(), argv, {"-p", "--parameter"})
    if isinstance(args, int):
        return args
    try:
        cluster = load_profile(args.cluster) if args.cluster else default_cluster()
        params = parse_parameters(args.parameter)
        docs = [d for path in args.manifests for d in load_documents(path)]
        deploy_dir = _deploy_dir(args.deploy)
        deploy = deploy_objects(str(deploy_dir)) if deploy_dir.is_dir() else ([], "")
    except (ClusterError, SpecError) as exc:
        print(f"ckptflow check: {exc}", file=sys.stderr)
        return 2
    problems = check_manifests(docs, cluster, deploy, f"{deploy_dir}/", params)
    for line in problems:
        print(line)
    nodes = len(cluster.nodes)
    where = f"{cluster.source} ({nodes} node{'s' if nodes != 1 else ''})"
    if problems:
        print(f"\n{len(problems)} problem(s) on {where}", file=sys.stderr)
        return 1
    print(f"ok: nothing would hang or be rejected on {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
