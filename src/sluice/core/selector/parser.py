"""The selector syntax tree and the recursive-descent parser that builds it, with its depth limit.

Grammar: string literals in single quotes (`''` for a quote), exact numerics (decimal, `0x` hex,
leading-`0` octal, optional `L` suffix, 64-bit range), approximate numerics (`1.5`, `.5`, `7e3`),
`TRUE`/`FALSE`, identifiers by Java rules (case-sensitive; so a STOMP header with a `-` in its name
cannot be named), parentheses, `+ - * /` and unary `+ -`, `= <> < <= > >=`,
`[NOT] BETWEEN a AND b`, `[NOT] IN ('a', ...)`, `[NOT] LIKE 'pattern' [ESCAPE 'c']`,
`IS [NOT] NULL`, `NOT`, `AND`, `OR`. Keywords are case-insensitive. Precedence, tightest first:
unary sign, `* /`, `+ -`, comparisons (not chainable), `NOT`, `AND`, `OR`. Positions in error
messages count characters from 0.

Literals that can only be wrong are refused when compiling: a string or boolean literal in
arithmetic or in `< <= > >=`, a number or string where a condition is needed, `IN` and `LIKE` and
`IS NULL` on anything but a property name.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from sluice.core.selector.errors import SelectorError
from sluice.core.selector.lexer import _Tok, _Token
from sluice.core.selector.like import _compile_like

MAX_SELECTOR_DEPTH: Final = 100
"""Bound on nesting (parentheses, operators within operators), so evaluation stays shallow."""


# ---------------------------------------------------------------------------------------------
# Syntax tree


class _Kind(enum.Enum):
    """What a subexpression can yield, as far as the parser can tell."""

    CONDITION = "a condition"
    NUMBER = "a number"
    STRING = "a string"
    ANY = "a property"


@dataclass(slots=True)
class _Node:
    pos: int
    height: int = field(default=1, kw_only=True)


@dataclass(slots=True)
class _Lit(_Node):
    value: object


@dataclass(slots=True)
class _Ident(_Node):
    name: str


@dataclass(slots=True)
class _Unary(_Node):
    op: str
    operand: _Node


@dataclass(slots=True)
class _Arith(_Node):
    op: str
    left: _Node
    right: _Node


@dataclass(slots=True)
class _Compare(_Node):
    op: str
    left: _Node
    right: _Node


@dataclass(slots=True)
class _Between(_Node):
    operand: _Node
    low: _Node
    high: _Node
    negated: bool


@dataclass(slots=True)
class _StringTest(_Node):
    """`name [NOT] IN (...)` or `name [NOT] LIKE '...'`: a test on a string property."""

    name: str
    test: Callable[[str], bool]
    negated: bool


@dataclass(slots=True)
class _IsNull(_Node):
    name: str
    negated: bool


@dataclass(slots=True)
class _Not(_Node):
    operand: _Node


@dataclass(slots=True)
class _Logic(_Node):
    is_and: bool
    operands: list[_Node]


def _kind(node: _Node) -> _Kind:
    if isinstance(node, _Lit):
        if isinstance(node.value, bool):
            return _Kind.CONDITION
        if isinstance(node.value, int | float):
            return _Kind.NUMBER
        if isinstance(node.value, str):
            return _Kind.STRING
        return _Kind.ANY
    if isinstance(node, _Ident):
        return _Kind.ANY
    if isinstance(node, _Unary | _Arith):
        return _Kind.NUMBER
    return _Kind.CONDITION


def _children(node: _Node) -> list[_Node]:
    if isinstance(node, _Unary | _Not):
        return [node.operand]
    if isinstance(node, _Arith | _Compare):
        return [node.left, node.right]
    if isinstance(node, _Between):
        return [node.operand, node.low, node.high]
    if isinstance(node, _Logic):
        return node.operands
    return []


# ---------------------------------------------------------------------------------------------
# Parser: precedence climbing over the token list


_PREC_OR: Final = 1
_PREC_AND: Final = 2
_PREC_NOT: Final = 3
_PREC_PREDICATE: Final = 4
_PREC_SUM: Final = 5
_PREC_PRODUCT: Final = 6
_PREC_UNARY: Final = 7

_COMPARISONS: Final = frozenset({"=", "<>", "<", "<=", ">", ">="})
_ORDERINGS: Final = frozenset({"<", "<=", ">", ">="})
_BINARY_PREC: Final = {
    "OR": _PREC_OR,
    "AND": _PREC_AND,
    "BETWEEN": _PREC_PREDICATE,
    "LIKE": _PREC_PREDICATE,
    "IN": _PREC_PREDICATE,
    "IS": _PREC_PREDICATE,
    **dict.fromkeys(_COMPARISONS, _PREC_PREDICATE),
    "+": _PREC_SUM,
    "-": _PREC_SUM,
    "*": _PREC_PRODUCT,
    "/": _PREC_PRODUCT,
}


def _describe(tok: _Token) -> str:
    if tok.kind is _Tok.END:
        return "unexpected end of selector"
    return f"unexpected token {tok.text!r}"


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._i = 0

    def parse(self) -> _Node:
        node = self._expr(0, 1)
        tok = self._peek()
        if tok.kind is not _Tok.END:
            raise SelectorError(_describe(tok), tok.pos)
        _need_condition(node)
        return node

    def _peek(self) -> _Token:
        return self._tokens[self._i]

    def _advance(self) -> _Token:
        tok = self._tokens[self._i]
        if tok.kind is not _Tok.END:
            self._i += 1
        return tok

    def _expect(self, kind: _Tok, text: str | None = None) -> _Token:
        tok = self._advance()
        if tok.kind is not kind or (text is not None and tok.text != text):
            raise SelectorError(_describe(tok), tok.pos)
        return tok

    def _binary_prec(self, tok: _Token) -> int | None:
        if tok.kind is _Tok.KEYWORD and tok.text == "NOT":
            following = self._tokens[self._i + 1]
            if following.kind is _Tok.KEYWORD and following.text in ("BETWEEN", "LIKE", "IN"):
                return _PREC_PREDICATE
            return None
        if tok.kind is _Tok.KEYWORD or tok.kind is _Tok.OP:
            return _BINARY_PREC.get(tok.text)
        return None

    def _expr(self, min_prec: int, depth: int) -> _Node:
        if depth > MAX_SELECTOR_DEPTH:
            raise SelectorError(
                f"nested deeper than MAX_SELECTOR_DEPTH={MAX_SELECTOR_DEPTH}", self._peek().pos
            )
        left = self._prefix(min_prec, depth)
        while True:
            tok = self._peek()
            prec = self._binary_prec(tok)
            if prec is None or prec < min_prec:
                return left
            if prec == _PREC_PREDICATE:
                left = self._predicate(left, depth)
                following = self._peek()
                if self._binary_prec(following) == _PREC_PREDICATE:
                    raise SelectorError(_describe(following), following.pos)
                continue
            self._advance()
            right = self._expr(prec + 1, depth + 1)
            if prec in (_PREC_OR, _PREC_AND):
                left = _logic(prec == _PREC_AND, left, right, tok.pos)
            else:
                _need_number(left, tok.text)
                _need_number(right, tok.text)
                left = _grown(_Arith(left.pos, tok.text, left, right), tok.pos)

    def _prefix(self, min_prec: int, depth: int) -> _Node:
        tok = self._peek()
        if tok.kind is _Tok.KEYWORD and tok.text == "NOT":
            if min_prec > _PREC_NOT:
                raise SelectorError(_describe(tok), tok.pos)
            self._advance()
            operand = self._expr(_PREC_NOT, depth + 1)
            _need_condition(operand)
            return _grown(_Not(tok.pos, operand), tok.pos)
        if tok.kind is _Tok.OP and tok.text in ("+", "-"):
            self._advance()
            operand = self._expr(_PREC_UNARY, depth + 1)
            _need_number(operand, "unary " + tok.text)
            return _grown(_Unary(tok.pos, tok.text, operand), tok.pos)
        return self._primary(depth)

    def _primary(self, depth: int) -> _Node:
        tok = self._advance()
        if tok.kind is _Tok.STRING or tok.kind is _Tok.NUMBER:
            return _Lit(tok.pos, tok.value)
        if tok.kind is _Tok.IDENT:
            return _Ident(tok.pos, tok.text)
        if tok.kind is _Tok.KEYWORD and tok.text in ("TRUE", "FALSE"):
            return _Lit(tok.pos, tok.text == "TRUE")
        if tok.kind is _Tok.OP and tok.text == "(":
            node = self._expr(0, depth + 1)
            self._expect(_Tok.OP, ")")
            return node
        raise SelectorError(_describe(tok), tok.pos)

    def _predicate(self, left: _Node, depth: int) -> _Node:
        tok = self._advance()
        negated = tok.text == "NOT"
        if negated:
            tok = self._advance()
        op = tok.text
        if op in _COMPARISONS:
            right = self._expr(_PREC_SUM, depth + 1)
            if op in _ORDERINGS:
                _need_number(left, op)
                _need_number(right, op)
            return _grown(_Compare(left.pos, op, left, right), tok.pos)
        if op == "BETWEEN":
            low = self._expr(_PREC_SUM, depth + 1)
            self._expect(_Tok.KEYWORD, "AND")
            high = self._expr(_PREC_SUM, depth + 1)
            for operand in (left, low, high):
                _need_number(operand, "BETWEEN")
            return _grown(_Between(left.pos, left, low, high, negated), tok.pos)
        name = _need_identifier(left, op)
        if op == "LIKE":
            pattern = self._expect(_Tok.STRING)
            escape: str | None = None
            following = self._peek()
            if following.kind is _Tok.KEYWORD and following.text == "ESCAPE":
                self._advance()
                escape_tok = self._expect(_Tok.STRING)
                escape = str(escape_tok.value)
                if len(escape) != 1:
                    raise SelectorError("ESCAPE needs exactly one character", escape_tok.pos)
            like = _compile_like(str(pattern.value), escape, pattern.pos)
            return _StringTest(left.pos, name, like, negated, height=2)
        if op == "IN":
            self._expect(_Tok.OP, "(")
            values = {str(self._expect(_Tok.STRING).value)}
            while self._peek().text == ",":
                self._advance()
                values.add(str(self._expect(_Tok.STRING).value))
            self._expect(_Tok.OP, ")")
            return _StringTest(left.pos, name, frozenset(values).__contains__, negated, height=2)
        # IS [NOT] NULL: `_binary_prec` only lets BETWEEN, LIKE and IN follow an infix NOT.
        following = self._peek()
        if following.kind is _Tok.KEYWORD and following.text == "NOT":
            self._advance()
            negated = True
        self._expect(_Tok.KEYWORD, "NULL")
        return _IsNull(left.pos, name, negated, height=2)


def _grown(node: _Node, op_pos: int) -> _Node:
    """Set `node.height` from its children and enforce the depth bound."""
    node.height = 1 + max(child.height for child in _children(node))
    if node.height > MAX_SELECTOR_DEPTH:
        raise SelectorError(f"nested deeper than MAX_SELECTOR_DEPTH={MAX_SELECTOR_DEPTH}", op_pos)
    return node


def _logic(is_and: bool, left: _Node, right: _Node, op_pos: int) -> _Node:
    _need_condition(left)
    _need_condition(right)
    # AND and OR are associative in three-valued logic too, so chains become one flat node:
    # a thousand clauses cost one level of evaluation depth, not a thousand.
    operands: list[_Node] = []
    for side in (left, right):
        if isinstance(side, _Logic) and side.is_and == is_and:
            operands.extend(side.operands)
        else:
            operands.append(side)
    return _grown(_Logic(left.pos, is_and, operands), op_pos)


def _need_condition(node: _Node) -> None:
    kind = _kind(node)
    if kind is not _Kind.CONDITION and kind is not _Kind.ANY:
        raise SelectorError(f"expected a condition, found {kind.value}", node.pos)


def _need_number(node: _Node, op: str) -> None:
    kind = _kind(node)
    if kind is not _Kind.NUMBER and kind is not _Kind.ANY:
        raise SelectorError(f"{op!r} needs numbers, found {kind.value}", node.pos)


def _need_identifier(node: _Node, op: str) -> str:
    if not isinstance(node, _Ident):
        raise SelectorError(f"{op} needs a property name on its left", node.pos)
    return node.name
