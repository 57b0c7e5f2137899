"""A local interpreter for rendered Argo Workflow manifests (no cluster): the API behind
`ckptflow run FILE.yaml` (ckptflow/run_cli.py).

Standalone: pure Python + PyYAML. It imports nothing else of ckptflow (no builders, no
checkpoint core), neither hera nor torch (tests/workflows/test_runner_imports.py).
"""

from ckptflow.workflows.runner.document import (
    SpecError,
    load_documents,
    load_manifest,
    resolve_template_ref,
)
from ckptflow.workflows.runner.isolation import IsolationError
from ckptflow.workflows.runner.workflow import REFUSED_EXIT, RunResult, run_workflow, workflow_name

__all__ = [
    "REFUSED_EXIT",
    "IsolationError",
    "SpecError",
    "RunResult",
    "load_documents",
    "load_manifest",
    "resolve_template_ref",
    "run_workflow",
    "workflow_name",
]
