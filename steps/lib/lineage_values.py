"""What lineage sends to MLflow besides its calls: run and checkpoint-model names, flat params,
the Argo workflow's tags, every value scrubbed of anything that looks like a secret.

Split from ckptflow.steps.lib.lineage, whose `Lineage` sends them.
"""

from __future__ import annotations

import json

from ckptflow import env
from ckptflow.core.layout import step_dir

MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
TAG_ARGO_URL = "ckptflow.argo_url"
TAG_NOTE = "mlflow.note.content"  # the run's description in the UI (markdown)
BAD_MODEL_NAME_CHARS = "/:.%\"'"  # what MLflow refuses in a LoggedModel's name


def run_label(kind: str, run_root: str | None, suffix: str = "") -> str:
    """A run's name that says which one it is: the step kind, then the run root's last part
    when it differs (`finetune-lr0.001-freeze1`, `evaluate-pretrain`), then `suffix` (the
    evaluator's `-follow` or `-final`), so no two runs of a pipeline share a name."""
    last = (run_root or "").rstrip("/").rsplit("/", 1)[-1]
    name = kind if last in ("", kind) else f"{kind}-{last}"
    return f"{name}-{suffix}" if suffix else name


def checkpoint_model_name(run_name: str, step: int) -> str:
    """A checkpoint's LoggedModel name, unique across the experiment: workflow, run, step
    (`ckptflow-x7k2p-finetune-lr0_001-freeze1-step-00000020`)."""
    wf = env.argo_workflow_info().get("workflow_name", "")
    run_name = run_name or "ckpt"
    name = f"{wf}-{run_name}" if wf and not run_name.startswith(wf) else run_name
    return "".join("_" if c in BAD_MODEL_NAME_CHARS else c for c in f"{name}-{step_dir(step)}")


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"section.key": "value"} (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MAX_PARAM_LEN]
    return out


def scrub(values: dict) -> dict[str, str]:
    """Stringify and replace any secret value (e.g. an S3 key pasted into a config) by ***."""
    secrets = [s for s in env.secret_values() if len(s) >= 4]
    out = {}
    for k, v in values.items():
        text = str(v)
        for s in secrets:
            text = text.replace(s, "***")
        out[str(k)] = text
    return out


def workflow_tags() -> dict[str, str]:
    """Argo workflow name/uid/namespace, image and git commit from the environment, as tags;
    the workflow's Argo UI page as a tag and as the run's description (a link in the UI)."""
    info = env.argo_workflow_info()
    tags = {f"ckptflow.{k}": v for k, v in info.items()}
    url = env.argo_workflow_url()
    if url:
        tags[TAG_ARGO_URL] = url
        tags[TAG_NOTE] = f"Argo workflow [{info['workflow_name']}]({url})"
    return tags
