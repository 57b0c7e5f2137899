"""Refuse, before anything runs, a manifest whose expressions the runner cannot evaluate:
every `{{=...}}` tag, `outputs.parameters[].valueFrom.expression`,
`outputs.artifacts[].fromExpression`, `retryStrategy.expression`, lifecycle `hooks.*.expression`
and `workflowMetadata.labelsFrom.*.expression` is parsed and its functions checked (expr.check),
each problem one line naming the template and the field.

Simple `{{...}}` tags inside a bare expression are filled in before Argo evaluates it (the
template is substituted first), so they are checked as a placeholder value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ckptflow.workflows.runner.expr import ExprError, check
from ckptflow.workflows.runner.substitution import TAG, expression_tags

__all__ = ["problems"]

# the fields holding a bare expression, by their path's last two keys
_BARE = {("valueFrom", "expression"), ("", "fromExpression"), ("retryStrategy", "expression")}


def _strings(obj: Any, path: list[str]) -> Iterator[tuple[list[str], str]]:
    """(path, text) of every string in a manifest part; a list item with a name is named."""
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            name = v.get("name") if isinstance(v, dict) else None
            yield from _strings(v, [*path, str(name) if isinstance(name, str) else f"[{i}]"])
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, [*path, str(k)])


def _is_bare(path: list[str]) -> bool:
    if path[-1:] == ["fromExpression"]:
        return True
    if path[-1:] == ["expression"] and len(path) >= 3 and path[-3] in ("hooks", "labelsFrom"):
        return True  # a lifecycle hook's condition, a workflowMetadata label's value
    return tuple(path[-2:]) in _BARE


def _field(path: list[str]) -> str:
    return ".".join(path).replace(".[", "[")


def _one(text: str, path: list[str]) -> Iterator[tuple[str, str]]:
    if _is_bare(path):
        try:
            check(TAG.sub("nil", text))
        except ExprError as exc:
            yield _field(path), f"expression {text.strip()[:40]!r}: {exc}"
    if "{{=" not in text:
        return
    ends = 0
    for _, end, expression in expression_tags(text):
        ends = end
        try:
            check(expression)
        except ExprError as exc:
            yield _field(path), f"{{{{={expression.strip()[:40]}}}}}: {exc}"
    if text.find("{{=", ends) >= 0:
        yield _field(path), "an expression tag {{=... has no closing }}"


def problems(spec: dict) -> list[tuple[str, str, str]]:
    """(where, field, why) for each expression of a workflow spec the runner cannot evaluate."""
    out: list[tuple[str, str, str]] = []
    for key, value in spec.items():
        if key == "templates" and isinstance(value, list):
            for t in value:
                if not isinstance(t, dict):
                    continue
                where = f"template {t.get('name')!r}"
                rest = {k: v for k, v in t.items() if k != "name"}
                out += [(where, f, why) for p, s in _strings(rest, []) for f, why in _one(s, p)]
        else:
            out += [("spec", f, why) for p, s in _strings(value, [key]) for f, why in _one(s, p)]
    return out
