"""The values and functions of Argo's expressions (expr.py): expr-lang's builtins the examples
use (builtin/builtin.go, builtin/lib.go in expr-lang/expr), the functions Argo adds
(util/expr/env/env.go in argoproj/argo-workflows: asInt, asFloat, jsonpath, toJson; the table
is expr_env.py) and Go's JSON encoding of a result (util/template/expression_template.go marshals it).

Values are Python's JSON types: int and float stand for Go's int and float64, None for nil.
Every string or list a function builds is bounded (`limit_size`); a regular expression runs with
a time limit (the `regex` module), and a jsonpath with nested quantifiers is refused, since
Python's `re` (unlike Go's RE2) can backtrack for ever.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import jsonpath as _jsonpath
import regex as _regex

__all__ = ["ExprError", "go_json", "equal", "limit_size", "BUILTINS", "PREDICATES", "jsonpath"]

MAX_STRING = 1 << 20  # characters in any string an expression builds or parses
MAX_ITEMS = 100_000  # items in any list or map an expression builds
MAX_INT = 1 << 63  # Go's int64: bigger results are an error, not a huge Python int
MAX_PATTERN = 1000  # characters of a regular expression
REGEX_TIMEOUT_S = 1.0  # one regular expression match


class ExprError(ValueError):
    """An expression that cannot be parsed, is not supported, or fails: one line."""


def type_name(value: Any) -> str:
    """Go's name for a value's type, for error messages."""
    if value is None:
        return "nil"
    names = {bool: "bool", int: "int", float: "float64", str: "string", list: "array"}
    return names.get(type(value), "map" if isinstance(value, Mapping) else type(value).__name__)


def limit_size(value: Any) -> Any:
    """`value`, or ExprError when a string or collection is past the bounds."""
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise ExprError(f"string longer than {MAX_STRING} characters")
    if isinstance(value, list | dict) and len(value) > MAX_ITEMS:
        raise ExprError(f"more than {MAX_ITEMS} items")
    return value


def limit_int(value: Any) -> Any:
    if isinstance(value, int) and not -MAX_INT <= value < MAX_INT:
        raise ExprError("integer overflow")
    return value


def need_bool(value: Any, op: str) -> bool:
    if not isinstance(value, bool):
        raise ExprError(f"invalid operation: {op} needs a bool, not {type_name(value)}")
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def need_number(value: Any, op: str) -> int | float:
    if not is_number(value):
        raise ExprError(f"invalid operation: {op} needs a number, not {type_name(value)}")
    return value


def need_int(value: Any, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExprError(f"invalid operation: {op} needs an integer, not {type_name(value)}")
    return value


def go_div(x: int, y: int) -> int:
    """Go's integer `/`: truncated toward zero (Python's `//` floors)."""
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


def go_mod(x: int, y: int) -> int:
    """Go's integer `%`: the sign of the dividend."""
    r = abs(x) % abs(y)
    return r if x >= 0 else -r


def need_str(value: Any, op: str) -> str:
    if not isinstance(value, str):
        raise ExprError(f"invalid operation: {op} needs a string, not {type_name(value)}")
    return value


def equal(a: Any, b: Any) -> bool:
    """expr-lang's `==`: numbers by value (1 == 1.0), everything else by type and value."""
    if is_number(a) and is_number(b):
        return a == b
    if type(a) is not type(b) and not (isinstance(a, Mapping) and isinstance(b, Mapping)):
        return False
    return a == b


_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[*+}](?:[^()\\]|\\.)*\)[*+{]")


def regex_search(pattern: Any, text: str) -> bool:
    """Whether `pattern` matches in `text`, with the `regex` module and a time limit: Go's RE2,
    which Argo uses, takes linear time, Python's `re` can backtrack for ever (`(a+)+$`)."""
    source = need_str(pattern, "matches")
    if len(source) > MAX_PATTERN:
        raise ExprError(f"regular expression longer than {MAX_PATTERN} characters")
    try:
        compiled = _regex.compile(source)
        return compiled.search(text, timeout=REGEX_TIMEOUT_S) is not None
    except _regex.error as exc:
        raise ExprError(f"invalid regular expression {source[:40]!r}: {exc}") from None
    except TimeoutError:
        raise ExprError(
            f"regular expression {source[:40]!r} took over {REGEX_TIMEOUT_S} s"
        ) from None


def string_op(op: str, a: Any, b: Any) -> bool:
    """`matches`, `contains`, `startsWith`, `endsWith` on two strings."""
    text = need_str(a, op)
    if op == "matches":
        return regex_search(b, text)
    other = need_str(b, op)
    if op == "contains":
        return other in text
    return text.startswith(other) if op == "startsWith" else text.endswith(other)


def _float_text(value: float) -> str:
    """Go's encoding/json float64: shortest digits, no `.0`, exponent past 1e21 or below 1e-6."""
    if math.isnan(value) or math.isinf(value):
        raise ExprError(f"json: unsupported value: {value}")
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    return re.sub(r"e([+-])0(\d)$", r"e\1\2", text)


def go_json(value: Any) -> str:
    """`json.Marshal` of a value as Go writes it: compact, map keys sorted, `<>&` escaped."""
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, list):
        return limit_size("[" + ",".join(go_json(v) for v in value) + "]")
    elif isinstance(value, Mapping):
        items = sorted((str(k), v) for k, v in value.items())
        return limit_size("{" + ",".join(f"{go_json(k)}:{go_json(v)}" for k, v in items) + "}")
    else:
        raise ExprError(f"json: unsupported type: {type_name(value)}")
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, code)
    return limit_size(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def go_string(value: Any) -> str:
    """Go's `fmt.Sprintf("%v", value)`: expr-lang's `string()`."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float_text(value) if abs(value) < 1e21 else f"{value:g}".replace("e+", "e+")
    if isinstance(value, list):
        return "[" + " ".join(go_string(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = sorted((str(k), v) for k, v in value.items())
        return "map[" + " ".join(f"{k}:{go_string(v)}" for k, v in items) + "]"
    return limit_size(str(value))


def from_json(text: Any) -> Any:
    """JSON as Go's `json.Unmarshal` into `any` reads it: every number a float64."""
    raw = need_str(text, "json")
    if len(raw) > MAX_STRING:
        raise ExprError(f"JSON longer than {MAX_STRING} characters")
    try:
        return json.loads(raw, parse_int=float)
    except (ValueError, RecursionError) as exc:
        raise ExprError(f"invalid JSON {raw[:40]!r}: {exc}") from None


def as_int(value: Any) -> int:
    """expr-lang's `int()` (Argo's `asInt`): floats truncate, strings parse as whole numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ExprError(f"invalid operation: int({type_name(value)})")
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?\d{1,19}", value):
            raise ExprError(f"invalid operation: int({value[:40]})")
        return limit_int(int(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise ExprError(f"invalid operation: int({value})")
    return limit_int(int(value))


def as_float(value: Any) -> float:
    """expr-lang's `float()` (Argo's `asFloat`)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ExprError(f"invalid operation: float({type_name(value)})")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise ExprError(f"invalid operation: float({str(value)[:40]})") from None


def jsonpath(text: Any, path: Any) -> Any:
    """Argo's `jsonpath(json, path)` (github.com/evilmonkeyinc/jsonpath): a singular path gives
    its value (an error when absent); a wildcard, filter or slice gives the list of matches."""
    data = from_json(text)
    where = need_str(path, "jsonpath")
    if len(where) > MAX_PATTERN or _NESTED_QUANTIFIER.search(where):  # `=~`, match(), search()
        raise ExprError(f"jsonpath {where[:40]!r} is too long or nests regex quantifiers")
    try:
        query = _jsonpath.compile(where)
        found = query.findall(data)
    except _jsonpath.JSONPathError as exc:
        raise ExprError(f"jsonpath {str(path)[:60]!r}: {exc}") from None
    if not query.singular_query():
        return limit_size(found)
    if not found:
        raise ExprError(f"jsonpath {path!r}: not found")
    return found[0]


def _length(value: Any) -> int:
    if not isinstance(value, str | list | Mapping):
        raise ExprError(f"invalid argument for len (type {type_name(value)})")
    return len(value)


def _minmax(pick: Callable, args: tuple) -> Any:
    values = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
    if not values:
        raise ExprError("not enough arguments")
    return pick(need_number(v, "max/min") for v in values)


def _split(text: Any, sep: Any, n: Any = -1) -> list[str]:
    s, d = need_str(text, "split"), need_str(sep, "split")
    parts = s.split(d, n - 1 if n > 0 else -1) if d else list(s)
    return limit_size(parts)


def _join(items: Any, sep: Any = "") -> str:
    if not isinstance(items, list):
        raise ExprError(f"join needs an array, not {type_name(items)}")
    return limit_size(need_str(sep, "join").join(need_str(x, "join") for x in items))


def _b64dec(text: Any) -> str:
    try:
        return base64.b64decode(need_str(text, "fromBase64"), validate=True).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ExprError(f"fromBase64: {exc}") from None


def _repeat(text: Any, n: Any) -> str:
    count = need_int(n, "repeat")
    if count < 0 or len(need_str(text, "repeat")) * count > MAX_STRING:
        raise ExprError(f"repeat: count {count} out of bounds")
    return text * count


# expr-lang builtins taking plain (evaluated) arguments
BUILTINS: dict[str, Callable[..., Any]] = {
    "len": _length,
    "abs": lambda x: abs(need_number(x, "abs")),
    "int": as_int,
    "float": as_float,
    "string": go_string,
    "trim": lambda s, c=None: need_str(s, "trim").strip(c),
    "trimPrefix": lambda s, p: need_str(s, "trimPrefix").removeprefix(need_str(p, "trimPrefix")),
    "trimSuffix": lambda s, p: need_str(s, "trimSuffix").removesuffix(need_str(p, "trimSuffix")),
    "upper": lambda s: need_str(s, "upper").upper(),
    "lower": lambda s: need_str(s, "lower").lower(),
    "split": _split,
    "replace": lambda s, a, b: limit_size(
        need_str(s, "replace").replace(a, need_str(b, "replace"))
    ),
    "repeat": _repeat,
    "indexOf": lambda s, sub: need_str(s, "indexOf").find(need_str(sub, "indexOf")),
    "hasPrefix": lambda s, p: need_str(s, "hasPrefix").startswith(need_str(p, "hasPrefix")),
    "hasSuffix": lambda s, p: need_str(s, "hasSuffix").endswith(need_str(p, "hasSuffix")),
    "join": _join,
    "keys": lambda m: list(m) if isinstance(m, Mapping) else _type_error("keys", m),
    "values": lambda m: list(m.values()) if isinstance(m, Mapping) else _type_error("values", m),
    "toJSON": lambda v: json.dumps(json.loads(go_json(v)), indent=2, sort_keys=True),
    "fromJSON": from_json,
    "toBase64": lambda s: base64.b64encode(need_str(s, "toBase64").encode()).decode(),
    "fromBase64": _b64dec,
    "max": lambda *a: _minmax(max, a),
    "min": lambda *a: _minmax(min, a),
    "ceil": lambda x: float(math.ceil(need_number(x, "ceil"))),
    "floor": lambda x: float(math.floor(need_number(x, "floor"))),
    "round": lambda x: float(math.floor(need_number(x, "round") + 0.5)),
    "first": lambda a: (a[0] if a else None) if isinstance(a, list) else _type_error("first", a),
    "last": lambda a: (a[-1] if a else None) if isinstance(a, list) else _type_error("last", a),
    "reverse": lambda a: a[::-1] if isinstance(a, list) else _type_error("reverse", a),
    "type": lambda v: {"nil": "nil", "float64": "float", "array": "array"}.get(
        type_name(v), type_name(v)
    ),
}


def _type_error(name: str, value: Any) -> Any:
    raise ExprError(f"invalid argument for {name} (type {type_name(value)})")


PREDICATES = {"all", "none", "any", "one", "filter", "map", "count", "find", "findIndex"}
PREDICATES |= {"findLast", "findLastIndex", "sum"}


def call_builtin(name: str, args: list[tuple], run: Callable[..., Any], ptr: Any) -> Any:
    """Evaluate an expr-lang builtin; predicates run their closure (`("closure", body)`) on each
    item of their first argument with `#` bound to it."""
    if name not in PREDICATES:
        return limit_size(BUILTINS[name](*[run(a) for a in args]))
    items = run(args[0])
    if not isinstance(items, list):
        raise ExprError(f"{name}: cannot iterate over {type_name(items)}")
    if name == "sum" and len(args) == 1:
        return sum(need_number(x, "sum") for x in items)
    if len(args) != 2 or args[1][0] != "closure":
        raise ExprError(f"{name} takes an array and a predicate")
    body = args[1][1]

    def test(item: Any) -> bool:
        return need_bool(run(body, item), name)

    if name == "map":
        return limit_size([run(body, x) for x in items])
    if name == "sum":
        return sum(need_number(run(body, x), "sum") for x in items)
    if name == "filter":
        return [x for x in items if test(x)]
    if name == "count":
        return sum(1 for x in items if test(x))
    if name in ("all", "any", "none"):
        hits = (test(x) for x in items)
        return all(hits) if name == "all" else any(hits) if name == "any" else not any(hits)
    if name == "one":
        return sum(1 for x in items if test(x)) == 1
    order = list(range(len(items)))
    for i in reversed(order) if name.startswith("findLast") else order:
        if test(items[i]):
            return i if name.endswith("Index") else items[i]
    return -1 if name.endswith("Index") else None
