"""Selector evaluation: the value rules, three-valued logic, and the tree compiled to closures.

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

Closures are built once per selector; subtrees made only of literals are folded to their value
first.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from typing import Final, TypeAlias

from sluice.core.selector.parser import (
    _Arith,
    _Between,
    _children,
    _Compare,
    _Ident,
    _IsNull,
    _Kind,
    _kind,
    _Lit,
    _Logic,
    _Node,
    _Not,
    _StringTest,
    _Unary,
)

PropertyLookup: TypeAlias = Callable[[str], object]
"""Returns the value of a property or JMS header field, or None when the message lacks it."""

_Fn: TypeAlias = Callable[[PropertyLookup], object]

_MIN_LONG: Final = -(2**63)
_MAX_LONG: Final = 2**63 - 1
_MAX_NUMERIC_TEXT: Final = 64  # longer strings are never read as numbers: bounded parse work


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
