"""Argument parsing shared by the `ckptflow` commands (CLI and workflows): a user mistake is one line.

argparse prints a usage block before its error and reads a value that starts with "-" as an
option (`--grace -5m` becomes "expected one argument", which names no fix). Here the error is
one line naming the argument and pointing to --help, a negative value reaches the argument's
own check (which says what to write), and a step is a plain whole number 0 or more (`int()`
takes "-1", `str.isdigit` takes "²": neither is a step).
"""

from __future__ import annotations

import argparse
import re

_STEP = re.compile(r"[0-9]{1,18}")
_NEGATIVE = re.compile(r"-[0-9.]")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def step(text: str) -> int:
    """argparse type: a training step, a whole number 0 or more."""
    if not _STEP.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(
            f"bad step {text!r}: give a whole number 0 or more, e.g. 1200"
        )
    return int(text)


def join_negative_values(argv: list[str], options: set[str]) -> list[str]:
    """`--grace -5m` as `--grace=-5m`, for the value-taking `options`, so the value's own check
    rejects it with its fix (argparse alone would take "-5m" for an unknown option)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in options and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def parse(parser: argparse.ArgumentParser, argv: list[str] | None, options: set[str] = frozenset()):
    """The parsed arguments, or the exit status when argparse stopped (an error, --help)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return parser.parse_args(join_negative_values(args, set(options)))
    except SystemExit as exc:
        return int(exc.code or 0)
