"""Argo's enhanced `depends` logic: parse, list the tasks it names, evaluate it.

`A.Succeeded && (B.Failed || !C.Skipped)`; a bare `A` means
`(A.Succeeded || A.Skipped || A.Daemoned)`, widened by `A.Errored`/`A.Failed` when task A has
`continueOn.error`/`continueOn.failed` (as Argo's `expandDependency` does). A `dependencies`
list is the conjunction of bare names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["RESULTS", "DependsError", "TaskFacts", "parse_depends", "tasks_in", "evaluate"]

RESULTS = (
    "Succeeded",
    "Failed",
    "Errored",
    "Skipped",
    "Omitted",
    "Daemoned",
    "AnySucceeded",
    "AllFailed",
)

_TOKEN = re.compile(r"\s*(?:(&&|\|\||!|\(|\))|([A-Za-z0-9][-A-Za-z0-9_]*)(?:\.([A-Za-z]+))?)")


class DependsError(ValueError):
    """A `depends` expression that does not parse or names an unknown result."""


@dataclass(frozen=True)
class TaskFacts:
    """What `depends` may ask about one finished (or daemoned) dependency."""

    phase: str
    daemoned: bool = False
    any_succeeded: bool = False
    all_failed: bool = False


def _tokens(text: str) -> list[tuple[str, str, str | None]]:
    out, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise DependsError(f"cannot parse depends {text!r} at {text[pos:]!r}")
        pos = m.end()
        if m.group(1):
            out.append(("op", m.group(1), None))
        else:
            result = m.group(3)
            if result is not None and result not in RESULTS:
                raise DependsError(
                    f"depends {text!r}: unknown task result {result!r} (use one of {', '.join(RESULTS)})"
                )
            out.append(("task", m.group(2), result))
    return out


def parse_depends(text: str) -> Any:
    """Parse a depends string into a small tree of tuples."""
    toks = _tokens(text)
    pos = 0

    def peek() -> tuple[str, str, str | None] | None:
        return toks[pos] if pos < len(toks) else None

    def expect_op(op: str) -> None:
        nonlocal pos
        if peek() != ("op", op, None):
            raise DependsError(f"depends {text!r}: expected {op!r}")
        pos += 1

    def or_expr() -> Any:
        nonlocal pos
        left = and_expr()
        while peek() == ("op", "||", None):
            pos += 1
            left = ("or", left, and_expr())
        return left

    def and_expr() -> Any:
        nonlocal pos
        left = unary()
        while peek() == ("op", "&&", None):
            pos += 1
            left = ("and", left, unary())
        return left

    def unary() -> Any:
        nonlocal pos
        tok = peek()
        if tok is None:
            raise DependsError(f"depends {text!r} ends early")
        pos += 1
        if tok == ("op", "!", None):
            return ("not", unary())
        if tok == ("op", "(", None):
            inner = or_expr()
            expect_op(")")
            return inner
        if tok[0] == "task":
            return ("task", tok[1], tok[2])
        raise DependsError(f"depends {text!r}: unexpected {tok[1]!r}")

    tree = or_expr()
    if peek() is not None:
        raise DependsError(f"depends {text!r}: unexpected {peek()[1]!r}")
    return tree


def from_dependencies(names: list[str]) -> Any | None:
    """The tree a legacy `dependencies: [A, B]` list stands for (`A && B`)."""
    tree = None
    for name in names:
        leaf = ("task", str(name), None)
        tree = leaf if tree is None else ("and", tree, leaf)
    return tree


def tasks_in(tree: Any) -> set[str]:
    """Names of the tasks a tree refers to."""
    if tree is None:
        return set()
    if tree[0] == "task":
        return {tree[1]}
    return set().union(*(tasks_in(t) for t in tree[1:]))


def failure_handlers(tree: Any) -> set[str]:
    """Tasks whose failure this tree explicitly reacts to (`X.Failed`, `X.Errored`, `X.AllFailed`)."""
    if tree is None:
        return set()
    if tree[0] == "task":
        return {tree[1]} if tree[2] in ("Failed", "Errored", "AllFailed") else set()
    return set().union(*(failure_handlers(t) for t in tree[1:]))


def _result(facts: TaskFacts, result: str) -> bool:
    return {
        "Succeeded": facts.phase == "Succeeded",
        "Failed": facts.phase == "Failed",
        "Errored": facts.phase == "Error",
        "Skipped": facts.phase == "Skipped",
        "Omitted": facts.phase == "Omitted",
        "Daemoned": facts.daemoned and facts.phase != "Pending",
        "AnySucceeded": facts.any_succeeded,
        "AllFailed": facts.all_failed,
    }[result]


def evaluate(tree: Any, facts: dict[str, TaskFacts], continue_on: dict[str, dict]) -> bool:
    """Evaluate a tree; `continue_on` maps task name to its `continueOn` block (for bare names)."""
    kind = tree[0]
    if kind == "or":
        return evaluate(tree[1], facts, continue_on) or evaluate(tree[2], facts, continue_on)
    if kind == "and":
        return evaluate(tree[1], facts, continue_on) and evaluate(tree[2], facts, continue_on)
    if kind == "not":
        return not evaluate(tree[1], facts, continue_on)
    name, result = tree[1], tree[2]
    f = facts[name]
    if result is not None:
        return _result(f, result)
    ok = ["Succeeded", "Skipped", "Daemoned"]
    cont = continue_on.get(name) or {}
    if cont.get("error"):
        ok.append("Errored")
    if cont.get("failed"):
        ok.append("Failed")
    return any(_result(f, r) for r in ok)
