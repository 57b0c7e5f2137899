"""Evaluate Argo `when` conditions: the govaluate syntax Argo uses, after `{{...}}` substitution.

Argo turns every bare word into a string before evaluating (so `heads == heads` is true without
quotes); numbers compare numerically, `=~`/`!~` match regular expressions, and `&&`, `||`, `!`,
parentheses, `in (a, b)` and `cond ? a : b` work as in govaluate.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["WhenError", "evaluate_when"]


class WhenError(ValueError):
    """A `when` expression that cannot be parsed or does not give a boolean."""


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>\d+(?:\.\d+)?(?![\w.]))
    | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<op>==|!=|>=|<=|=~|!~|&&|\|\||\?\?|[-+*/%<>!(),?:])
    | (?P<word>[A-Za-z0-9_.][\w.\-]*)
    )""",
    re.VERBOSE,
)

_BINARY = {  # operator -> precedence (higher binds tighter)
    "??": 1,
    "||": 2,
    "&&": 3,
    "==": 4,
    "!=": 4,
    ">": 4,
    "<": 4,
    ">=": 4,
    "<=": 4,
    "=~": 4,
    "!~": 4,
    "in": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}


def _tokenize(text: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise WhenError(f"invalid token at {text[pos:]!r} in {text!r} (hint: quote the value)")
        pos = m.end()
        if m.group("num") is not None:
            tokens.append(("val", float(m.group("num"))))
        elif m.group("str") is not None:
            raw = m.group("str")[1:-1]
            tokens.append(("val", re.sub(r"\\(.)", r"\1", raw)))
        elif m.group("op") is not None:
            tokens.append(("op", m.group("op")))
        else:
            word = m.group("word")
            if word == "true":
                tokens.append(("val", True))
            elif word == "false":
                tokens.append(("val", False))
            elif word == "in":
                tokens.append(("op", "in"))
            else:  # govaluate variables become strings in Argo
                tokens.append(("val", word))
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple[str, Any]], text: str) -> None:
        self.tokens, self.pos, self.text = tokens, 0, text

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, Any]:
        tok = self.peek()
        if tok is None or (op is not None and tok != ("op", op)):
            raise WhenError(f"expected {op or 'a value'} in {self.text!r}")
        self.pos += 1
        return tok

    def expression(self) -> Any:
        cond = self.binary(1)
        if self.peek() == ("op", "?"):
            self.take("?")
            yes = self.expression()
            no = None
            if self.peek() == ("op", ":"):
                self.take(":")
                no = self.expression()
            return ("?", cond, yes, no)
        return cond

    def binary(self, min_prec: int) -> Any:
        left = self.unary()
        while True:
            tok = self.peek()
            if not tok or tok[0] != "op" or tok[1] not in _BINARY or _BINARY[tok[1]] < min_prec:
                return left
            self.pos += 1
            right = self.binary(_BINARY[tok[1]] + 1)
            left = (tok[1], left, right)

    def unary(self) -> Any:
        tok = self.take()
        if tok == ("op", "!"):
            return ("!", self.unary())
        if tok == ("op", "-"):
            return ("neg", self.unary())
        if tok == ("op", "("):
            items = [self.expression()]
            while self.peek() == ("op", ","):
                self.take(",")
                items.append(self.expression())
            self.take(")")
            return items[0] if len(items) == 1 else ("list", items)
        if tok[0] == "val":
            return ("val", tok[1])
        raise WhenError(f"unexpected {tok[1]!r} in {self.text!r}")


def _num(v: Any, op: str) -> float:
    if isinstance(v, bool) or not isinstance(v, float):
        raise WhenError(f"operator {op!r} needs numbers, got {v!r}")
    return v


def _eval(node: Any) -> Any:
    kind = node[0]
    if kind == "val":
        return node[1]
    if kind == "list":
        return [_eval(n) for n in node[1]]
    if kind == "!":
        v = _eval(node[1])
        if not isinstance(v, bool):
            raise WhenError(f"'!' needs a boolean, got {v!r}")
        return not v
    if kind == "neg":
        return -_num(_eval(node[1]), "-")
    if kind == "?":
        cond = _eval(node[1])
        if not isinstance(cond, bool):
            raise WhenError(f"ternary condition must be boolean, got {cond!r}")
        return _eval(node[2]) if cond else (None if node[3] is None else _eval(node[3]))
    a = _eval(node[1])
    if kind == "&&":
        return _bool(a, kind) and _bool(_eval(node[2]), kind)
    if kind == "||":
        return _bool(a, kind) or _bool(_eval(node[2]), kind)
    if kind == "??":
        return a if a is not None else _eval(node[2])
    b = _eval(node[2])
    return _binary(kind, a, b)


def _bool(v: Any, op: str) -> bool:
    if not isinstance(v, bool):
        raise WhenError(f"operator {op!r} needs booleans, got {v!r}")
    return v


def _binary(op: str, a: Any, b: Any) -> Any:
    if op == "==":
        return type(a) is type(b) and a == b
    if op == "!=":
        return not (type(a) is type(b) and a == b)
    if op in ("=~", "!~"):
        found = re.search(str(b), str(a)) is not None
        return found if op == "=~" else not found
    if op == "in":
        return a in (b if isinstance(b, list) else [b])
    if op in (">", "<", ">=", "<="):
        if isinstance(a, str) and isinstance(b, str):
            pass
        else:
            a, b = _num(a, op), _num(b, op)
        return {">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[op]
    if op == "+" and isinstance(a, str) and isinstance(b, str):
        return a + b
    a, b = _num(a, op), _num(b, op)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        raise WhenError(f"division by zero in {op!r}")
    return a / b if op == "/" else a % b


def evaluate_when(text: str) -> bool:
    """Evaluate a substituted `when` string; an empty one is true."""
    if not text or not str(text).strip():
        return True
    text = str(text)
    parser = _Parser(_tokenize(text), text)
    tree = parser.expression()
    if parser.peek() is not None:
        raise WhenError(f"unexpected {parser.peek()[1]!r} in {text!r}")
    result = _eval(tree)
    if not isinstance(result, bool):
        raise WhenError(f"expected a boolean from when {text!r}, got {result!r}")
    return result
