"""The `sprig.*` functions of Argo's expressions: a subset of Masterminds/sprig v3's
GenericFuncMap (util/expr/env/env.go in argoproj/argo-workflows puts it under `sprig`): the
ones Argo's examples use and the common string, math, list and encoding ones, with sprig's
argument order (`sprig.replace(old, new, s)`) and its lenient conversions (cast.ToInt64: a
string that is not a number is 0). A name not here is refused before the run (expr.check).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from ckptflow.workflows.runner.expr_funcs import (
    MAX_STRING,
    ExprError,
    go_div,
    go_json,
    go_mod,
    go_string,
    limit_int,
    limit_size,
    need_str,
    regex_search,
)

__all__ = ["SPRIG", "go_date"]


def to_int(value: Any) -> int:
    """cast.ToInt64 as sprig calls it (errors ignored: a bad string is 0)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return limit_int(value)
    if isinstance(value, float):
        return limit_int(int(value)) if math.isfinite(value) else 0
    if isinstance(value, str):
        text = re.sub(r"\.0+$", "", value.strip())
        try:
            return limit_int(int(text, 0))
        except ValueError:
            return 0
    return 0


def to_float(value: Any) -> float:
    """cast.ToFloat64 as sprig calls it (a bad string is 0)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return 0.0
    return 0.0


def _div(a: Any, b: Any) -> int:
    x, y = to_int(a), to_int(b)
    if y == 0:
        raise ExprError("sprig.div: integer divide by zero")
    return go_div(x, y)


def _mod(a: Any, b: Any) -> int:
    x, y = to_int(a), to_int(b)
    if y == 0:
        raise ExprError("sprig.mod: integer divide by zero")
    return go_mod(x, y)


def _product(first: Any, *rest: Any) -> int:
    out = to_int(first)
    for v in rest:
        out = limit_int(out * to_int(v))
    return out


def _b64dec(text: Any) -> str:
    try:  # sprig returns the error's text as the value
        return base64.b64decode(need_str(text, "b64dec"), validate=True).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        return f"illegal base64 data: {exc}"


def _repeat(count: Any, text: Any) -> str:
    n = to_int(count)
    if n < 0 or n * len(need_str(text, "repeat")) > MAX_STRING:
        raise ExprError(f"sprig.repeat: count {n} out of bounds")
    return text * n


def _substr(start: Any, end: Any, text: Any) -> str:
    s, a, b = need_str(text, "substr"), to_int(start), to_int(end)
    if a < 0:
        return s[:b]
    if b < 0 or b > len(s):
        return s[a:]
    return s[a:b]


def _trunc(count: Any, text: Any) -> str:
    n, s = to_int(count), need_str(text, "trunc")
    if n < 0:
        return s[max(0, len(s) + n) :]
    return s[:n]


def _empty(value: Any) -> bool:
    """sprig's `empty`: nil, false, 0, "" and empty collections."""
    return value is None or value is False or value == 0 or value in ("", [], {})


def _default(default: Any, *given: Any) -> Any:
    return default if not given or _empty(given[0]) else given[0]


def _json_or_empty(value: Any) -> str:
    try:
        return go_json(value)
    except ExprError:
        return ""


def _from_json(text: Any) -> Any:
    import json

    try:
        return json.loads(need_str(text, "fromJson"), parse_int=float)
    except (ValueError, RecursionError):
        return {}


def _list_arg(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise ExprError(f"sprig.{name}: needs a list, not {type(value).__name__}")
    return value


# Go's reference-time layout elements (time/format.go), longest first
_LAYOUT = [
    ("January", "%B"), ("Monday", "%A"), ("2006", "%Y"), ("-0700", "%z"), ("Jan", "%b"),
    ("Mon", "%a"), ("MST", "%Z"), ("01", "%m"), ("02", "%d"), ("15", "%H"), ("03", "%I"),
    ("04", "%M"), ("05", "%S"), ("06", "%y"), ("PM", "%p"), ("_2", "{_2}"), ("1", "{1}"),
    ("2", "{2}"), ("3", "{3}"), ("4", "{4}"), ("5", "{5}"),
]  # fmt: skip


def go_date(layout: str, when: time.struct_time) -> str:
    """`time.Format(layout)` for the common elements of Go's layouts."""
    out, i = [], 0
    while i < len(layout):
        for token, code in _LAYOUT:
            if layout.startswith(token, i):
                if code.startswith("{"):
                    num = {"{_2}": when.tm_mday, "{1}": when.tm_mon, "{2}": when.tm_mday}
                    num |= {"{3}": (when.tm_hour % 12) or 12, "{4}": when.tm_min}
                    num |= {"{5}": when.tm_sec}
                    text = f"{num[code]:>2}" if code == "{_2}" else str(num[code])
                else:
                    text = time.strftime(code, when)
                out.append(text)
                i += len(token)
                break
        else:
            out.append(layout[i])
            i += 1
    return "".join(out)


def _date(layout: Any, date: Any) -> str:
    """sprig's `date`: ints are Unix seconds; anything else (a string too) is now, as sprig's
    dateInZone does; the zone is the runner's local one, as sprig's "Local"."""
    seconds = date if isinstance(date, int) and not isinstance(date, bool) else time.time()
    try:
        return go_date(need_str(layout, "date")[:200], time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        raise ExprError(f"sprig.date: {date!r} is out of range") from None


def _hash(algo: str) -> Callable[[Any], str]:
    return lambda s: hashlib.new(algo, need_str(s, algo).encode()).hexdigest()


SPRIG: dict[str, Callable[..., Any]] = {
    # math (sprig/numeric.go): int64 results
    "add": lambda *a: limit_int(sum(to_int(v) for v in a)),
    "add1": lambda a: limit_int(to_int(a) + 1),
    "sub": lambda a, b: limit_int(to_int(a) - to_int(b)),
    "mul": _product,
    "div": _div,
    "mod": _mod,
    "max": lambda a, *r: max(to_int(v) for v in (a, *r)),
    "min": lambda a, *r: min(to_int(v) for v in (a, *r)),
    "biggest": lambda a, *r: max(to_int(v) for v in (a, *r)),
    "floor": lambda a: float(math.floor(to_float(a))),
    "ceil": lambda a: float(math.ceil(to_float(a))),
    "round": lambda a, p=0: float(round(to_float(a), to_int(p))),
    # conversions
    "atoi": lambda s: to_int(s) if re.fullmatch(r"[+-]?\d+", str(s)) else 0,
    "int": to_int,
    "int64": to_int,
    "float64": to_float,
    "toString": go_string,
    "toJson": _json_or_empty,
    "fromJson": _from_json,
    "b64enc": lambda s: base64.b64encode(need_str(s, "b64enc").encode()).decode(),
    "b64dec": _b64dec,
    "sha1sum": _hash("sha1"),
    "sha256sum": _hash("sha256"),
    # strings (sprig/strings.go): the string is the last argument
    "trim": lambda s: need_str(s, "trim").strip(),
    "trimAll": lambda c, s: need_str(s, "trimAll").strip(need_str(c, "trimAll")),
    "trimPrefix": lambda p, s: need_str(s, "trimPrefix").removeprefix(need_str(p, "trimPrefix")),
    "trimSuffix": lambda p, s: need_str(s, "trimSuffix").removesuffix(need_str(p, "trimSuffix")),
    "upper": lambda s: need_str(s, "upper").upper(),
    "lower": lambda s: need_str(s, "lower").lower(),
    "title": lambda s: need_str(s, "title").title(),
    "repeat": _repeat,
    "substr": _substr,
    "trunc": _trunc,
    "nospace": lambda s: re.sub(r"\s", "", need_str(s, "nospace")),
    "contains": lambda sub, s: need_str(sub, "contains") in need_str(s, "contains"),
    "hasPrefix": lambda p, s: need_str(s, "hasPrefix").startswith(need_str(p, "hasPrefix")),
    "hasSuffix": lambda p, s: need_str(s, "hasSuffix").endswith(need_str(p, "hasSuffix")),
    "quote": lambda *a: " ".join(go_json(go_string(v)) for v in a if v is not None),
    "squote": lambda *a: " ".join(f"'{go_string(v)}'" for v in a if v is not None),
    "replace": lambda old, new, s: limit_size(
        need_str(s, "replace").replace(need_str(old, "replace"), need_str(new, "replace"))
    ),
    "cat": lambda *a: limit_size(" ".join(go_string(v) for v in a if v is not None)),
    "regexMatch": lambda r, s: regex_search(r, need_str(s, "regexMatch")),
    # lists and defaults (sprig/list.go, sprig/defaults.go)
    "splitList": lambda sep, s: limit_size(need_str(s, "splitList").split(need_str(sep, "sep"))),
    "join": lambda sep, v: limit_size(
        need_str(sep, "join").join(go_string(x) for x in _list_arg(v, "join"))
    ),
    "list": lambda *a: list(a),
    "first": lambda v: (_list_arg(v, "first") or [None])[0],
    "last": lambda v: (_list_arg(v, "last") or [None])[-1],
    "has": lambda needle, v: needle in _list_arg(v, "has"),
    "default": _default,
    "empty": _empty,
    "coalesce": lambda *a: next((v for v in a if not _empty(v)), None),
    "ternary": lambda yes, no, cond: yes if cond is True else no,
    "date": _date,
    "keys": lambda *m: [k for d in m if isinstance(d, Mapping) for k in d],
}
