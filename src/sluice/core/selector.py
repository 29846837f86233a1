"""JMS message selectors: compile the SQL-92 subset of JMS 1.1/2.0 once, evaluate it per message.

Clients pass a selector in the SUBSCRIBE header `selector`; a subscription only receives messages
for which it is TRUE. `compile_selector` parses the text into a tree of small closures;
`Selector.matches` runs them against a property lookup and never raises, whatever the values.

Grammar: string literals in single quotes (`''` for a quote), exact numerics (decimal, `0x` hex,
leading-`0` octal, optional `L` suffix, 64-bit range), approximate numerics (`1.5`, `.5`, `7e3`),
`TRUE`/`FALSE`, identifiers by Java rules (case-sensitive; so a STOMP header with a `-` in its name
cannot be named), parentheses, `+ - * /` and unary `+ -`, `= <> < <= > >=`,
`[NOT] BETWEEN a AND b`, `[NOT] IN ('a', ...)`, `[NOT] LIKE 'pattern' [ESCAPE 'c']`,
`IS [NOT] NULL`, `NOT`, `AND`, `OR`. Keywords are case-insensitive. Precedence, tightest first:
unary sign, `* /`, `+ -`, comparisons (not chainable), `NOT`, `AND`, `OR`. Positions in error
messages count characters from 0.

Logic is SQL's three-valued logic: a missing property is NULL, a comparison with NULL is UNKNOWN,
`NOT UNKNOWN` is UNKNOWN, and a message matches only when the whole selector is TRUE. So
`NOT (x = 1)` does not match a message without `x`.

Values and the string/number rule. STOMP headers are strings, so user properties arrive as `str`;
the JMS header fields (`JMSPriority` and the rest of `JMS_HEADER_IDENTIFIERS`) are supplied by the
caller with their JMS types (int priority and timestamp, str ids and type, `'PERSISTENT'` or
`'NON_PERSISTENT'` delivery mode, bool redelivered). ActiveMQ's STOMP bridge sends every STOMP
selector through its "convert string expressions" mode: when a string meets a number or a boolean
in a comparison, the string is converted to the other side's type, and the comparison is FALSE if
it does not convert. We follow that, so `price > 100` and `count = 3` work on STOMP headers, with
these rules:

- Two strings compare as strings with `=` and `<>` (`'1.0' = '1'` is FALSE).
- A string meets a number: the string is read as a number if it looks like one (an optional sign,
  then a Java integer or decimal literal without suffix; whitespace is not trimmed), else the
  comparison is FALSE. Unlike ActiveMQ, `'2.5' > 2` is TRUE: the number need not have the type of
  the other side.
- A string meets a boolean: `'true'`/`'false'` in any case convert; any other string is FALSE.
- `< <= > >=`, `BETWEEN` and arithmetic take numbers and numeric-looking strings (so two numeric
  header values compare numerically). Other operands make an ordering FALSE (JMS: comparing unlike
  types is false) and arithmetic UNKNOWN (there is no value to compare).
- A property used as a condition (`urgent AND price > 10`) is TRUE for `True` or `'true'`,
  FALSE for any other non-NULL value. `IN` and `LIKE` apply to strings; other values give FALSE.
- `/` always divides in floating point, with Java's results for division by zero (infinity or
  NaN). Integer results that leave the 64-bit range go on in floating point instead of wrapping.
- `NOT BETWEEN` is `x < a OR x > b` and `<>` is `NOT (=)`, as the JMS specification defines them.

Literals that can only be wrong are refused when compiling: a string or boolean literal in
arithmetic or in `< <= > >=`, a number or string where a condition is needed, `IN` and `LIKE` and
`IS NULL` on anything but a property name.

`LIKE` patterns are turned into regular expressions once, at compile time, but one per stretch
between `%` signs rather than one for the whole pattern: a single `.*?a.*?b` style regex backtracks
quadratically on long header values, while placing each fixed-length stretch at its leftmost
place needs no backtracking and gives the same answer.
"""

from __future__ import annotations

import enum
import math
import operator
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from sluice.errors import SluiceError

__all__ = [
    "JMS_HEADER_IDENTIFIERS",
    "MAX_SELECTOR_DEPTH",
    "MAX_SELECTOR_LENGTH",
    "PropertyLookup",
    "Selector",
    "SelectorError",
    "compile_selector",
]

MAX_SELECTOR_LENGTH: Final = 4096
"""Default bound on the selector text, in characters."""

MAX_SELECTOR_DEPTH: Final = 100
"""Bound on nesting (parentheses, operators within operators), so evaluation stays shallow."""

JMS_HEADER_IDENTIFIERS: Final = frozenset(
    {
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSMessageID",
        "JMSTimestamp",
        "JMSCorrelationID",
        "JMSType",
        "JMSRedelivered",
        "JMSDestination",
        "JMSReplyTo",
        "JMSExpiration",
        "JMSXGroupID",
        "JMSXGroupSeq",
        "JMSXDeliveryCount",
    }
)
"""Identifiers the caller should supply (through `extra`) from the message's own fields."""

PropertyLookup: TypeAlias = Callable[[str], object]
"""Returns the value of a property or JMS header field, or None when the message lacks it."""

_Fn: TypeAlias = Callable[[PropertyLookup], object]

_MIN_LONG: Final = -(2**63)
_MAX_LONG: Final = 2**63 - 1
_MAX_NUMERIC_TEXT: Final = 64  # longer strings are never read as numbers: bounded parse work


class SelectorError(SluiceError):
    """A selector is malformed or too large. `position` is the character offset, when known."""

    def __init__(self, reason: str, position: int | None = None) -> None:
        self.reason = reason
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"selector: {reason}{where}")


# ---------------------------------------------------------------------------------------------
# Tokens


class _Tok(enum.Enum):
    IDENT = enum.auto()
    KEYWORD = enum.auto()
    STRING = enum.auto()
    NUMBER = enum.auto()
    OP = enum.auto()
    END = enum.auto()


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Tok
    text: str  # keywords upper-cased, other tokens as written
    value: object
    pos: int


_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"}
)
_OPERATORS: Final = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_WHITESPACE: Final = frozenset(" \t\n\r\f")
_ID_START_CATEGORIES: Final = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_ID_PART_CATEGORIES: Final = _ID_START_CATEGORIES | {"Nd", "Mn", "Mc"}

_NUMBER_LITERAL: Final = re.compile(
    r"""(?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
      | 0[xX](?P<hex>[0-9a-fA-F]+)[lL]?
      | 0(?P<oct>[0-7]+)[lL]?
      | (?P<dec>0|[1-9]\d*)[lL]?""",
    re.VERBOSE | re.ASCII,
)


def _is_id_start(c: str) -> bool:
    if c.isascii():
        return c.isalpha() or c in "_$"
    return unicodedata.category(c) in _ID_START_CATEGORIES


def _is_id_part(c: str) -> bool:
    if c.isascii():
        return c.isalnum() or c in "_$"
    return unicodedata.category(c) in _ID_PART_CATEGORIES


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    n = len(text)
    i = 0
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(_Token(_Tok.END, "", None, n))
            return tokens
        c = text[i]
        start = i
        if c == "'":
            parts: list[str] = []
            i += 1
            while True:
                close = text.find("'", i)
                if close < 0:
                    raise SelectorError("unterminated string literal", start)
                parts.append(text[i:close])
                if text.startswith("'", close + 1):
                    parts.append("'")
                    i = close + 2
                else:
                    i = close + 1
                    break
            tokens.append(_Token(_Tok.STRING, text[start:i], "".join(parts), start))
        elif (c.isascii() and c.isdigit()) or (c == "." and text[i + 1 : i + 2].isdigit()):
            m = _NUMBER_LITERAL.match(text, i)
            assert m is not None  # a digit, or a dot and a digit, always starts a literal
            i = m.end()
            if i < n and (_is_id_part(text[i]) or text[i] == "."):
                raise SelectorError(f"malformed number {text[start : i + 1]!r}", start)
            value: int | float
            if m.group("float") is not None:
                value = float(m.group("float"))
            else:
                if m.group("hex") is not None:
                    value = int(m.group("hex"), 16)
                elif m.group("oct") is not None:
                    value = int(m.group("oct"), 8)
                else:
                    value = int(m.group("dec"))
                if value > 2**63:  # 2**63 itself is allowed so that -9223372036854775808 parses
                    raise SelectorError(f"integer {text[start:i]!r} out of 64-bit range", start)
            tokens.append(_Token(_Tok.NUMBER, text[start:i], value, start))
        elif _is_id_start(c):
            i += 1
            while i < n and _is_id_part(text[i]):
                i += 1
            word = text[start:i]
            upper = word.upper()
            # Keywords are ASCII: a non-ASCII name whose upper case spells one stays a name.
            if upper in _KEYWORDS and word.isascii():
                tokens.append(_Token(_Tok.KEYWORD, upper, None, start))
            else:
                tokens.append(_Token(_Tok.IDENT, word, word, start))
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    i += len(op)
                    tokens.append(_Token(_Tok.OP, op, None, start))
                    break
            else:
                raise SelectorError(f"unexpected character {c!r}", start)


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
# LIKE


class _LikePattern:
    """A LIKE pattern as fixed-length stretches separated by `%`.

    Each stretch is a plain string (fast `str` searches) or, when it holds `_`, a regex of the
    same fixed length. The value matches when the first stretch sits at the start, the last at the
    end, and the others fit in order in between, each at its leftmost place: taking the leftmost
    place never hurts the stretches that follow, so no backtracking is needed.
    """

    __slots__ = ("_min_length", "_parts")

    def __init__(self, stretches: list[list[str | None]]) -> None:
        self._parts: list[tuple[str | re.Pattern[str], int]] = []
        for stretch in stretches:
            if None in stretch:
                regex = "".join("." if c is None else re.escape(c) for c in stretch)
                self._parts.append((re.compile(regex, re.DOTALL), len(stretch)))
            else:
                self._parts.append(("".join(c for c in stretch if c is not None), len(stretch)))
        self._min_length = sum(len(s) for s in stretches)

    def matches(self, value: str) -> bool:
        """Whether the whole of `value` matches the pattern."""
        parts = self._parts
        n = len(value)
        if len(parts) == 1:
            only, length = parts[0]
            if isinstance(only, str):
                return value == only
            return n == length and only.match(value) is not None
        if n < self._min_length:
            return False
        (first, first_length), (last, last_length) = parts[0], parts[-1]
        start, end = first_length, n - last_length
        if not (_part_at(first, value, 0) and _part_at(last, value, end)):
            return False
        for part, length in parts[1:-1]:
            if isinstance(part, str):
                found = value.find(part, start, end)
            else:
                m = part.search(value, start, end)
                found = -1 if m is None else m.start()
            if found < 0:
                return False
            start = found + length
        return True


def _part_at(part: str | re.Pattern[str], value: str, pos: int) -> bool:
    if isinstance(part, str):
        return value.startswith(part, pos)
    return part.match(value, pos) is not None


def _compile_like(pattern: str, escape: str | None, pos: int) -> Callable[[str], bool]:
    """A matcher for a LIKE pattern; the usual shapes get a plain `str` method."""
    stretches: list[list[str | None]] = [[]]  # split on unescaped `%`; `_` becomes None
    chars = iter(pattern)
    for c in chars:
        if c == escape:
            following = next(chars, None)
            if following not in ("%", "_", escape):
                raise SelectorError(
                    f"in LIKE pattern, escape {escape!r} must precede '%', '_' or itself", pos
                )
            stretches[-1].append(following)
        elif c == "%":
            stretches.append([])
        elif c == "_":
            stretches[-1].append(None)
        else:
            stretches[-1].append(c)
    if any(None in stretch for stretch in stretches):
        return _LikePattern(stretches).matches
    texts = ["".join(c for c in stretch if c is not None) for stretch in stretches]
    if len(texts) == 1:
        return texts[0].__eq__
    if len(texts) == 2:
        prefix, suffix = texts
        least = len(prefix) + len(suffix)
        return lambda v: len(v) >= least and v.startswith(prefix) and v.endswith(suffix)
    if len(texts) == 3 and not texts[0] and not texts[2]:
        middle = texts[1]
        return lambda v: middle in v
    return _LikePattern(stretches).matches


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


# ---------------------------------------------------------------------------------------------
# Value rules (see the module docstring)


def _fit(n: int | float) -> int | float:
    """Keep integers in 64-bit range; beyond it, go on in floating point."""
    if type(n) is int and not _MIN_LONG <= n <= _MAX_LONG:
        try:
            return float(n)
        except OverflowError:  # only for values handed in by the caller, past 1e308
            return math.inf if n > 0 else -math.inf
    return n


# What a header value must look like to be read as a number: Java literal syntax, no suffix.
_NUMERIC_STRING: Final = re.compile(
    r"[+-]?(?:(\d+)|(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)", re.ASCII
)


def _parse_number(s: str) -> int | float | None:
    if len(s) > _MAX_NUMERIC_TEXT:
        return None
    if s.isdigit() and s.isascii():
        return int(s) if len(s) < 19 else _fit(int(s))  # 18 digits always fit in 64 bits
    m = _NUMERIC_STRING.fullmatch(s)
    if m is None:
        return None
    if m.group(1) is not None:
        return _fit(int(s))
    return float(s)


def _num(v: object) -> int | float | None:
    """`v` as a number (bools excluded), or None when it is not one."""
    if type(v) is float:
        return v
    if type(v) is int:
        return v if _MIN_LONG <= v <= _MAX_LONG else _fit(v)
    if type(v) is str:
        return _parse_number(v)
    return None


def _parse_bool(s: str) -> bool | None:
    if len(s) == 4 and s.lower() == "true":
        return True
    if len(s) == 5 and s.lower() == "false":
        return False
    return None


_SCALARS: Final = frozenset({str, int, float, bool})


def _equal(a: object, b: object) -> bool:
    """`a = b` for two non-NULL values."""
    ta, tb = type(a), type(b)
    if ta is tb:
        return ta in _SCALARS and a == b
    if ta is bool:
        return tb is str and _parse_bool(b) is a  # type: ignore[arg-type]
    if tb is bool:
        return ta is str and _parse_bool(a) is b  # type: ignore[arg-type]
    na = _num(a)
    if na is None:
        return False
    nb = _num(b)
    return nb is not None and na == nb


def _truth(v: object) -> bool | None:
    """A property's value used as a condition."""
    if v is True or v is False or v is None:
        return v
    return type(v) is str and _parse_bool(v) is True


def _divide(a: int | float, b: int | float) -> float:
    fa, fb = float(a), float(b)
    if fb == 0.0:
        if fa == 0.0 or math.isnan(fa):
            return math.nan
        return math.copysign(math.inf, fa) * math.copysign(1.0, fb)
    return fa / fb


def _add(a: int | float, b: int | float) -> int | float:
    return _fit(a + b)


def _subtract(a: int | float, b: int | float) -> int | float:
    return _fit(a - b)


def _multiply(a: int | float, b: int | float) -> int | float:
    return _fit(a * b)


_ARITHMETIC: Final[dict[str, Callable[[int | float, int | float], int | float]]] = {
    "+": _add,
    "-": _subtract,
    "*": _multiply,
    "/": _divide,
}
_ORDERING_OPS: Final[dict[str, Callable[[int | float, int | float], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRRORED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _ordered(op: Callable[[int | float, int | float], bool], a: object, b: object) -> bool | None:
    """`a op b` for an ordering operator, in three-valued logic."""
    if a is None or b is None:
        return None
    na = _num(a)
    if na is None:
        return False
    nb = _num(b)
    if nb is None:
        return False
    return op(na, nb)


def _and3(x: bool | None, y: bool | None) -> bool | None:
    if x is False or y is False:
        return False
    if x is None or y is None:
        return None
    return True


def _or3(x: bool | None, y: bool | None) -> bool | None:
    if x is True or y is True:
        return True
    if x is None or y is None:
        return None
    return False


# ---------------------------------------------------------------------------------------------
# Code generation: syntax tree to closures


def _no_properties(name: str) -> None:
    return None


def _fold(node: _Node) -> _Node:
    """Replace subtrees made only of literals by their value."""
    if isinstance(node, _Unary | _Not):
        node.operand = _fold(node.operand)
    elif isinstance(node, _Arith | _Compare):
        node.left, node.right = _fold(node.left), _fold(node.right)
    elif isinstance(node, _Between):
        node.operand, node.low, node.high = (_fold(n) for n in (node.operand, node.low, node.high))
    elif isinstance(node, _Logic):
        node.operands = [_fold(n) for n in node.operands]
    children = _children(node)
    if children and all(isinstance(c, _Lit) for c in children):
        return _Lit(node.pos, _generate(node)(_no_properties))
    return node


def _generate(node: _Node) -> _Fn:
    if isinstance(node, _Lit):
        value = node.value
        return lambda lookup: value
    if isinstance(node, _Ident):
        name = node.name
        return lambda lookup: lookup(name)
    if isinstance(node, _Compare):
        return _generate_compare(node)
    if isinstance(node, _Logic):
        return _generate_logic(node)
    if isinstance(node, _Not):
        return _generate_not(_generate_condition(node.operand))
    if isinstance(node, _Arith):
        return _generate_arith(node)
    if isinstance(node, _Unary):
        return _generate_unary(node)
    if isinstance(node, _Between):
        return _generate_between(node)
    if isinstance(node, _IsNull):
        return _generate_is_null(node)
    if isinstance(node, _StringTest):
        fn = _generate_string_test(node)
        return _generate_not(fn) if node.negated else fn
    raise AssertionError(f"unknown selector node {node!r}")


def _generate_condition(node: _Node) -> _Fn:
    """Closure for a node in a logical position: yields only True, False or None."""
    fn = _generate(node)
    if _kind(node) is _Kind.CONDITION:
        return fn
    return lambda lookup: _truth(fn(lookup))


def _generate_not(fn: _Fn) -> _Fn:
    def negate(lookup: PropertyLookup) -> object:
        v = fn(lookup)
        return None if v is None else not v

    return negate


def _generate_logic(node: _Logic) -> _Fn:
    fns = tuple(_generate_condition(operand) for operand in node.operands)
    if len(fns) == 2:
        first, second = fns
        if node.is_and:

            def and2(lookup: PropertyLookup) -> object:
                x = first(lookup)
                if x is False:
                    return False
                return _and3(x, second(lookup))  # type: ignore[arg-type]

            return and2

        def or2(lookup: PropertyLookup) -> object:
            x = first(lookup)
            if x is True:
                return True
            return _or3(x, second(lookup))  # type: ignore[arg-type]

        return or2

    decisive = not node.is_and  # the value that settles the whole chain: False for AND

    def chain(lookup: PropertyLookup) -> object:
        result: bool | None = not decisive
        for fn in fns:
            v = fn(lookup)
            if v is decisive:
                return decisive
            if v is None:
                result = None
        return result

    return chain


def _generate_compare(node: _Compare) -> _Fn:
    op, left, right = node.op, node.left, node.right
    if isinstance(left, _Lit) and not isinstance(right, _Lit):
        op, left, right = _MIRRORED[op], right, left
    if isinstance(left, _Ident) and isinstance(right, _Lit) and right.value is not None:
        return _generate_property_vs_constant(op, left.name, right.value)
    lf, rf = _generate(left), _generate(right)
    if op in _ORDERING_OPS:
        ordering = _ORDERING_OPS[op]
        return lambda lookup: _ordered(ordering, lf(lookup), rf(lookup))
    negated = op == "<>"

    def compare_equal(lookup: PropertyLookup) -> object:
        a = lf(lookup)
        if a is None:
            return None
        b = rf(lookup)
        if b is None:
            return None
        return _equal(a, b) is not negated

    return compare_equal


def _generate_property_vs_constant(op: str, name: str, constant: object) -> _Fn:
    """The common case, `name op literal`, with the literal's type known in advance."""
    if op in _ORDERING_OPS:
        ordering = _ORDERING_OPS[op]
        c = _num(constant)
        assert c is not None  # the parser allows only numbers in orderings

        def ordered(lookup: PropertyLookup) -> object:
            v = lookup(name)
            if v is None:
                return None
            if type(v) is int or type(v) is float:
                return ordering(v, c)
            n = _parse_number(v) if type(v) is str else _num(v)
            return False if n is None else ordering(n, c)

        return ordered
    negated = op == "<>"
    same_type = type(constant)

    def equal(lookup: PropertyLookup) -> object:
        v = lookup(name)
        if v is None:
            return None
        if type(v) is same_type:
            return (v == constant) is not negated
        return _equal(v, constant) is not negated

    return equal


def _generate_arith(node: _Arith) -> _Fn:
    lf, rf = _generate(node.left), _generate(node.right)
    compute = _ARITHMETIC[node.op]

    def arith(lookup: PropertyLookup) -> object:
        a = _num(lf(lookup))
        if a is None:
            return None
        b = _num(rf(lookup))
        if b is None:
            return None
        return compute(a, b)

    return arith


def _generate_unary(node: _Unary) -> _Fn:
    fn = _generate(node.operand)
    if node.op == "+":
        return lambda lookup: _num(fn(lookup))

    def negate(lookup: PropertyLookup) -> object:
        v = _num(fn(lookup))
        return None if v is None else _fit(-v)

    return negate


def _generate_between(node: _Between) -> _Fn:
    vf, lowf, highf = _generate(node.operand), _generate(node.low), _generate(node.high)
    negated = node.negated

    def between(lookup: PropertyLookup) -> object:
        v = vf(lookup)
        if v is None:
            return None
        if negated:
            below = _ordered(operator.lt, v, lowf(lookup))
            return _or3(below, _ordered(operator.gt, v, highf(lookup)))
        above = _ordered(operator.ge, v, lowf(lookup))
        return _and3(above, _ordered(operator.le, v, highf(lookup)))

    return between


def _generate_is_null(node: _IsNull) -> _Fn:
    name = node.name
    if node.negated:
        return lambda lookup: lookup(name) is not None
    return lambda lookup: lookup(name) is None


def _generate_string_test(node: _StringTest) -> _Fn:
    name, test = node.name, node.test

    def string_test(lookup: PropertyLookup) -> object:
        v = lookup(name)
        if v is None:
            return None
        return type(v) is str and test(v)

    return string_test


def _identifiers(node: _Node) -> set[str]:
    names: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, _Ident | _StringTest | _IsNull):
            names.add(n.name)
        stack.extend(_children(n))
    return names


# ---------------------------------------------------------------------------------------------
# Public API


class Selector:
    """A compiled selector. `matches` is cheap and never raises; build one per subscription.

    `text` is the selector as given; `identifiers` holds every property or header name it reads
    (a caller can skip building JMS header fields the selector never names).
    """

    __slots__ = ("_evaluate", "identifiers", "text")

    def __init__(self, text: str, evaluate: _Fn, identifiers: frozenset[str]) -> None:
        self.text = text
        self.identifiers = identifiers
        self._evaluate = evaluate

    def matches(self, lookup: PropertyLookup) -> bool:
        """True when the selector is TRUE for the message whose properties `lookup` returns."""
        return self._evaluate(lookup) is True

    def matches_headers(
        self, headers: Mapping[str, str], extra: Mapping[str, object] | None = None
    ) -> bool:
        """Match against STOMP headers (strings), with `extra` (e.g. JMS header fields) first."""
        if extra is None:
            return self._evaluate(headers.get) is True
        extra_get, headers_get = extra.get, headers.get

        def lookup(name: str) -> object:
            v = extra_get(name)
            return headers_get(name) if v is None else v

        return self._evaluate(lookup) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str, *, max_length: int = MAX_SELECTOR_LENGTH) -> Selector:
    """Parse and compile a selector; raise `SelectorError` for bad syntax, types or size."""
    if len(text) > max_length:
        raise SelectorError(f"longer than max_length={max_length} characters ({len(text)})")
    tokens = _tokenize(text)
    if tokens[0].kind is _Tok.END:
        raise SelectorError("empty selector")
    tree = _Parser(tokens).parse()
    identifiers = frozenset(_identifiers(tree))
    tree = _fold(tree)
    return Selector(text, _generate_condition(tree), identifiers)
