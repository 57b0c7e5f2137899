"""Run a rendered workflow as pods the way `ckptflow run ... --local --isolate` does (one
place for the tests that need it): a pod node, the in-process S3 server and a real MLflow
server on the pods' bridge, all checkpoints through S3, and a check that nothing leaks.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ckptflow.workflows.local import local_config, summary
from ckptflow.workflows.local_services import S3_KEYS, MlflowServer, free_port, start_s3
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.isolation import new_node
from ckptflow.workflows.runner.pods import PREFIX, leftovers
from ckptflow.workflows.runner.pods.naming import PID_DIGITS, base36


@dataclass
class Outcome:
    """What a run left: the runner's result, the local summary text, the side thread (a
    killer) and the wall time of the workflow."""

    result: object
    text: str
    side: object
    took: float


def run_isolated(
    tmp_path: Path,
    name: str,
    overrides,
    target="pretrain",
    edit=None,
    side_for=None,
    gate=None,
    cluster=None,
    fail_nodes=None,
) -> Outcome:
    """Render `target` with `overrides`, let `edit(manifest)` change it, start `side_for(node)`
    (a thread that kills pods or cuts the network) and run it; `gate` sits in front of S3;
    `cluster` (a loaded profile) is the nodes the pods are bound to (default: this machine);
    `fail_nodes` (nodelifecycle.FailNode) lose nodes of it silently, as `--fail-node` does."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **S3_KEYS}
    side = None
    with contextlib.ExitStack() as stack:
        node = new_node()
        stack.callback(node.close)
        server, endpoint = start_s3(node.address)
        stack.callback(server.stop)
        if gate is not None:  # the pods reach S3 only through the gate, which can cut it
            endpoint = gate.open_to(node.address, endpoint)
            stack.callback(gate.close)
        tracking = stack.enter_context(
            MlflowServer(node.address, tmp_path / name / "mlflow", free_port(node.address))
        )
        cfg = local_config(
            tmp_path, s3_endpoint=endpoint, overrides=overrides, mlflow_uri=tracking.uri
        )
        manifest = manifests(target, cfg)[0]
        if edit is not None:
            edit(manifest)
        if side_for is not None:
            side = side_for(node)
            side.start()
            stack.callback(side.stop.set)
        start = time.monotonic()
        result = run_workflow(
            manifest, workdir=str(tmp_path / name / "argo"), name=name, env=env,
            stream=io.StringIO(), pod_node=node, cluster=cluster, fail_nodes=fail_nodes,
        )  # fmt: skip
        took = time.monotonic() - start
        assert side is None or getattr(side, "error", None) is None, side.error
        text = summary(cfg, name, result, tmp_path, env, tracking.dir / "mlflow.db")
    left = {k: v for k, v in leftovers(PREFIX + base36(os.getpid(), PID_DIGITS)).items() if v}
    assert not left, left
    return Outcome(result, text, side, took)
