"""What a resource template reads from an object: its success/failure conditions and its
output parameters (`jsonPath`, `jqFilter`), as Argo's executor reads them
(workflow/executor/resource.go matchConditions, SaveResourceParameters, jqFilter)."""

from __future__ import annotations

import json
import re

from ckptflow.workflows.runner.selectors import as_text, field_value, parse_selector
from ckptflow.workflows.runner.substitution import to_str

__all__ = ["ResourceError", "conditions_met", "jq_filter", "json_path", "parse_json_path"]


class ResourceError(Exception):
    """What kubectl or the executor would report (one line); the node Fails with it."""


# -- kubectl jsonpath (a subset) and jq ------------------------------------------------------
_JP_PART = re.compile(r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[['"]([^'"]+)['"]\]""")


def parse_json_path(template: str) -> list[str | list]:
    """A kubectl jsonpath template as literal strings and field paths; ResourceError for the
    parts of the syntax not followed here (filters, wildcards, ranges)."""
    pieces: list[str | list] = []
    pos = 0
    for m in re.finditer(r"\{([^{}]*)\}", template):
        pieces.append(template[pos : m.start()])
        expr = m.group(1).strip()
        if expr in ("", "."):
            pieces.append([])
            pos = m.end()
            continue
        path, at = [], 0
        while at < len(expr):
            part = _JP_PART.match(expr, at)
            if part is None:
                raise ResourceError(f"jsonPath {template!r}: {expr[at:]!r} is not followed locally")
            path.append(int(part.group(2)) if part.group(2) else part.group(1) or part.group(3))
            at = part.end()
        pieces.append(path)
        pos = m.end()
    pieces.append(template[pos:])
    return pieces


def _jp_text(value) -> str:
    """A found field's text: a scalar as a parameter value is written (`to_str`); `null`,
    objects and lists as compact JSON in their own key order (`to_str` writes None as ""
    and sorts keys)."""
    if value is None or isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return to_str(value)


def json_path(obj: dict, template: str) -> str:
    """`kubectl get -o jsonpath=TEMPLATE` on one object; ResourceError when a field is missing."""
    out = []
    for piece in parse_json_path(template):
        if isinstance(piece, str):
            out.append(piece)
            continue
        value = obj
        for key in piece:
            ok = (isinstance(key, int) and isinstance(value, list) and key < len(value)) or (
                isinstance(key, str) and isinstance(value, dict) and key in value
            )
            if not ok:
                raise ResourceError(f"jsonPath {template!r}: {key} is not found")
            value = value[key]
        out.append(_jp_text(value))
    return "".join(out)


def jq_filter(obj: dict, text: str) -> str:
    """Argo's jqFilter output (workflow/executor/resource.go jqFilter): each result a line,
    strings bare, others as Go's json.Marshal writes them (compact, keys sorted)."""
    try:
        import jq  # the `jq` wheel (workflows extra)
    except ImportError:
        raise ResourceError("jqFilter needs the `jq` package (pip install jq)") from None
    try:
        results = jq.compile(text).input_value(obj).all()
    except ValueError as exc:
        raise ResourceError(f"jqFilter {text!r}: {str(exc).splitlines()[0]}") from None
    lines = [
        r if isinstance(r, str) else json.dumps(r, sort_keys=True, separators=(",", ":"))
        for r in results
    ]
    return "\n".join(lines).strip()


# -- conditions ------------------------------------------------------------------------------
def conditions_met(obj: dict, success: str, failure: str) -> bool | None:
    """matchConditions (workflow/executor/resource.go): ResourceError when a failure
    requirement matches; True when every success requirement matches (also when there are
    none); None to keep waiting. Fields are read as gjson reads them (selectors.field_value)."""

    def lookup(key: str) -> tuple[bool, str]:
        has, value = field_value(obj, key)
        return has, as_text(value)

    for req in parse_selector(failure) if failure else []:
        if req.matches(lookup):
            raise ResourceError(f"failure condition '{req}' evaluated true")
    reqs = parse_selector(success) if success else []
    return True if all(r.matches(lookup) for r in reqs) else None
