"""Label selectors and field paths, as the API server and Argo read them: `parse_selector`
(labels.Parse), a metav1.LabelSelector mapping, `Requirement.matches`, and `field_value`/`as_text`
(gjson, as Argo's resource conditions read an object). Used by the object store's `list`
(objects.py) and by `resource` templates' success and failure conditions (resource_fields.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ckptflow.workflows.runner.object_rules import Invalid

__all__ = ["Requirement", "as_text", "field_value", "parse_selector", "selector_requirements"]


def field_value(obj: Any, path: str) -> tuple[bool, Any]:
    """(exists, value) of a dotted path (`status.phase`, `spec.containers.0.name`) in an object,
    as gjson reads it in Argo's resource conditions (workflow/executor/resource.go)."""
    value = obj
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def as_text(value: Any) -> str:
    """A value as gjson's `String()` gives it: strings bare, numbers and booleans as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, separators=(",", ":"))


class Requirement:
    """One requirement of a label selector (k8s.io/apimachinery/pkg/labels/selector.go)."""

    def __init__(self, key: str, op: str, values: tuple[str, ...] = ()) -> None:
        self.key, self.op, self.values = key, op, values

    def matches(self, lookup: Callable[[str], tuple[bool, str]]) -> bool:
        """Requirement.Matches over `lookup(key) -> (exists, value as text)`."""
        has, value = lookup(self.key)
        if self.op in ("=", "==", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        # gt/lt: both sides must be integers (strconv.ParseInt), else no match
        if not has:
            return False
        try:
            left, right = int(value), int(self.values[0])
        except ValueError:
            return False
        return left > right if self.op == ">" else left < right

    def __repr__(self) -> str:
        """As Requirement.String() writes it (`status.phase in (Error,Failed)`, `n>1`)."""
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("in", "notin"):
            return f"{self.key} {self.op} ({','.join(sorted(self.values))})"
        return f"{self.key}{self.op}{self.values[0]}"


_TOKEN = re.compile(r"\s*(==|!=|=|!|<|>|\(|\)|,|[^\s=!<>(),]+)")


def parse_selector(text: str) -> list[Requirement]:
    """The requirements of a selector string: `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>1`
    (labels.Parse); Invalid (one line) for what it cannot parse."""
    text = str(text)
    if len(text) > 4096:
        raise Invalid("selector is over 4096 characters")
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            break
        tokens.append(m.group(1))
        pos = m.end()
    if text[pos:].strip():
        raise Invalid(f"selector {text!r}: cannot parse {text[pos:]!r}")
    reqs: list[Requirement] = []
    i = 0

    def expect_value(j: int) -> str:
        if j >= len(tokens) or tokens[j] in ("(", ")", ",", "=", "==", "!=", "!", "<", ">"):
            raise Invalid(f"selector {text!r}: a value is missing")
        return tokens[j]

    while i < len(tokens):
        if tokens[i] == "!":
            reqs.append(Requirement(expect_value(i + 1), "!"))
            i += 2
        else:
            key = expect_value(i)
            op = tokens[i + 1] if i + 1 < len(tokens) else ","
            if op == ",":
                reqs.append(Requirement(key, "exists"))
                i += 1
            elif op in ("=", "==", "!="):
                nxt = tokens[i + 2] if i + 2 < len(tokens) else ","
                value = "" if nxt == "," else expect_value(i + 2)
                reqs.append(Requirement(key, op, (value,)))
                i += 2 if nxt == "," else 3
            elif op in ("<", ">"):
                value = expect_value(i + 2)
                if not re.fullmatch(r"-?\d+", value):
                    raise Invalid(f"selector {text!r}: {value!r} is not an integer")
                reqs.append(Requirement(key, op, (value,)))
                i += 3
            elif op in ("in", "notin"):
                if i + 2 >= len(tokens) or tokens[i + 2] != "(":
                    raise Invalid(f"selector {text!r}: {op} needs a (list)")
                j, values = i + 3, []
                while j < len(tokens) and tokens[j] != ")":
                    if tokens[j] != ",":
                        values.append(tokens[j])
                    j += 1
                if j >= len(tokens):
                    raise Invalid(f"selector {text!r}: ')' is missing")
                reqs.append(Requirement(key, op, tuple(values)))
                i = j + 1
            else:
                raise Invalid(f"selector {text!r}: unknown operator {op!r}")
        if i < len(tokens):
            if tokens[i] != ",":
                raise Invalid(f"selector {text!r}: expected ',' before {tokens[i]!r}")
            i += 1
    return reqs


def selector_requirements(selector: Any) -> list[Requirement]:
    """Requirements of a selector string or a metav1.LabelSelector mapping."""
    if selector is None or selector == "":
        return []
    if isinstance(selector, str):
        return parse_selector(selector)
    if not isinstance(selector, Mapping):
        raise Invalid(f"selector {selector!r} is neither a string nor a mapping")
    reqs = [
        Requirement(str(k), "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for e in selector.get("matchExpressions") or []:
        op = ops.get(str((e or {}).get("operator")))
        if op is None:
            raise Invalid(
                f"matchExpressions operator {e.get('operator')!r} is not one of {list(ops)}"
            )
        reqs.append(
            Requirement(str(e.get("key")), op, tuple(str(v) for v in e.get("values") or []))
        )
    return reqs
