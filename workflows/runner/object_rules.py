"""The API server's rules for one object, apart from the store that holds it (objects.py):
the errors it answers, kubectl's names for a kind, DNS-1123 object names and the bounds on an
object's size and nesting. Kept apart so that the store and the selector parser (selectors.py)
share one set of errors and limits without importing each other.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_OBJECT_BYTES",
    "NAME_PATTERN",
    "SUFFIX_ALPHABET",
    "AlreadyExists",
    "Invalid",
    "NotFound",
    "ObjectError",
    "canonical_kind",
    "check_bounds",
]

# Bounds on one object. etcd refuses a value over 1.5 MiB (its default --max-request-bytes); an
# object here is at most 1 MiB of JSON, nested at most 64 deep (the store's MAX_OBJECTS bounds
# how many a run holds), so a hostile file or manifest cannot exhaust memory.
MAX_OBJECT_BYTES = 1 << 20
MAX_DEPTH = 64
# values in one object: YAML aliases (a "billion laughs" document) can make a small text a huge
# tree, which would be walked and serialised exponentially long
MAX_NODES = 100_000

# kubectl's names for the kinds a workflow uses (resource, plural, short name) -> Kind.
_ALIASES = {
    "ConfigMap": ("configmap", "configmaps", "cm"),
    "Secret": ("secret", "secrets"),
    "Pod": ("pod", "pods", "po"),
    "Service": ("service", "services", "svc"),
    "Job": ("job", "jobs", "jobs.batch", "job.batch"),
    "Workflow": ("workflow", "workflows", "wf", "workflows.argoproj.io"),
    "WorkflowTemplate": ("workflowtemplate", "workflowtemplates", "wftmpl"),
    "CronWorkflow": ("cronworkflow", "cronworkflows", "cwf"),
    "PodGroup": ("podgroup", "podgroups", "pg"),
    "StatefulSet": ("statefulset", "statefulsets", "sts"),
    "Deployment": ("deployment", "deployments", "deploy"),
    "PersistentVolumeClaim": ("persistentvolumeclaim", "persistentvolumeclaims", "pvc"),
}
_BY_ALIAS = {a: kind for kind, aliases in _ALIASES.items() for a in aliases}
# the API server's names: DNS-1123 subdomains (pkg/api/validation ValidateObjectMeta)
NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# k8s.io/apiserver/pkg/storage/names SimpleNameGenerator: 5 characters of this alphabet
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class ObjectError(Exception):
    """A request the API server refuses (one line)."""


class AlreadyExists(ObjectError):
    pass


class NotFound(ObjectError):
    pass


class Invalid(ObjectError):
    pass


def canonical_kind(kind: str) -> str:
    """A Kind from a kind or a kubectl resource name (`configmap`, `cm`, `jobs.batch`, `Pod`)."""
    text = str(kind).strip()
    lowered = text.lower()
    if lowered in _BY_ALIAS:
        return _BY_ALIAS[lowered]
    base = lowered.split(".", 1)[0]
    if base in _BY_ALIAS:
        return _BY_ALIAS[base]
    return text


def check_bounds(obj: Any, what: str) -> None:
    """Invalid when `obj` is nested too deep or too big (see MAX_DEPTH, MAX_OBJECT_BYTES)."""
    stack, seen = [(obj, 1)], 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise Invalid(f"{what}: more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise Invalid(f"{what}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    try:
        size = len(json.dumps(obj, default=str))
    except (TypeError, ValueError) as exc:
        raise Invalid(f"{what}: not a JSON object ({exc})") from None
    if size > MAX_OBJECT_BYTES:
        raise Invalid(f"{what}: {size} bytes is over the {MAX_OBJECT_BYTES}-byte limit")
