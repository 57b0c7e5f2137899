"""`python -m ckptflow.contract.docs [--check]`: docs/contracts.md's step tables, from the dataclasses.

The part of docs/contracts.md between the BEGIN and END markers is written from
`ckptflow.contract.STEP_ARGS` (one summary row per step, then one table of flags per step), so
it cannot drift from what the steps parse and the builders render. `--check` exits 1 when the
file differs (tests/contract/test_docs.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckptflow.contract.argv import Spec, format_value, specs
from ckptflow.contract.stepargs import STEP_ARGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
BEGIN = "<!-- BEGIN step arguments: written by `python -m ckptflow.contract.docs`; edit there -->"
END = "<!-- END step arguments -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(items) -> str:
    return ", ".join(f"`{x}`" for x in items)


def _kind(s: Spec) -> str:
    if s.choices:
        return _cell(" | ".join(s.choices))
    name = s.base.__name__
    if s.at_least is not None:
        name += f" ≥ {s.at_least}"
    if s.optional:
        name += " or none"
    return f"list of {name}" if s.many else name


def _default(s: Spec) -> str:
    if s.required:
        return "required"
    if s.base is bool:
        return "yes" if s.default else "no"
    if s.optional or s.many:
        return "none"
    return f"`{_cell(format_value(s.default, s))}`" if s.default != "" else '`""`'


def _flag(s: Spec) -> str:
    return f"`{s.flag}` / `--no-{s.flag[2:]}`" if s.base is bool else f"`{s.flag}`"


def module(cls: type) -> str:
    return f"ckptflow.steps.{cls.STEP}"


def summary() -> list[str]:
    """One row per step: how it runs, its required flags, its output files."""
    rows = [
        "| step | runs as | required arguments | outputs (files in --output-dir) |",
        "| --- | --- | --- | --- |",
    ]
    for cls in STEP_ARGS:
        required = _code(s.flag for s in specs(cls) if s.required)
        rows.append(f"| `{module(cls)}` | {cls.RUNS_AS} | {required} | {_code(cls.OUTPUTS)} |")
    return rows


def table(cls: type) -> list[str]:
    """One step's flags: type (choices, minimum), default, and the field's doc."""
    first = (cls.__doc__ or "").strip().split("\n")[0]
    rows = [
        f"### `{module(cls)}` (`{cls.__name__}`)",
        "",
        first,
        "",
        "| flag | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for s in specs(cls):
        rows.append(f"| {_flag(s)} | {_kind(s)} | {_default(s)} | {_cell(s.doc)} |")
    return rows


def render() -> str:
    """The generated section, markers included."""
    lines = [BEGIN, "", *summary()]
    for cls in STEP_ARGS:
        lines += ["", *table(cls)]
    return "\n".join([*lines, "", END])


def updated(text: str) -> str:
    """`text` (docs/contracts.md) with its generated section replaced by `render()`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC}: the markers {BEGIN!r} ... {END!r} are missing")
    return text[:start] + render() + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    """Write the section into docs/contracts.md, or with --check say whether it is current."""
    ap = argparse.ArgumentParser(prog="python -m ckptflow.contract.docs", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    ap.add_argument("--path", type=Path, default=DOC, help="the file (default: %(default)s)")
    args = ap.parse_args(argv)
    text = args.path.read_text()
    try:
        new = updated(text)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        print(f"{args.path} is out of date: run python -m ckptflow.contract.docs", file=sys.stderr)
        return 1
    args.path.write_text(new)
    print(f"wrote {args.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
