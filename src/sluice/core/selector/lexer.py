"""Selector text to tokens: quoted strings, Java numeric literals, identifiers, keywords, operators.

String literals are in single quotes (`''` for a quote). Exact numerics are decimal, `0x` hex or
leading-`0` octal with an optional `L` suffix, in 64-bit range; approximate numerics look like
`1.5`, `.5` or `7e3`. Identifiers follow Java rules and are case-sensitive; keywords are ASCII and
case-insensitive. Positions count characters from 0.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from sluice.core.selector.errors import SelectorError


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
    """The tokens of a selector: one loop over the characters with a branch per token class
    (numbers, strings, identifiers, operators), as a hand-written lexer reads best."""
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
