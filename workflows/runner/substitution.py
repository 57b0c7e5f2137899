"""`{{...}}` substitution, loop-item expansion and the small value conversions Argo applies.

Substitution replaces only the tags whose name is known and leaves the rest in place, so a
template can be filled in stages (inputs first, then task outputs, then `{{item}}`), as the
Argo controller does; `unresolved` lists what is left once a stage must be complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ckptflow.workflows.runner import expr

__all__ = [
    "TAG",
    "render",
    "explain",
    "per_item",
    "substitute_item",
    "expression_tags",
    "substitute",
    "unresolved",
    "to_str",
    "item_vars",
    "item_label",
    "expand_items",
    "parse_duration",
]

TAG = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


def to_str(value: Any) -> str:
    """A parameter value as Argo writes it: strings raw, JSON for everything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _simple(text: str, values: dict[str, str]) -> str:
    return TAG.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), text)


def expression_tags(text: str):
    """(start, end, expression) of each `{{=...}}` tag: it ends at the first `}}`, as Argo's
    fasttemplate delimits tags (util/template/template.go), so `{# > 1}` and maps nest inside."""
    pos = 0
    while (start := text.find("{{=", pos)) >= 0:
        end = text.find("}}", start + 3)
        if end < 0:
            return
        yield start, end + 2, text[start + 3 : end]
        pos = end + 2


def _expression(tag: str, expression: str, env: dict) -> str:
    """One `{{=...}}` tag's text (util/template/expression_template.go expressionReplaceCore): a
    string as it is, anything else as Go's JSON. A name not in scope yet, a nil result or an
    error leave the tag for a later stage with more names, as Argo's allowUnresolved does; the
    stage that needs it complete reports it with `explain`."""
    try:
        value = expr.evaluate(expression, env)
    except expr.ExprError:
        return tag
    if value is None:
        return tag
    return value if isinstance(value, str) else expr.go_json(value)


def render(text: str, values: dict[str, str], *, simple: bool = True) -> str:
    """Replace the known `{{name}}` tags (unless not `simple`) and the `{{=expression}}` tags
    that evaluate."""
    if "{{" not in text:
        return text
    if "{{=" not in text:
        return _simple(text, values) if simple else text
    out, pos, env = [], 0, expr.expand(values)
    for start, end, expression in expression_tags(text):
        plain = text[pos:start]
        out.append(_simple(plain, values) if simple else plain)
        out.append(_expression(text[start:end], expression, env))
        pos = end
    out.append(_simple(text[pos:], values) if simple else text[pos:])
    return "".join(out)


def substitute_item(obj: Any, item: Any, scope: dict[str, str]) -> Any:
    """One loop item's copy of a step/task: its `{{item}}` tags, then the expressions left,
    with the item and the `scope` it was planned in (Argo evaluates `{{=...}}` once, with
    every name: `{{=asInt(item) * asInt(inputs.parameters.n)}}`)."""
    one = substitute(obj, item_vars(item))
    if not any(t.startswith("{{=") for t in unresolved(one)):
        return one
    env = {**scope, **item_vars(item)}
    return map_strings(one, lambda text: render(text, env, simple=False))


def per_item(tag: str) -> bool:
    """Whether a tag is filled per loop item (`{{item}}`, `{{item.x}}`, or an expression that
    uses `item`, which Argo leaves for the item too: expression_template.go variablesToCheck)."""
    if tag == "{{item}}" or tag.startswith("{{item."):
        return True
    return tag.startswith("{{=") and "item" in expr.names(tag[3:-2])


def explain(tag: str, values: dict[str, str]) -> str:
    """Why a tag left by `render` did not resolve: for an expression, its error."""
    if not tag.startswith("{{="):
        return tag
    try:
        value = expr.evaluate(tag[3:-2], expr.expand(values))
    except expr.ExprError as exc:
        return f"{tag}: {exc}"
    return f"{tag}: evaluated to nil" if value is None else tag


def substitute(obj: Any, values: dict[str, str], *, skip: tuple[str, ...] = ()) -> Any:
    """A copy of `obj` with known tags replaced in every string (keys in `skip` left as they are)."""
    if isinstance(obj, str):
        return render(obj, values)
    if isinstance(obj, list):
        return [substitute(v, values) for v in obj]
    if isinstance(obj, dict):
        return {k: (v if k in skip else substitute(v, values, skip=skip)) for k, v in obj.items()}
    return obj


def unresolved(obj: Any, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Every `{{...}}` and `{{=...}}` tag still present in `obj` (keys in `skip` not searched)."""
    if isinstance(obj, str):
        tags = ["{{=" + e + "}}" for _, _, e in expression_tags(obj)]
        simple = [m for m in TAG.finditer(obj) if not m.group(0).startswith("{{=")]
        return tags + ["{{" + m.group(1) + "}}" for m in simple]
    if isinstance(obj, list):
        return [t for v in obj for t in unresolved(v)]
    if isinstance(obj, dict):
        return [t for k, v in obj.items() if k not in skip for t in unresolved(v, skip=skip)]
    return []


def item_vars(item: Any) -> dict[str, str]:
    """The `{{item}}` / `{{item.field}}` values for one loop item."""
    values = {"item": to_str(item)}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                values[f"{prefix}.{k}"] = to_str(v)
                walk(f"{prefix}.{k}", v)

    walk("item", item)
    return values


def _go_v(value: Any) -> str:
    if isinstance(value, list):
        return "[" + " ".join(_go_v(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_v(v)}" for k, v in sorted(value.items())) + "]"
    return to_str(value)


def item_label(name: str, index: int, item: Any) -> str:
    """Argo's name for an expanded node: `A(0:foo)`, `A(1:a:1,b:2)` for a map item."""
    if isinstance(item, dict):
        desc = ",".join(sorted(f"{k}:{_go_v(v)}" for k, v in item.items()))
    else:
        desc = _go_v(item)
    return f"{name}({index}:{desc})"


def _sequence(seq: dict) -> list[str]:
    fmt = seq.get("format") or "%d"
    if "count" in seq and "end" in seq:
        raise ValueError("withSequence: give either count or end, not both")
    start = int(to_str(seq.get("start", 0)) or 0)
    if "count" in seq:
        count = int(to_str(seq["count"]))
        numbers = list(range(start, start + count))
    elif "end" in seq:
        end = int(to_str(seq["end"]))
        step = 1 if end >= start else -1
        numbers = list(range(start, end + step, step))
    else:
        raise ValueError("withSequence needs count or end")
    return [fmt % n for n in numbers]


def expand_items(spec: dict) -> list[Any] | None:
    """The loop items of a substituted step/task, or None when it does not loop."""
    if spec.get("withItems") is not None:
        return list(spec["withItems"])
    if spec.get("withParam") is not None:
        raw = spec["withParam"]
        if isinstance(raw, list):
            return raw
        try:
            items = json.loads(raw)
        except (TypeError, ValueError):
            items = None
        if not isinstance(items, list):
            raise ValueError(
                f"withParam value could not be parsed as a JSON list: {str(raw).strip()}"
            )
        return items
    if spec.get("withSequence") is not None:
        return _sequence(spec["withSequence"])
    return None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)")
_UNIT = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}


def parse_duration(value: Any) -> float:
    """Seconds from a Go duration ("1m30s") or a plain number of seconds."""
    text = to_str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r} (use e.g. 30, 30s, 2m, 1h30m)")
    return sum(float(n) * _UNIT[u] for n, u in parts)


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """A copy of a JSON-like value (dicts, lists, scalars) with `fn` applied to every string in
    it: how a template's fields get their paths rewritten (volumes, artifact paths)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    return value
