"""Argo's expression language: the subset of expr-lang (github.com/expr-lang/expr) the runner
evaluates for `{{=...}}` tags, `valueFrom.expression`, `fromExpression` and retryStrategy
`expression`, with the functions Argo adds (util/expr/env/env.go: asInt, asFloat, jsonpath,
toJson, sprig.*; expr_funcs.py).

No library on PyPI ports expr-lang (the `expr-lang` name there is an empty placeholder), so
this is a small interpreter over expr_parse.py's tree, with expr-lang's typing (int and float64,
`/` always a float, `==` by value across numbers, `&&` only on booleans). Everything is bounded,
since a manifest may be hostile: the text's length and nesting (expr_parse.py), the steps
evaluated, and the size of every string or list built. `check` parses without evaluating, so a
manifest with an unsupported construct is refused before anything runs (expr_check.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptflow.workflows.runner import expr_funcs as fn
from ckptflow.workflows.runner.expr_env import ENV_FUNCS
from ckptflow.workflows.runner.expr_funcs import ExprError, equal, go_json, limit_size
from ckptflow.workflows.runner.expr_parse import MAX_DEPTH, MAX_LEN, check_tree, parse

__all__ = [
    "ExprError",
    "ExprMissing",
    "check",
    "evaluate",
    "expand",
    "names",
    "go_json",
    "MAX_LEN",
    "MAX_DEPTH",
]

MAX_STEPS = 200_000  # nodes evaluated, closures included: `map(1..9999, map(1..9999, #))` stops


class ExprMissing(ExprError):
    """A name the expression uses is not (yet) in scope: `{{=...}}` is left for a later stage."""


def names(text: str) -> set[str]:
    """The names from the env an expression uses (`item`, `inputs`...); an empty set when it
    does not parse (`check` says why)."""
    try:
        tree = parse(text)
    except ExprError:
        return set()
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for part in node:
                walk(part)
        elif isinstance(node, tuple) and node:
            if node[0] == "name":
                found.add(node[1])
            for part in node[1:]:
                walk(part)

    walk(tree)
    return found


def check(text: str) -> None:
    """Raise ExprError (one line) if `text` does not parse or calls a function the runner lacks:
    what the spec validator runs on every expression before anything runs."""
    check_tree(parse(text))


class _Eval:
    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env, self.steps = env, 0

    def run(self, node: tuple, ptr: Any = None) -> Any:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ExprError(f"expression takes more than {MAX_STEPS} steps")
        kind = node[0]
        if kind == "val":
            return node[1]
        if kind == "ptr":
            return ptr
        if kind == "name":
            if node[1] in self.env:
                return self.env[node[1]]
            if node[1] in ENV_FUNCS:
                return ENV_FUNCS[node[1]]
            raise ExprMissing(f"unknown name {node[1]}")
        if kind == "list":
            return limit_size([self.run(n, ptr) for n in node[1]])
        if kind == "map":
            return {self.key(k, ptr): self.run(v, ptr) for k, v in node[1]}
        if kind == "member":
            return self.member(self.run(node[1], ptr), self.run(node[2], ptr), node[3])
        if kind == "slice":
            return self.slice(node, ptr)
        if kind == "not":
            return not fn.need_bool(self.run(node[1], ptr), "!")
        if kind in ("neg-", "neg+"):
            value = fn.need_number(self.run(node[1], ptr), kind[-1])
            return -value if kind == "neg-" else value
        if kind == "cond":
            cond = fn.need_bool(self.run(node[1], ptr), "?:")
            return self.run(node[2] if cond else node[3], ptr)
        if kind == "bin":
            return self.binary(node, ptr)
        if kind == "builtin":
            return fn.call_builtin(node[1], node[2], lambda n, p=ptr: self.run(n, p), ptr)
        if kind == "call":
            target = self.run(node[1], ptr)
            if not callable(target):
                raise ExprError(f"{fn.type_name(target)} is not a function")
            return limit_size(target(*[self.run(a, ptr) for a in node[2]]))
        raise ExprError(f"cannot evaluate {kind}")

    def key(self, node: tuple, ptr: Any) -> Any:
        key = self.run(node, ptr)
        if not isinstance(key, str | int | float | bool):
            raise ExprError(f"a map key cannot be {fn.type_name(key)}")
        return key

    def member(self, obj: Any, key: Any, optional: bool) -> Any:
        if obj is None:
            if optional:
                return None
            raise ExprError(f"cannot fetch {key} from nil")
        if isinstance(obj, Mapping):
            return obj.get(key) if isinstance(key, str | int | float | bool) else None
        if isinstance(obj, list | str) and isinstance(key, int) and not isinstance(key, bool):
            index = key + len(obj) if key < 0 else key
            if not 0 <= index < len(obj):
                raise ExprError(f"index out of range: {key} (array length is {len(obj)})")
            return obj[index]
        raise ExprError(f"cannot fetch {key!r} from {fn.type_name(obj)}")

    def slice(self, node: tuple, ptr: Any) -> Any:
        obj = self.run(node[1], ptr)
        lo = 0 if node[2] is None else self.run(node[2], ptr)
        hi = None if node[3] is None else self.run(node[3], ptr)
        if not isinstance(obj, list | str):
            raise ExprError(f"cannot slice {fn.type_name(obj)}")
        for bound in (lo, hi):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
                raise ExprError(f"a slice bound must be an integer, not {fn.type_name(bound)}")
        return obj[lo:hi]

    def binary(self, node: tuple, ptr: Any) -> Any:
        op, left = node[1], self.run(node[2], ptr)
        if op in ("&&", "and"):
            return fn.need_bool(left, op) and fn.need_bool(self.run(node[3], ptr), op)
        if op in ("||", "or"):
            return fn.need_bool(left, op) or fn.need_bool(self.run(node[3], ptr), op)
        if op == "??":
            return left if left is not None else self.run(node[3], ptr)
        return _binary(op, left, self.run(node[3], ptr))


def _binary(op: str, a: Any, b: Any) -> Any:
    """One binary operator on evaluated operands, with expr-lang's typing (runtime errors
    where expr-lang's checker refuses: `1 + "a"`, `"a" < 1`)."""
    if op == "==":
        return equal(a, b)
    if op == "!=":
        return not equal(a, b)
    if op == "in":
        if isinstance(b, Mapping):
            return a in b
        if isinstance(b, list):
            return any(equal(a, x) for x in b)
        raise ExprError(f"invalid operation: in {fn.type_name(b)}")
    if op in ("matches", "contains", "startsWith", "endsWith"):
        return fn.string_op(op, a, b)
    if op == "..":
        lo, hi = fn.need_int(a, op), fn.need_int(b, op)
        if hi - lo >= fn.MAX_ITEMS:
            raise ExprError(f"range {lo}..{hi} has more than {fn.MAX_ITEMS} items")
        return list(range(lo, hi + 1))
    if op in ("<", ">", "<=", ">="):
        if not (isinstance(a, str) and isinstance(b, str)):
            a, b = fn.need_number(a, op), fn.need_number(b, op)
        return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    if op == "+" and isinstance(a, str) and isinstance(b, str):
        return limit_size(a + b)
    if op == "+" and isinstance(a, list) and isinstance(b, list):
        return limit_size(a + b)
    x, y = fn.need_number(a, op), fn.need_number(b, op)
    if op in ("+", "-", "*"):
        result = x + y if op == "+" else x - y if op == "-" else x * y
        return fn.limit_int(result)
    if op == "/":
        if y == 0:
            raise ExprError("division by zero")
        return x / y
    if op == "%":
        if isinstance(x, float) or isinstance(y, float):
            raise ExprError("invalid operation: % needs integers")
        if y == 0:
            raise ExprError("integer divide by zero")
        return fn.go_mod(x, y)
    try:
        return float(x) ** float(y)
    except (OverflowError, ZeroDivisionError) as exc:
        raise ExprError(f"{op}: result out of range ({exc})") from None


def expand(values: Mapping[str, Any]) -> dict[str, Any]:
    """A flat `{"a.b.c": v}` map as the nested env Argo gives expressions
    (util/expand/expand.go: a key that is the prefix of another is dropped)."""
    keys = sorted(values)
    out: dict[str, Any] = {}
    for i, key in enumerate(keys):
        if i + 1 < len(keys) and keys[i + 1].startswith(key + "."):
            continue
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        node[parts[-1]] = values[key]
    return out


def evaluate(text: str, env: Mapping[str, Any]) -> Any:
    """The value of one expr-lang expression with `env` (nested dicts of the names in scope) and
    Argo's functions; ExprMissing for a name not in scope, ExprError for anything else wrong."""
    tree = parse(text)
    check_tree(tree)
    try:
        return _Eval(env).run(tree)
    except RecursionError:
        raise ExprError("expression nested too deeply") from None
    except ExprError as exc:  # a library's message may span lines: the user gets one
        raise type(exc)(" ".join(str(exc).split())[:300]) from None
    except (TypeError, ValueError, ArithmeticError, LookupError) as exc:  # e.g. sprig.add1()
        raise ExprError(" ".join(f"invalid call: {exc}".split())[:300]) from None
