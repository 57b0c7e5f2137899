"""The workflow document: load an Argo manifest (YAML), take its spec, and resolve the
workflow parameters (`-p`) against spec.arguments. What cannot run raises SpecError, which the
validator (spec.py) raises too.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import Any

import yaml
from ckptflow.workflows.runner.substitution import to_str

__all__ = [
    "SpecError",
    "arguments_of",
    "load_documents",
    "load_manifest",
    "resolve_template_ref",
    "workflow_name_problem",
    "workflow_spec",
]

KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")


class SpecError(ValueError):
    """The Argo Workflow manifest cannot run locally; the message lists every problem with its
    field. (Not `ckptflow.core.manifest.ManifestError`: that one is a checkpoint's JSON manifest.)"""


# A Workflow is a Kubernetes object: its name is an RFC 1123 subdomain (lower-case letters,
# digits, '-' and '.', starting and ending alphanumeric: k8s.io/apimachinery
# pkg/util/validation/validation.go IsDNS1123Subdomain, applied to every custom resource's
# metadata.name), and Argo refuses one over 63 characters (workflow/validate/validate.go:
# maxCharsInObjectName, "because of the limitation of Kubernetes label" values).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # validation.go dns1123LabelFmt
_WORKFLOW_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # dns1123SubdomainFmt
MAX_WORKFLOW_NAME = 63


def workflow_name_problem(name: str) -> str | None:
    """Why `name` cannot name a Workflow (one line naming the fix), or None."""
    if len(name) > MAX_WORKFLOW_NAME:
        return (
            f"workflow name {name[:70]!r} is {len(name)} characters; Argo allows at most "
            f"{MAX_WORKFLOW_NAME}"
        )
    if not _WORKFLOW_NAME.fullmatch(name):
        return (
            f"workflow name {name!r} is not a Kubernetes name: use lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit (e.g. my-run-1)"
        )
    return None


def read_text(path: Path) -> str:
    """A manifest's text; a file that is not UTF-8 is an OSError (EILSEQ) naming it, which the
    CLI's error table (ckptflow/cli_errors.py) reports as a usage error."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text (byte {exc.start}): give a UTF-8 YAML or JSON file"
        raise OSError(errno.EILSEQ, why, str(path)) from exc


def load_manifest(path: str) -> dict:
    """Read a YAML (or JSON) manifest holding one Workflow or WorkflowTemplate."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{path}: no such manifest file")
    try:
        docs = [d for d in yaml.safe_load_all(read_text(p)) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise SpecError(f"{path}: expected exactly one Workflow document, found {len(docs)}")
    return docs[0]


def workflow_spec(manifest: dict) -> dict:
    """The spec of a Workflow/WorkflowTemplate manifest (or of a bare spec)."""
    if "spec" in manifest or "kind" in manifest:
        kind = manifest.get("kind", "Workflow")
        if kind not in KINDS:
            raise SpecError(f"kind {kind!r} cannot run; expected one of {', '.join(KINDS)}")
        spec = manifest.get("spec")
        if kind == "CronWorkflow" and isinstance(spec, dict):
            spec = spec.get("workflowSpec")  # run one instance now, ignoring the schedule
        if not isinstance(spec, dict):
            raise SpecError("manifest has no spec")
        return spec
    return manifest


def _known_parameters(spec: dict, overrides: dict[str, Any] | None) -> dict[str, str]:
    """Workflow parameter values known before the run, tolerating a malformed spec."""
    values: dict[str, str] = {}
    block = spec.get("arguments")
    for p in (block.get("parameters") or []) if isinstance(block, dict) else []:
        if isinstance(p, dict) and p.get("name") and p.get("value") is not None:
            values[str(p["name"])] = to_str(p["value"])
    values.update({k: to_str(v) for k, v in (overrides or {}).items()})
    return values


# The parameters given to one run (`-p`), bounded before anything runs: each name as Argo
# validates it (workflow/validate/validate.go paramOrArtifactNameRegex; 253, a Kubernetes
# name's length), at most MAX_ARGUMENTS of them, each value at most MAX_ARGUMENT_BYTES (Argo
# caps an output parameter at 256 KiB, executor's MaxOutputResultLength) and all together at most
# MAX_ALL_ARGUMENT_BYTES (the whole Workflow object must fit etcd's 1.5 MiB request limit).
_PARAMETER_NAME = re.compile(r"[-a-zA-Z0-9_]+")
MAX_PARAMETER_NAME = 253
MAX_ARGUMENTS = 512
MAX_ARGUMENT_BYTES = 256 * 1024
MAX_ALL_ARGUMENT_BYTES = 1024 * 1024


def check_arguments(given: dict[str, str]) -> None:
    """Raise SpecError (one line naming the parameter) for a `-p` no run may take."""
    if len(given) > MAX_ARGUMENTS:
        raise SpecError(f"{len(given)} -p parameters; give at most {MAX_ARGUMENTS} parameters")
    total = 0
    for name, value in given.items():
        if len(name) > MAX_PARAMETER_NAME:
            raise SpecError(
                f"-p {name[:40]}...: a parameter name of at most {MAX_PARAMETER_NAME} characters"
            )
        if not _PARAMETER_NAME.fullmatch(name):
            raise SpecError(f"-p {name}: a parameter name is letters, digits, '_' and '-'")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ARGUMENT_BYTES:
            raise SpecError(f"-p {name}: a value of at most {MAX_ARGUMENT_BYTES} bytes ({size})")
        if "\x00" in value:  # no process takes it in an argument or a variable
            raise SpecError(f"-p {name}: a value without NUL characters")
        total += size
    if total > MAX_ALL_ARGUMENT_BYTES:
        raise SpecError(
            f"-p: parameters of at most {MAX_ALL_ARGUMENT_BYTES} bytes in all ({total})"
        )


def arguments_of(spec: dict, overrides: dict[str, Any] | None) -> dict[str, str]:
    """Workflow parameters: spec.arguments overridden by `overrides` (like `argo submit -p`),
    which are bounded first (`check_arguments`)."""
    values: dict[str, str] = {}
    missing = []
    overrides = {str(k): to_str(v) for k, v in (overrides or {}).items()}
    check_arguments(overrides)
    for p in (spec.get("arguments") or {}).get("parameters") or []:
        name = p["name"]
        if name in overrides:
            values[name] = overrides[name]
        elif p.get("value") is not None:
            values[name] = to_str(p["value"])
        else:
            missing.append(name)
            continue
        enum = p.get("enum")
        if enum and values[name] not in [to_str(e) for e in enum]:
            raise SpecError(f"parameter {name}={values[name]!r} is not one of {enum}")
    for name, value in overrides.items():
        values.setdefault(name, value)
    if missing:
        flags = " ".join(f"-p {m}=VALUE" for m in missing)
        raise SpecError(f"workflow parameters without a value: {', '.join(missing)}; pass {flags}")
    return values


def resolve_template_ref(manifest: dict, templates: list[dict]) -> dict:
    """A Workflow whose spec names a `workflowTemplateRef`, as the controller runs it: the
    referenced (Cluster)WorkflowTemplate's spec with the Workflow's own fields over it, and the
    parameters and artifacts of spec.arguments merged by name (the Workflow's win). A manifest
    without a reference is returned as it is; SpecError when `templates` lacks the one named."""
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    ref = spec.get("workflowTemplateRef") if isinstance(spec, dict) else None
    if not ref:
        return manifest
    if not isinstance(ref, dict) or not ref.get("name"):
        raise SpecError("spec.workflowTemplateRef: expected a mapping with a name")
    kind = "ClusterWorkflowTemplate" if ref.get("clusterScope") else "WorkflowTemplate"
    found = [
        t
        for t in templates
        if isinstance(t, dict)
        and t.get("kind") == kind
        and (t.get("metadata") or {}).get("name") == ref["name"]
    ]
    if not found:
        given = ", ".join(str((t.get("metadata") or {}).get("name")) for t in templates) or "none"
        raise SpecError(
            f"workflowTemplateRef {ref['name']!r}: no {kind} of that name was given "
            f"(pass its manifest with --template-file FILE; given: {given})"
        )
    base = found[0].get("spec")
    if not isinstance(base, dict):
        raise SpecError(f"{kind} {ref['name']!r} has no spec")
    own = {k: v for k, v in spec.items() if k != "workflowTemplateRef"}
    merged = {**base, **{k: v for k, v in own.items() if k != "arguments"}}
    arguments = _merged_arguments(base.get("arguments") or {}, own.get("arguments") or {})
    if arguments:
        merged["arguments"] = arguments
    meta = dict(manifest.get("metadata") or {})
    tmeta = found[0].get("metadata") or {}
    for key in ("labels", "annotations"):
        if tmeta.get(key) or meta.get(key):
            meta[key] = {**(tmeta.get(key) or {}), **(meta.get(key) or {})}
    return {**manifest, "metadata": meta, "spec": merged}


def _merged_arguments(base: dict, own: dict) -> dict:
    out = {}
    for key in ("parameters", "artifacts"):
        items = {p.get("name"): dict(p) for p in base.get(key) or [] if isinstance(p, dict)}
        for p in own.get(key) or []:
            if isinstance(p, dict):
                items[p.get("name")] = {**items.get(p.get("name"), {}), **p}
        if items:
            out[key] = list(items.values())
    return out


def load_documents(path: str) -> list[dict]:
    """Every document of a YAML file (e.g. the WorkflowTemplates a Workflow may reference)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{path}: no such manifest file")
    try:
        return [d for d in yaml.safe_load_all(read_text(p)) if isinstance(d, dict)]
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
