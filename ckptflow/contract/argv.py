"""One rule between a step's arguments dataclass and its command line, in both directions.

`to_argv(args)` is what a workflow builder renders into a container's `args`; `parse(cls, argv)`
is what the step runs on them. Both read the same dataclass fields, so a flag can be neither
misspelt nor given another default on one side:

- a field `max_steps` is the flag `--max-steps`; its one-line doc (`arg(default, doc)`) is the
  help text, and `choices` / `at_least` bound what parse accepts;
- `to_argv` writes the required fields and those that differ from their default: the step fills
  in the rest from the same dataclass, so a default lives in one place;
- a bool field is `--flag` / `--no-flag`; a `T | None` field defaults to None and is left out
  when None; a `tuple[T, ...]` field defaults to () and repeats its flag once per item;
- a value that starts with "-" is written `--flag=value`, so argparse never takes it for a flag
  (the one value argparse cannot take at all, "--", is refused).

`parse(cls, to_argv(x)) == x` for every value of every field (tests/contract/test_argv.py).
"""

from __future__ import annotations

import argparse
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")
SCALARS = (str, int, float, bool)


def arg(default: Any = MISSING, doc: str = "", *, choices=(), at_least=None) -> Any:
    """A step argument: its default (none: required), one-line doc, allowed values or minimum."""
    meta = {"doc": doc, "choices": tuple(choices), "at_least": at_least}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Spec:
    """What one field means on the command line (derived from the field, checked once)."""

    name: str  # the field name
    flag: str  # --the-field-name
    base: type  # str | int | float | bool: the type of one value
    optional: bool  # `T | None`: None is the default and is never written
    many: bool  # `tuple[T, ...]`: () is the default, one flag per item
    default: Any  # MISSING when the argument is required
    doc: str  # one line
    choices: tuple  # allowed values (empty: any)
    at_least: float | None  # smallest allowed value (None: unbounded)

    @property
    def required(self) -> bool:
        return self.default is MISSING


def _shape(tp: Any) -> tuple[type, bool, bool]:
    """(scalar type, optional, many) of an annotation, or TypeError for what we do not render."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1 and inner[0] in SCALARS and inner[0] is not bool:
            return inner[0], True, False
    elif origin is tuple:
        inner = typing.get_args(tp)
        if len(inner) == 2 and inner[1] is Ellipsis and inner[0] in SCALARS[:3]:
            return inner[0], False, True
    elif tp in SCALARS:
        return tp, False, False
    raise TypeError(f"{tp!r}: a step argument is str, int, float, bool, T | None or tuple[T, ...]")


def _check(cls: type, s: Spec) -> None:
    """Reject a field whose default the command line could not express (fails at import time)."""
    where = f"{cls.__name__}.{s.name}"
    if not s.doc or "\n" in s.doc:
        raise TypeError(f"{where}: give a one-line doc, arg(default, 'what it means')")
    if s.required and (s.base is bool or s.optional or s.many):
        raise TypeError(f"{where}: a bool, optional or tuple argument needs a default")
    if s.optional and s.default is not None:
        raise TypeError(f"{where}: an optional argument defaults to None")
    if s.many and s.default != ():
        raise TypeError(f"{where}: a tuple argument defaults to ()")
    if s.required or s.optional or s.many:
        return
    if s.choices and s.default not in s.choices:
        raise TypeError(f"{where}: default {s.default!r} is not one of {s.choices}")
    if s.at_least is not None and s.default < s.at_least:
        raise TypeError(f"{where}: default {s.default!r} is below {s.at_least}")


@functools.cache
def specs(cls: type) -> tuple[Spec, ...]:
    """The command-line view of each field of the arguments dataclass `cls`: its own fields in
    order, then those it inherits (a shared group such as the training loop's)."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a step arguments dataclass")
    hints = typing.get_type_hints(cls)
    own = cls.__dict__.get("__annotations__", {})
    out = []
    for f in sorted(fields(cls), key=lambda f: f.name not in own):
        base, optional, many = _shape(hints[f.name])
        meta = f.metadata
        s = Spec(
            name=f.name,
            flag="--" + f.name.replace("_", "-"),
            base=base,
            optional=optional,
            many=many,
            default=f.default,
            doc=meta.get("doc", ""),
            choices=meta.get("choices", ()),
            at_least=meta.get("at_least"),
        )
        _check(cls, s)
        out.append(s)
    return tuple(out)


# -- rendering -------------------------------------------------------------------------------------
def format_value(value: Any, s: Spec) -> str:
    """One value as text that parses back to an equal value (floats: shortest exact repr)."""
    if isinstance(value, bool):
        ok = s.base is bool
    else:
        ok = isinstance(value, int | float) if s.base is float else isinstance(value, s.base)
    if not ok:
        raise TypeError(f"{s.flag}: {value!r} is not a {s.base.__name__}")
    if s.base is float:
        text = repr(float(value))
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def _pair(flag: str, text: str) -> list[str]:
    if text == "--":  # argparse drops a "--" even after "=": no command line can carry it
        raise ValueError(f"{flag}: the value '--' cannot be passed on a command line")
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def to_argv(args: Any, **exprs: str) -> list[str]:
    """The command line of `args`: required fields, and those that differ from their default.

    `exprs` are fields that Argo fills in when the step runs (`run_root="{{inputs.parameters.
    run_root}}"`): written verbatim, whatever the field's type, in the field's place.
    """
    cls = type(args)
    known = {s.name: s for s in specs(cls)}
    unknown = sorted(set(exprs) - set(known))
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
    out: list[str] = []
    for s in known.values():
        if s.name in exprs:
            if s.base is bool or s.many:
                raise TypeError(f"{s.flag}: a bool or tuple argument cannot be an expression")
            out += _pair(s.flag, exprs[s.name])
            continue
        value = getattr(args, s.name)
        if s.many:
            if not isinstance(value, tuple):
                raise TypeError(f"{s.flag}: {value!r} is not a tuple")
            for item in value:
                out += _pair(s.flag, format_value(item, s))
        elif not s.required and value == s.default:
            continue
        elif s.base is bool:
            format_value(value, s)
            out.append(s.flag if value else "--no-" + s.flag[2:])
        else:
            out += _pair(s.flag, format_value(value, s))
    return out


# -- parsing ---------------------------------------------------------------------------------------
def _converter(s: Spec) -> Callable[[str], Any] | None:
    """argparse `type=` for one field: the scalar type and its minimum (None: plain str)."""
    if s.base is str:
        return None

    def convert(text: str):
        value = s.base(text)
        if s.at_least is not None and value < s.at_least:
            raise argparse.ArgumentTypeError(f"must be at least {s.at_least}, got {text}")
        return value

    convert.__name__ = s.base.__name__  # argparse says "invalid int value: 'x'"
    return convert


def _help(s: Spec) -> str:
    doc = s.doc.replace("%", "%%")
    if s.required or s.base is bool or s.default in ("", None, ()):
        return doc  # BooleanOptionalAction adds the default itself
    return f"{doc} (default: %(default)s)"


def parser(cls: type, *, prog: str | None = None, description: str | None = None):
    """argparse for `cls`: one --flag per field, help from its doc; required fields required."""
    p = argparse.ArgumentParser(
        prog=prog or f"python -m ckptflow.steps.{getattr(cls, 'STEP', cls.__name__)}",
        description=description or (cls.__doc__ or "").strip().split("\n")[0],
    )
    for s in specs(cls):
        kw: dict[str, Any] = {"dest": s.name, "help": _help(s)}
        if s.base is bool:
            kw.update(action=argparse.BooleanOptionalAction, default=s.default)
        elif s.many:
            kw.update(action="append", type=_converter(s), default=None)
        else:
            kw.update(type=_converter(s), choices=s.choices or None)
            if s.required:
                kw["required"] = True
            else:
                kw["default"] = s.default
        p.add_argument(s.flag, **kw)
    return p


def parse(
    cls: type[T],
    argv: list[str] | None = None,
    *,
    prog: str | None = None,
    description: str | None = None,
    check: Callable[[argparse.ArgumentParser, T], None] | None = None,
) -> T:
    """`cls` from a command line (None: sys.argv); `check(parser, args)` may parser.error()."""
    p = parser(cls, prog=prog, description=description)
    values = vars(p.parse_args(argv))
    for s in specs(cls):
        if s.many:
            values[s.name] = tuple(values[s.name] or ())
    args = cls(**values)
    if check is not None:
        check(p, args)
    return args
