"""The parser of Argo's expression language (expr.py): expr-lang's grammar as a Pratt parser,
following its operator table (parser/operator/operator.go in expr-lang/expr) and its lexer
(parser/lexer/state.go). Nodes are tuples; `check_tree` refuses a function the runner lacks.

Bounded against hostile manifests: the text's length and the nesting depth (so Python's own
recursion never runs out).
"""

from __future__ import annotations

import re
from typing import Any

from ckptflow.workflows.runner import expr_funcs as fn
from ckptflow.workflows.runner.expr_env import ENV_FUNCS, SPRIG
from ckptflow.workflows.runner.expr_funcs import ExprError

__all__ = ["MAX_DEPTH", "MAX_LEN", "check_tree", "parse"]

MAX_LEN = 8192  # characters of one expression
MAX_DEPTH = 48  # nesting of brackets, calls and operators


_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    | (?P<num>0[xX][0-9a-fA-F_]+|(?:\d[\d_]*)(?:\.(?!\.)\d[\d_]*)?(?:[eE][+-]?\d+)?)
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<raw>`[^`]*`)
    | (?P<ptr>\#[A-Za-z_]*)
    | (?P<name>[A-Za-z_$][\w$]*)
    | (?P<op>\?\?|\?\.|\.\.|==|!=|<=|>=|&&|\|\||\*\*|[-+*/%^<>!?:.,()\[\]{}|;=])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_ESCAPES |= {"a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_WORD_OPS = {"and", "or", "not", "in", "matches", "contains", "startsWith", "endsWith"}
# expr-lang's parser/operator/operator.go: precedence (higher binds tighter); ** and ^ are right
_BINARY = {"or": 10, "||": 10, "and": 15, "&&": 15, "==": 20, "!=": 20, "<": 20, ">": 20}
_BINARY |= {">=": 20, "<=": 20, "in": 20, "matches": 20, "contains": 20, "startsWith": 20}
_BINARY |= {"endsWith": 20, "..": 25, "+": 30, "-": 30, "*": 60, "/": 60, "%": 60}
_BINARY |= {"**": 100, "^": 100, "??": 500}
_UNARY = {"not": 50, "!": 50, "-": 90, "+": 90}
_NEGATABLE = {"in", "matches", "contains", "startsWith", "endsWith"}
_COMPARISON = ("<", ">", "<=", ">=")


def _show(tok: tuple[str, Any]) -> str:
    """A token as the expression wrote it, for messages (`true`, not Python's True)."""
    kind, value = tok
    if kind == "val" and isinstance(value, bool):
        return "true" if value else "false"
    return "nil" if kind == "val" and value is None else repr(value)


def _unquote(text: str) -> str:
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        else:
            raise ExprError(f"invalid escape \\{nxt} in string {text[:40]!r}")
    return "".join(out)


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExprError(f"unrecognized character {text[pos]!r} at {pos}")
        pos, kind = m.end(), m.lastgroup
        word = m.group()
        if kind == "ws":
            continue
        if kind == "num":
            clean = word.replace("_", "")
            is_float = not clean.lower().startswith("0x") and any(c in clean for c in ".eE")
            out.append(("val", float(clean) if is_float else int(clean, 0)))
        elif kind == "str":
            out.append(("val", _unquote(word)))
        elif kind == "raw":
            out.append(("val", word[1:-1]))
        elif kind == "ptr":
            out.append(("ptr", word[1:]))
        elif kind == "name" and word in ("true", "false"):
            out.append(("val", word == "true"))
        elif kind == "name" and word == "nil":
            out.append(("val", None))
        elif kind == "name" and word in _WORD_OPS:
            out.append(("op", word))
        elif kind == "name" and word == "let":
            raise ExprError("'let' is not supported by the local runner")
        else:
            out.append((kind, word))
    return out


class _Parser:
    """expr-lang's grammar as a Pratt parser; nodes are tuples (see `_Eval`)."""

    def __init__(self, text: str) -> None:
        self.toks, self.pos, self.depth = _tokens(text), 0, 0

    def peek(self, ahead: int = 0) -> tuple[str, Any] | None:
        i = self.pos + ahead
        return self.toks[i] if i < len(self.toks) else None

    def is_op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "op" and tok[1] in ops

    def expect(self, op: str) -> None:
        if not self.is_op(op):
            got = self.peek()
            raise ExprError(f"expected {op!r}, got {got[1] if got else 'the end'!r}")
        self.pos += 1

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {MAX_DEPTH}")

    def parse(self) -> tuple:
        node = self.expression()
        if self.peek() is not None:
            raise ExprError(f"unexpected {_show(self.peek())}")
        return node

    def expression(self) -> tuple:
        self.nest()
        node = self.binary(0)
        if self.is_op("?"):
            self.pos += 1
            yes = self.expression()
            self.expect(":")
            node = ("cond", node, yes, self.expression())
        self.depth -= 1
        return node

    def binary(self, min_prec: int) -> tuple:
        """Operators by precedence (parser.go parseExpression): `not in`-style negations,
        chained comparisons (`a < b < c` is `a < b && b < c`), `??` not mixed with others."""
        left, prev = self.unary(), ""
        while True:
            tok = self.peek()
            if tok is None or tok[0] != "op":
                return left
            op, negate = tok[1], False
            if op == "not" and self.peek(1) and self.peek(1)[1] in _NEGATABLE:
                op, negate = self.peek(1)[1], True
            if op not in _BINARY or _BINARY[op] < min_prec or op == "|":
                return left
            if prev == "??" and op != "??":
                raise ExprError(f"operator {op} and coalesce expressions (??) cannot be mixed")
            self.pos += 2 if negate else 1
            self.nest()
            if op in _COMPARISON:
                left = self.comparison(left, op)
            else:
                right = self.binary(_BINARY[op] + (0 if op in ("**", "^") else 1))
                left = ("bin", op, left, right)
            self.depth -= 1
            if negate:
                left = ("not", left)
            prev = op

    def comparison(self, left: tuple, op: str) -> tuple:
        root = None
        while True:
            right = self.binary(_BINARY[op] + 1)
            node = ("bin", op, left, right)
            root = node if root is None else ("bin", "&&", root, node)
            if not self.is_op(*_COMPARISON):
                return root
            left, op = right, self.peek()[1]
            self.pos += 1

    def unary(self) -> tuple:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in _UNARY:
            self.pos += 1
            self.nest()
            operand = self.binary(_UNARY[tok[1]])
            self.depth -= 1
            return ("not", operand) if tok[1] in ("not", "!") else ("neg" + tok[1], operand)
        return self.postfix(self.primary())

    def primary(self) -> tuple:
        tok = self.peek()
        if tok is None:
            raise ExprError("unexpected end of expression")
        self.pos += 1
        kind, value = tok
        if kind == "val":
            return ("val", value)
        if kind == "ptr":
            if value:
                raise ExprError(f"#{value} is not supported by the local runner")
            return ("ptr",)
        if kind == "name":
            if self.is_op("("):
                return self.call(value)
            return ("name", value)
        if value == "(":
            node = self.expression()
            self.expect(")")
            return node
        if value == "[":
            return ("list", self.items("]"))
        if value == "{":
            return self.map_literal()
        if value == "." and self.peek() and self.peek()[0] == "name":  # `.x` is `#.x`
            self.pos += 1
            return ("member", ("ptr",), ("val", self.toks[self.pos - 1][1]), False)
        raise ExprError(f"unexpected {_show(tok)}")

    def items(self, close: str) -> list[tuple]:
        self.nest()
        out: list[tuple] = []
        while not self.is_op(close):
            out.append(self.expression())
            if not self.is_op(close):
                self.expect(",")
        self.expect(close)
        self.depth -= 1
        return out

    def map_literal(self) -> tuple:
        self.nest()
        pairs = []
        while not self.is_op("}"):
            tok = self.peek()
            if tok is not None and tok[0] == "name":
                self.pos += 1
                key: tuple = ("val", tok[1])
            elif tok is not None and tok[0] == "val" and isinstance(tok[1], str | int):
                self.pos += 1
                key = ("val", tok[1])
            elif self.is_op("("):
                key = self.primary()
            else:
                raise ExprError(f"a map key must be a name, string or (expression), not {tok}")
            self.expect(":")
            pairs.append((key, self.expression()))
            if not self.is_op("}"):
                self.expect(",")
        self.expect("}")
        self.depth -= 1
        return ("map", pairs)

    def call(self, name: str) -> tuple:
        """A call by name: a builtin (predicates take a closure) or an env function."""
        self.expect("(")
        if name in fn.PREDICATES:
            self.nest()
            args = [self.expression()]
            while self.is_op(","):
                self.pos += 1
                if self.is_op("{"):
                    self.pos += 1
                    args.append(("closure", self.expression()))
                    self.expect("}")
                else:
                    args.append(("closure", self.expression()))
            self.expect(")")
            self.depth -= 1
            return ("builtin", name, args)
        args = self.items(")")
        if name in fn.BUILTINS:
            return ("builtin", name, args)
        return ("call", ("name", name), args)

    def postfix(self, node: tuple) -> tuple:
        while True:
            if self.is_op(".", "?."):
                optional = self.peek()[1] == "?."
                self.pos += 1
                tok = self.peek()
                if (
                    tok is None
                    or tok[0] not in ("name", "op")
                    or tok[0] == "op"
                    and tok[1] not in _WORD_OPS
                ):
                    raise ExprError("expected a name after '.'")
                self.pos += 1
                node = ("member", node, ("val", tok[1]), optional)
                if self.is_op("("):
                    self.pos += 1
                    node = ("call", node, self.items(")"))
            elif self.is_op("["):
                self.pos += 1
                self.nest()
                lo = None if self.is_op(":") else self.expression()
                if self.is_op(":"):
                    self.pos += 1
                    hi = None if self.is_op("]") else self.expression()
                    node = ("slice", node, lo, hi)
                else:
                    node = ("member", node, lo, False)
                self.expect("]")
                self.depth -= 1
            else:
                return node


def parse(text: str) -> tuple:
    if not isinstance(text, str):
        raise ExprError(f"an expression must be a string, not {type(text).__name__}")
    if len(text) > MAX_LEN:
        raise ExprError(f"expression longer than {MAX_LEN} characters")
    if not text.strip():
        raise ExprError("empty expression")
    return _Parser(text).parse()


def _calls(node: Any):
    """Every function a tree calls by name: a bare name, `sprig.x`, or "(computed)"."""
    if isinstance(node, list):
        for part in node:
            yield from _calls(part)
        return
    if not isinstance(node, tuple):
        return
    if node and node[0] == "call":
        callee = node[1]
        if callee[0] == "name":
            yield callee[1]
        elif callee[0] == "member" and callee[1][0] == "name" and callee[2][0] == "val":
            yield f"{callee[1][1]}.{callee[2][1]}"
        else:  # a method (`x.Seconds()`) or a computed callee
            yield "(a method or computed value)"
    for part in node:
        yield from _calls(part)


def check_tree(tree: tuple) -> None:
    """Refuse a tree that calls a function the runner lacks (ExprError, one line)."""
    for name in _calls(tree):
        known = callable(ENV_FUNCS.get(name)) or (name.startswith("sprig.") and name[6:] in SPRIG)
        if name.startswith("("):
            raise ExprError("calling a method or a computed value is not supported locally")
        if not known:
            raise ExprError(f"function {name}() is not supported by the local runner")
