"""A local runner for rendered Argo Workflow manifests (no cluster): `ckptflow run FILE.yaml`.

Pure Python + PyYAML; it imports neither hera nor torch.
"""

from ckptflow.workflows.runner.spec import SpecError, load_manifest
from ckptflow.workflows.runner.workflow import RunResult, run_workflow

__all__ = ["SpecError", "RunResult", "load_manifest", "run_workflow"]
