"""Template forms Argo resolves before it runs a template: `inline` templates of steps/DAG
tasks and the workflow's `templateDefaults`. `expand` rewrites a spec into plain named
templates, so the validator and the executors see only what they already know.

- An `inline:` template (workflow/controller/steps.go and dag.go run `step.Inline` /
  `task.Inline` as the step's template; workflow/validate/validate.go validates it like any
  other) becomes a template of its own, named `PARENT/STEP` (a `/` is not allowed in a
  template name, so it cannot collide with one), and the step names it.
- `spec.templateDefaults` is merged into every template, the template's own values winning
  (workflow/controller/operator.go mergedTemplateDefaultsInto: a strategic merge patch of the
  template over the defaults, where a kind's defaults, e.g. `container:`, apply only to
  templates of that kind).
"""

from __future__ import annotations

import copy
from typing import Any

from ckptflow.workflows.runner.document import SpecError

__all__ = ["expand", "merge_defaults"]

# The template kinds (pkg/apis/workflow/v1alpha1/workflow_types.go Template.GetType)
KINDS = (
    "container", "containerSet", "steps", "script", "resource", "dag", "suspend", "data",
    "http", "plugin",
)  # fmt: skip
# Lists merged by key in a strategic merge patch (k8s.io/api core/v1 Container:
# `patchStrategy:"merge" patchMergeKey:...`); every other list is replaced by the template's.
_MERGE_KEYS = {"env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}
_MAX_INLINE_DEPTH = 20  # inline in inline in ...: bounded, a hostile manifest cannot recurse


def _merge(default: Any, own: Any, key: str | None = None) -> Any:
    """`own` strategically merged over `default`: mappings key by key, keyed lists item by
    item (see _MERGE_KEYS), anything else `own`."""
    if isinstance(default, dict) and isinstance(own, dict):
        out = dict(default)
        for k, v in own.items():
            out[k] = _merge(default[k], v, k) if k in default else v
        return out
    merge_key = _MERGE_KEYS.get(key or "")
    if merge_key and isinstance(default, list) and isinstance(own, list):
        keyed = {d.get(merge_key): d for d in default if isinstance(d, dict)}
        mine = {o.get(merge_key) for o in own if isinstance(o, dict)}
        return [d for k, d in keyed.items() if k not in mine] + list(own)
    return own


def merge_defaults(defaults: dict, tmpl: dict) -> dict:
    """The template with `defaults` (spec.templateDefaults) under it. A kind's defaults
    (`container:`, `script:`...) apply only to a template of that kind, as Argo unsets the
    others before the merge and restores the template's kind after it."""
    kind = next((k for k in KINDS if k in tmpl), None)
    applicable = {k: v for k, v in defaults.items() if k not in KINDS or k == kind}
    applicable.pop("name", None)  # each template keeps its own name
    return _merge(copy.deepcopy(applicable), tmpl)


def _hoist(tmpl: dict, out: list[dict], depth: int) -> dict:
    """The template with each inline step/task template moved to `out` under its own name."""
    if depth > _MAX_INLINE_DEPTH:
        raise SpecError(f"template {tmpl.get('name')!r}: inline templates nested too deep")
    where = tmpl.get("name")
    if isinstance(tmpl.get("steps"), list):
        groups = []
        for group in tmpl["steps"]:
            items = group if isinstance(group, list) else [group]
            new = [_inline_step(where, s, out, depth) for s in items]
            groups.append(new if isinstance(group, list) else new[0])
        tmpl = {**tmpl, "steps": groups}
    dag = tmpl.get("dag")
    if isinstance(dag, dict) and isinstance(dag.get("tasks"), list):
        tasks = [_inline_step(where, t, out, depth) for t in dag["tasks"]]
        tmpl = {**tmpl, "dag": {**dag, "tasks": tasks}}
    return tmpl


def _inline_step(parent: Any, step: Any, out: list[dict], depth: int) -> Any:
    if not isinstance(step, dict) or "inline" not in step:
        return step
    inline = step["inline"]
    where = f"template {parent!r} step/task {step.get('name')!r}"
    if not isinstance(inline, dict):
        raise SpecError(f"{where}: inline: expected a template (a mapping)")
    if "template" in step or "templateRef" in step:
        raise SpecError(f"{where}: inline: give template, templateRef or inline, only one")
    name = f"{parent}/{step.get('name')}"
    hoisted = _hoist({**inline, "name": name}, out, depth + 1)
    out.append(hoisted)
    return {**{k: v for k, v in step.items() if k != "inline"}, "template": name}


def expand(spec: dict) -> dict:
    """A copy of `spec` with inline templates hoisted and templateDefaults merged in (the
    input is not changed). SpecError (one line) for a malformed inline or defaults block."""
    templates = spec.get("templates")
    if not isinstance(templates, list):
        return spec  # the validator says what is wrong
    defaults = spec.get("templateDefaults")
    if defaults is not None and not isinstance(defaults, dict):
        raise SpecError("spec: templateDefaults: expected a template (a mapping)")
    out: list[dict] = []
    for t in templates:
        if not isinstance(t, dict):
            out.append(t)
            continue
        extra: list[dict] = []
        out.append(_hoist(t, extra, 0))
        out.extend(extra)
    if defaults:
        out = [merge_defaults(defaults, t) if isinstance(t, dict) else t for t in out]
    new = {k: v for k, v in spec.items() if k != "templateDefaults"}
    new["templates"] = out
    return new
