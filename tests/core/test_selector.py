"""JMS selectors: grammar, three-valued logic, the string/number rules, errors and limits.

The property tests build random typed expression trees, render them to selector text, and check
the compiled selector against a direct evaluation of the same tree written here from the rules in
the module docstring.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.core.selector import (
    JMS_HEADER_IDENTIFIERS,
    MAX_SELECTOR_DEPTH,
    MAX_SELECTOR_LENGTH,
    Selector,
    SelectorError,
    compile_selector,
)
from sluice.errors import SluiceError


def matches(selector: str, **props: object) -> bool:
    """Compile `selector` and match it against `props` (a missing name is NULL)."""
    return compile_selector(selector).matches(props.get)


def truth(selector: str, **props: object) -> bool | None:
    """The selector's three-valued result: TRUE, FALSE, or None for UNKNOWN."""
    if matches(selector, **props):
        return True
    if matches(f"NOT ({selector})", **props):
        return False
    return None


# ---------------------------------------------------------------------------------------------
# Literals and identifiers


@pytest.mark.parametrize(
    ("selector", "props", "expected"),
    [
        ("s = 'abc'", {"s": "abc"}, True),
        ("s = 'it''s'", {"s": "it's"}, True),
        ("s = ''''", {"s": "'"}, True),
        ("s = ''", {"s": ""}, True),
        ("n = 57", {"n": 57}, True),
        ("n = 57L", {"n": 57}, True),
        ("n = 57l", {"n": 57}, True),
        ("n = 0x1F", {"n": 31}, True),
        ("n = 0X1fL", {"n": 31}, True),
        ("n = 017", {"n": 15}, True),
        ("n = 0", {"n": 0}, True),
        ("n = 9223372036854775807", {"n": 2**63 - 1}, True),
        ("n = -9223372036854775808", {"n": -(2**63)}, True),
        ("f = 1.5e3", {"f": 1500.0}, True),
        ("f = 1500", {"f": 1500.0}, True),
        ("f = 7E3", {"f": 7000}, True),
        ("f = 7.", {"f": 7.0}, True),
        ("f = .5", {"f": 0.5}, True),
        ("f = -57.9E2", {"f": -5790.0}, True),
        ("f = 1e-3", {"f": 0.001}, True),
        ("b = TRUE", {"b": True}, True),
        ("b = true", {"b": True}, True),
        ("b = False", {"b": False}, True),
        ("TRUE", {}, True),
        ("FALSE", {}, False),
        ("$x_1 = 1", {"$x_1": 1}, True),
        ("_ = 1", {"_": 1}, True),
        ("prix€ = 1", {"prix€": 1}, True),
        ("größe = 1", {"größe": 1}, True),
        ("JMSPriority > 5", {"JMSPriority": 7}, True),
        # Identifiers are case-sensitive; keywords are not.
        ("Color = 'red'", {"color": "red"}, False),
        ("color = 'red' aNd NoT (size Is nUlL)", {"color": "red", "size": "L"}, True),
        # Whitespace of every JMS kind separates tokens.
        ("\ta\n=\r1\f", {"a": 1}, True),
        ("a=1AND b=2", {"a": 1, "b": 2}, None),  # `1AND` is a malformed number
    ],
)
def test_literals_and_identifiers(
    selector: str, props: dict[str, object], expected: object
) -> None:
    if expected is None:
        with pytest.raises(SelectorError, match="malformed number"):
            compile_selector(selector)
    else:
        assert matches(selector, **props) is expected


def test_keyword_like_non_ascii_name_is_an_identifier() -> None:
    name = "\u0131n"  # dotless i: its upper case is "IN", yet it must stay a property name
    assert name.upper() == "IN"
    assert compile_selector(f"{name} = 1").matches({name: 1}.get)


# ---------------------------------------------------------------------------------------------
# Comparison and arithmetic


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("n = 5", True),
        ("n <> 5", False),
        ("n <> 4", True),
        ("n > 4", True),
        ("n > 5", False),
        ("n >= 5", True),
        ("n >= 6", False),
        ("n < 6", True),
        ("n < 5", False),
        ("n <= 5", True),
        ("n <= 4", False),
        ("4 < n", True),
        ("5 <= n", True),
        ("6 > n", True),
        ("n + 1 = 6", True),
        ("n - 1 = 4", True),
        ("n * 2 = 10", True),
        ("n / 2 = 2.5", True),  # `/` divides in floating point
        ("-n = -5", True),
        ("+n = 5", True),
        ("- -n = 5", True),
        ("n * 2 + 1 = 11", True),
        ("1 + n * 2 = 11", True),
        ("(1 + n) * 2 = 12", True),
        ("n - 2 - 1 = 2", True),  # left-associative
        ("n / 5 / 2 = 0.5", True),
        ("n * -1 = -5", True),
        ("2 * 3 = 6", True),
        ("n / 0 > 1000000", True),
        ("-n / 0 < -1000000", True),
        ("n - 5 = 0 AND (n - 5) / 0 <> (n - 5) / 0", True),  # 0/0 is NaN, unequal to itself
        ("n * 9223372036854775807 > 9223372036854775807", True),  # no 64-bit wrap
        ("-9223372036854775808 * 2 < -9223372036854775808", True),
    ],
)
def test_numeric_comparisons_and_arithmetic(selector: str, expected: bool) -> None:
    assert matches(selector, n=5) is expected


@pytest.mark.parametrize(
    ("selector", "props", "expected"),
    [
        # Two strings compare as strings.
        ("s = 'abc'", {"s": "abc"}, True),
        ("s = 'ABC'", {"s": "abc"}, False),
        ("s <> 'abc'", {"s": "abd"}, True),
        ("s = '1'", {"s": "1.0"}, False),
        ("s = t", {"s": "1", "t": "01"}, False),
        # A string meets a number: read as a number when it looks like one.
        ("s = 5", {"s": "5"}, True),
        ("s = 5", {"s": "05"}, True),
        ("s = 5", {"s": "5.0"}, True),
        ("s = 5", {"s": "+5"}, True),
        ("s = -5", {"s": "-5"}, True),
        ("s = 5", {"s": " 5"}, False),
        ("s = 5", {"s": "5x"}, False),
        ("s = 5", {"s": "0x5"}, False),
        ("s <> 5", {"s": "five"}, True),
        ("s = 1000", {"s": "1e3"}, True),
        ("s = 0.5", {"s": ".5"}, True),
        ("s > 2", {"s": "2.5"}, True),
        ("s > 100", {"s": "99"}, False),
        ("s > 100", {"s": "abc"}, False),
        ("s < 100", {"s": "abc"}, False),
        ("s > 1", {"s": "9" * 100}, False),  # too long to be read as a number
        ("s < t", {"s": "9", "t": "10"}, True),  # numerically, not "9" > "10" as text
        ("s < t", {"s": "a", "t": "b"}, False),  # strings do not order
        ("s + 1 = 3", {"s": "2"}, True),
        ("s * t = 6", {"s": "2", "t": "3.0"}, True),
        ("s BETWEEN 1 AND 3", {"s": "2"}, True),
        ("n = '5'", {"n": 5}, True),
        ("'5' = n", {"n": 5}, True),
        ("'5' = 5", {}, True),
        # Strings and booleans.
        ("s = TRUE", {"s": "true"}, True),
        ("s = TRUE", {"s": "TRUE"}, True),
        ("s = FALSE", {"s": "False"}, True),
        ("s = TRUE", {"s": "yes"}, False),
        ("s <> TRUE", {"s": "yes"}, True),
        ("b = 'true'", {"b": True}, True),
        ("b = 1", {"b": True}, False),
        ("b = TRUE", {"b": 1}, False),
        # Ints and floats are one numeric type.
        ("n = 5.0", {"n": 5}, True),
        ("f = 5", {"f": 5.0}, True),
        ("n < f", {"n": 5, "f": 5.5}, True),
        # Values of other types are never equal to anything and never order.
        ("x = 'b'", {"x": b"b"}, False),
        ("x = y", {"x": b"b", "y": b"b"}, False),
        ("x > 1", {"x": b"2"}, False),
        ("x = 1", {"x": [1]}, False),
    ],
)
def test_string_number_rules(selector: str, props: dict[str, object], expected: bool) -> None:
    assert matches(selector, **props) is expected


def test_jms_headers_through_extra() -> None:
    sel = compile_selector(
        "JMSPriority > 5 AND JMSDeliveryMode = 'PERSISTENT' AND NOT JMSRedelivered"
        " AND JMSType = 'order' AND JMSTimestamp >= 1000 AND JMSCorrelationID LIKE 'c-%'"
    )
    extra: dict[str, object] = {
        "JMSPriority": 7,
        "JMSDeliveryMode": "PERSISTENT",
        "JMSRedelivered": False,
        "JMSType": "order",
        "JMSTimestamp": 1234,
        "JMSCorrelationID": "c-42",
    }
    assert sel.matches_headers({}, extra)
    assert not sel.matches_headers({}, {**extra, "JMSPriority": 4})
    assert not sel.matches_headers({}, {**extra, "JMSRedelivered": True})
    assert not sel.matches_headers({"JMSPriority": "9"}, {})
    assert sel.identifiers <= JMS_HEADER_IDENTIFIERS


def test_matches_headers_prefers_extra_and_falls_back_to_headers() -> None:
    sel = compile_selector("priority > 5 AND region = 'eu'")
    assert sel.matches_headers({"priority": "7", "region": "eu"})
    assert not sel.matches_headers({"priority": "3", "region": "eu"})
    assert sel.matches_headers({"priority": "3", "region": "eu"}, {"priority": 9})
    assert not sel.matches_headers({"priority": "9"}, {"other": 1})


# ---------------------------------------------------------------------------------------------
# Three-valued logic


_T, _F, _U = "TRUE", "FALSE", "u = 1"  # `u` is never set, so `u = 1` is UNKNOWN
_VALUE = {_T: True, _F: False, _U: None}


@pytest.mark.parametrize("a", [_T, _F, _U])
@pytest.mark.parametrize("b", [_T, _F, _U])
def test_and_or_truth_tables(a: str, b: str) -> None:
    x, y = _VALUE[a], _VALUE[b]
    if x is False or y is False:
        expected_and: bool | None = False
    elif x is None or y is None:
        expected_and = None
    else:
        expected_and = True
    if x is True or y is True:
        expected_or: bool | None = True
    elif x is None or y is None:
        expected_or = None
    else:
        expected_or = False
    assert truth(f"({a}) AND ({b})") is expected_and
    assert truth(f"({a}) OR ({b})") is expected_or


@pytest.mark.parametrize(("a", "expected"), [(_T, False), (_F, True), (_U, None)])
def test_not_truth_table(a: str, expected: bool | None) -> None:
    assert truth(f"NOT ({a})") is expected


def test_missing_property_is_unknown_everywhere() -> None:
    for selector in [
        "x = 1",
        "x <> 1",
        "x > 1",
        "x + 1 = 2",
        "-x = 1",
        "x BETWEEN 1 AND 2",
        "x NOT BETWEEN 1 AND 2",
        "1 BETWEEN x AND 2",
        "x IN ('a')",
        "x NOT IN ('a')",
        "x LIKE 'a%'",
        "x NOT LIKE 'a%'",
        "x",
        "x = y",
    ]:
        assert truth(selector) is None, selector
        assert truth(selector, y=1) is None, selector
    assert not matches("NOT (x = 1)")
    assert truth("x IS NULL") is True
    assert truth("x IS NOT NULL") is False
    assert truth("x IS NULL", x="") is False


def test_long_chains_mix_unknown_true_and_false() -> None:
    chain_and = " AND ".join(["a = 1"] * 300 + ["u = 1"])
    chain_or = " OR ".join(["a = 2"] * 300 + ["u = 1"])
    assert truth(chain_and, a=1) is None
    assert truth(chain_and + " AND a = 2", a=1) is False
    assert truth(chain_or, a=1) is None
    assert truth(chain_or + " OR a = 1", a=1) is True


def test_property_used_as_condition() -> None:
    assert truth("flag", flag=True) is True
    assert truth("flag", flag="true") is True
    assert truth("flag", flag="TRUE") is True
    assert truth("flag", flag=False) is False
    assert truth("flag", flag="false") is False
    assert truth("flag", flag="yes") is False
    assert truth("flag", flag=1) is False
    assert truth("flag") is None
    assert truth("flag AND n = 1", flag="true", n=1) is True
    assert truth("NOT flag", flag="false") is True


# ---------------------------------------------------------------------------------------------
# Precedence


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        # NOT binds tighter than AND, AND tighter than OR.
        ("TRUE OR TRUE AND FALSE", True),
        ("(TRUE OR TRUE) AND FALSE", False),
        ("FALSE AND FALSE OR TRUE", True),
        ("FALSE AND (FALSE OR TRUE)", False),
        ("NOT FALSE AND FALSE", False),
        ("NOT (FALSE AND FALSE)", True),
        ("NOT TRUE OR TRUE", True),
        ("NOT (TRUE OR TRUE)", False),
        ("NOT NOT TRUE", True),
        ("NOT a = 2", True),  # NOT (a = 2): comparison binds tighter than NOT
        ("NOT a = 1 OR a = 1", True),
        ("a = 1 AND NOT a = 2", True),
        ("a + 1 * 2 = 3", True),
        ("(a + 1) * 2 = 4", True),
        ("-a * 2 = -2", True),
        ("a - -1 = 2", True),
        ("a BETWEEN 0 AND 2 AND a = 1", True),
        ("a BETWEEN 0 AND 2 OR FALSE", True),
        ("a NOT BETWEEN 0 AND 2 OR TRUE", True),
        ("a + 1 BETWEEN 1 + 1 AND 2 * 1", True),
        ("s IN ('x') OR s LIKE 'y%' AND s IS NOT NULL", True),
    ],
)
def test_precedence(selector: str, expected: bool) -> None:
    assert matches(selector, a=1, s="x") is expected


# ---------------------------------------------------------------------------------------------
# BETWEEN, IN, LIKE, IS NULL


@pytest.mark.parametrize(
    ("value", "between", "not_between"),
    [
        (0, False, True),
        (1, True, False),
        (2, True, False),
        (3, True, False),
        (4, False, True),
        (0.999, False, True),
        (3.0, True, False),
        ("3", True, False),
        ("abc", False, False),  # no order at all: both sides are FALSE, as `x < 1 OR x > 3`
    ],
)
def test_between_boundaries(value: object, between: bool, not_between: bool) -> None:
    assert matches("x BETWEEN 1 AND 3", x=value) is between
    assert matches("x NOT BETWEEN 1 AND 3", x=value) is not_between


def test_between_with_unknown_bound() -> None:
    assert truth("x BETWEEN lo AND 3", x=5) is False  # FALSE AND UNKNOWN
    assert truth("x BETWEEN lo AND 3", x=2) is None
    assert truth("x NOT BETWEEN lo AND 3", x=5) is True  # UNKNOWN OR TRUE
    assert truth("x BETWEEN 3 AND 1", x=2) is False


def test_in() -> None:
    assert matches("c IN ('UK', 'US', 'FR')", c="US")
    assert not matches("c IN ('UK', 'US', 'FR')", c="DE")
    assert matches("c NOT IN ('UK', 'US', 'FR')", c="DE")
    assert not matches("c NOT IN ('UK', 'US', 'FR')", c="UK")
    assert matches("c IN ('it''s')", c="it's")
    assert not matches("c IN ('us')", c="US")
    many = ", ".join(f"'v{i}'" for i in range(500))
    assert matches(f"c IN ({many})", c="v499")
    assert not matches(f"c IN ({many})", c="v500")
    # IN takes strings: a number value is not a member (and so is NOT IN).
    assert truth("c IN ('5')", c=5) is False
    assert truth("c NOT IN ('5')", c=5) is True


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("'12%3'", "123", True),
        ("'12%3'", "12993", True),
        ("'12%3'", "1234", False),
        ("'l_se'", "lose", True),
        ("'l_se'", "loose", False),
        ("'%'", "", True),
        ("'%'", "anything\nat all", True),
        ("''", "", True),
        ("''", "a", False),
        ("'_'", "", False),
        ("'_'", "\n", True),
        ("'a%'", "abc", True),
        ("'%c'", "abc", True),
        ("'%b%'", "abc", True),
        ("'%x%'", "abc", False),
        ("'a%b%c'", "abc", True),
        ("'a%b%c'", "acb", False),
        ("'a%b%b%c'", "abbc", True),
        ("'a%b%b%c'", "abc", False),
        ("'%a_c%'", "xxabcxx", True),
        ("'%a_c%'", "xxacxx", False),
        ("'_%_'", "a", False),
        ("'_%_'", "ab", True),
        ("'ab%ba'", "aba", False),  # prefix and suffix may not overlap
        ("'%b%b'", "xb", False),  # nor a middle stretch and the suffix
        ("'%b%b'", "bb", True),
        ("'%b_%_b'", "xbyb", False),
        ("'%b_%_b'", "xbyyb", True),
        ("'ab%ba'", "abba", True),
        ("'%%%'", "x", True),
        # Regex metacharacters are ordinary characters.
        ("'a.c'", "abc", False),
        ("'a.c'", "a.c", True),
        ("'(x)*[y]+{2}|^$\\'", "(x)*[y]+{2}|^$\\", True),
        ("'%.*%'", "a.*b", True),
        ("'%.*%'", "ab", False),
        ("'a?c'", "ac", False),
        # Case matters.
        ("'ABC'", "abc", False),
    ],
)
def test_like(pattern: str, value: str, expected: bool) -> None:
    assert matches(f"s LIKE {pattern}", s=value) is expected
    assert matches(f"s NOT LIKE {pattern}", s=value) is not expected


@pytest.mark.parametrize(
    ("pattern", "escape", "value", "expected"),
    [
        ("'\\_%'", "'\\'", "_foo", True),
        ("'\\_%'", "'\\'", "xfoo", False),
        ("'100!%'", "'!'", "100%", True),
        ("'100!%'", "'!'", "1000", False),
        ("'a!!b'", "'!'", "a!b", True),
        ("'%!_%'", "'!'", "a_b", True),
        ("'%!_%'", "'!'", "ab", False),
        ("'x%%'", "'%'", "x%", True),  # the escape may itself be a wildcard character
        ("'x%%'", "'%'", "xy", False),
        ("'a''b'", "''''", "a'b", False),  # '' is the escape; a lone quote escapes nothing
    ],
)
def test_like_escape(pattern: str, escape: str, value: str, expected: bool) -> None:
    selector = f"s LIKE {pattern} ESCAPE {escape}"
    if pattern == "'a''b'":
        with pytest.raises(SelectorError, match="escape"):
            compile_selector(selector)
        return
    assert matches(selector, s=value) is expected


def test_like_on_non_string_is_false() -> None:
    assert truth("s LIKE '5'", s=5) is False
    assert truth("s NOT LIKE '5'", s=5) is True


def test_like_is_linear_on_hostile_input() -> None:
    # A single backtracking regex would take ~n**2 steps here.
    sel = compile_selector("s LIKE '%a%a%a%a%a%a%b'")
    value = "a" * 200_000
    assert not sel.matches({"s": value}.get)
    assert sel.matches({"s": value + "b"}.get)


def test_is_null() -> None:
    assert matches("x IS NULL")
    assert not matches("x IS NULL", x="v")
    assert matches("x IS NOT NULL", x="")
    assert not matches("x IS NOT NULL")
    assert matches("x is not null and x = 0", x=0)


# ---------------------------------------------------------------------------------------------
# Errors, limits and robustness


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("(a = 1))", "selector: unexpected token ')' at position 7"),
        ("a = 1 AND (b = 2))", "selector: unexpected token ')' at position 17"),
        ("a = ", "selector: unexpected end of selector at position 4"),
        ("a = 'abc", "selector: unterminated string literal at position 4"),
        ("a = 1 # 2", "selector: unexpected character '#' at position 6"),
        ("a != 1", "selector: unexpected character '!' at position 2"),
        ("a = 08", "selector: malformed number '08' at position 4"),
        ("a = 1.2.3", "selector: malformed number '1.2.' at position 4"),
        ("a = 0x", "selector: malformed number '0x' at position 4"),
        ("a = 9223372036854775809", "out of 64-bit range at position 4"),
        ("a = 1 = 2", "selector: unexpected token '=' at position 6"),
        ("a < b < c", "selector: unexpected token '<' at position 6"),
        ("a = NOT b", "selector: unexpected token 'NOT' at position 4"),
        ("a NOT = 1", "selector: unexpected token 'NOT' at position 2"),
        ("a IS NOT 1", "selector: unexpected token '1' at position 9"),
        ("a = NULL", "selector: unexpected token 'NULL' at position 4"),
        ("NULL IS NULL", "selector: unexpected token 'NULL' at position 0"),
        ("and = 1", "selector: unexpected token 'AND' at position 0"),
        ("a BETWEEN 1 OR 2", "selector: unexpected token 'OR' at position 12"),
        ("a IN ()", "selector: unexpected token ')' at position 6"),
        ("a IN ('x',)", "selector: unexpected token ')' at position 10"),
        ("a IN (1, 2)", "selector: unexpected token '1' at position 6"),
        ("a IN 'x'", "selector: unexpected token \"'x'\" at position 5"),
        ("a LIKE b", "selector: unexpected token 'b' at position 7"),
        ("a LIKE 'x' ESCAPE 'ab'", "ESCAPE needs exactly one character at position 18"),
        ("a LIKE 'x!' ESCAPE '!'", "escape '!' must precede '%', '_' or itself at position 7"),
        ("1 IN ('a')", "IN needs a property name on its left at position 0"),
        ("a + 1 LIKE 'x'", "LIKE needs a property name on its left at position 0"),
        ("'x' IS NULL", "IS needs a property name on its left at position 0"),
        ("1", "expected a condition, found a number at position 0"),
        ("'x'", "expected a condition, found a string at position 0"),
        ("a = 1 AND 2", "expected a condition, found a number at position 10"),
        ("NOT 'x'", "expected a condition, found a string at position 4"),
        ("a + 'x' = 1", "'+' needs numbers, found a string at position 4"),
        ("-'x' = 1", "'unary -' needs numbers, found a string at position 1"),
        ("a + TRUE = 1", "'+' needs numbers, found a condition at position 4"),
        ("a + (b = 1) = 1", "'+' needs numbers, found a condition at position 5"),
        ("a > 'x'", "'>' needs numbers, found a string at position 4"),
        ("TRUE <= a", "'<=' needs numbers, found a condition at position 0"),
        ("a BETWEEN 'a' AND 'z'", "'BETWEEN' needs numbers, found a string at position 10"),
        ("", "selector: empty selector"),
        ("   \t ", "selector: empty selector"),
        ("()", "selector: unexpected token ')' at position 1"),
        ("a = 1 AND", "selector: unexpected end of selector at position 9"),
    ],
)
def test_errors_say_what_and_where(selector: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector(selector)
    assert message in str(info.value)
    assert isinstance(info.value, SluiceError)


def test_error_position_attribute() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector("a = 1 AND (b = 2))")
    assert info.value.position == 17
    assert info.value.reason == "unexpected token ')'"


def test_length_limit() -> None:
    text = "a = '" + "x" * (MAX_SELECTOR_LENGTH - 6) + "'"
    assert len(text) == MAX_SELECTOR_LENGTH
    compile_selector(text)
    with pytest.raises(SelectorError, match=r"longer than max_length=4096 characters \(4097\)"):
        compile_selector(text + " ")
    with pytest.raises(SelectorError, match="max_length=10"):
        compile_selector("a = 'abcdef'", max_length=10)
    assert compile_selector("a = 1", max_length=5).text == "a = 1"


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "(" * n + "a = 1" + ")" * n,
        lambda n: "NOT " * n + "a = 1",
        lambda n: "-" * n + "a = 1",
        lambda n: "a = " + " + ".join(["1"] * n),
        lambda n: "a = " + "(1 + " * n + "1" + ")" * n,
        lambda n: "a = 1 OR (" * n + "a = 1" + ")" * n,
    ],
)
def test_depth_limit(make: Callable[[int], str]) -> None:
    compile_selector(make(MAX_SELECTOR_DEPTH // 2 - 2))
    for n in (MAX_SELECTOR_DEPTH + 1, 5000):
        text = make(n)
        with pytest.raises(SelectorError, match=f"MAX_SELECTOR_DEPTH={MAX_SELECTOR_DEPTH}"):
            compile_selector(text, max_length=len(text))


def test_deepest_allowed_selector_evaluates() -> None:
    text = "(" * (MAX_SELECTOR_DEPTH - 2) + "a = 1" + ")" * (MAX_SELECTOR_DEPTH - 2)
    assert compile_selector(text).matches({"a": "1"}.get)
    text = "NOT " * (MAX_SELECTOR_DEPTH - 2) + "a = 1"
    assert compile_selector(text).matches({"a": 1}.get)  # an even count of NOTs


def test_wide_selector_is_not_deep() -> None:
    clauses = " AND ".join(f"p{i} IS NULL" for i in range(200))
    assert len(clauses) < MAX_SELECTOR_LENGTH
    assert compile_selector(clauses).matches({}.get)


def test_selector_object() -> None:
    sel = compile_selector("a = 1 AND b LIKE 'x%' AND c IN ('y') AND d IS NULL AND e + f > 1")
    assert isinstance(sel, Selector)
    assert sel.text == "a = 1 AND b LIKE 'x%' AND c IN ('y') AND d IS NULL AND e + f > 1"
    assert sel.identifiers == frozenset("abcdef")
    assert repr(sel) == f"Selector({sel.text!r})"
    assert compile_selector("1 + 2 = 3").identifiers == frozenset()


def test_constant_selectors_fold() -> None:
    assert matches("1 + 2 = 3")
    assert not matches("1 + 2 = 4")
    assert matches("NOT (1 > 2)")
    assert matches("2 BETWEEN 1 AND 3")
    assert matches("'a' = 'a' AND TRUE")


class _Odd:
    """A value of no selector type, whose comparisons would explode if ever attempted."""

    def __eq__(self, other: object) -> bool:
        raise AssertionError("compared")

    __hash__ = object.__hash__


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("x = 1", False),
        ("x = 'a'", False),
        ("x = TRUE", False),
        ("x > 1", False),
        ("x + 1 > 1", None),  # arithmetic on a non-number has no value
        ("-x < 0", None),
        ("x BETWEEN 1 AND 2", False),
        ("x IN ('a')", False),
        ("x LIKE 'a%'", False),
        ("x", False),
        ("NOT x", True),
        ("x = y", False),
    ],
)
def test_odd_values_never_raise(selector: str, expected: bool | None) -> None:
    sel = compile_selector(selector)
    negated = compile_selector(f"NOT ({selector})")
    for value in (_Odd(), b"1", [1], {"a": 1}, object()):
        # Values of no selector type are unlike everything; `_Odd` fails if ever compared.
        props = {"x": value, "y": _Odd()}
        assert sel.matches(props.get) is (expected is True)
        assert negated.matches(props.get) is (expected is False)
    for value in (float("nan"), float("inf"), -(10**400), 10**400, 2**63):
        assert sel.matches({"x": value, "y": value}.get) in (True, False)


# ---------------------------------------------------------------------------------------------
# Property tests: random typed trees against a direct evaluation


@dataclass(frozen=True)
class Tree:
    """A selector expression: `op` names the construct, `args` its operands."""

    op: str
    args: tuple[Any, ...]


_NAMES = ["a", "b", "s", "flag"]
# Every string a test can produce, with its numeric reading under the module's rules.
_NUMERIC_READING: dict[str, int | float | None] = {
    "5": 5,
    "-3": -3,
    "+4": 4,
    "007": 7,
    "2.5": 2.5,
    ".5": 0.5,
    "1e3": 1000.0,
    "abc": None,
    "": None,
    "5x": None,
    " 5": None,
    "0x10": None,
    "true": None,
    "FALSE": None,
    "it's": None,
    "a%c": None,
    "a_c": None,
}
_STRINGS = sorted(_NUMERIC_READING)
_VALUES = st.one_of(
    st.none(),
    st.sampled_from(_STRINGS),
    st.integers(-10, 10),
    st.sampled_from([0.5, -2.5, 3.0, 1e20]),
    st.booleans(),
)
_MAX_LONG = 2**63 - 1


def _number(v: object) -> int | float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return v
    if isinstance(v, str):
        return _NUMERIC_READING[v]
    return None


def _as_bool(v: str) -> bool | None:
    return {"true": True, "false": False}.get(v.lower())


def _fit(n: int | float) -> int | float:
    return float(n) if isinstance(n, int) and not -_MAX_LONG - 1 <= n <= _MAX_LONG else n


def _ref(t: Tree, props: dict[str, object]) -> object:
    """Direct evaluation: None is NULL/UNKNOWN."""
    op, args = t.op, t.args
    if op == "lit":
        return args[0]
    if op == "id":
        return props.get(args[0])
    if op in ("neg", "pos"):
        v = _number(_ref(args[0], props))
        if v is None:
            return None
        return _fit(-v) if op == "neg" else v
    if op in "+-*/":
        x, y = _number(_ref(args[0], props)), _number(_ref(args[1], props))
        if x is None or y is None:
            return None
        if op == "/":
            if y == 0:
                if x == 0 or math.isnan(x):
                    return math.nan
                return math.copysign(math.inf, x) * math.copysign(1, y)
            return float(x) / float(y)
        return _fit({"+": x + y, "-": x - y, "*": x * y}[op])
    if op in ("=", "<>"):
        x, y = _ref(args[0], props), _ref(args[1], props)
        if x is None or y is None:
            return None
        return _ref_equal(x, y) != (op == "<>")
    if op in ("<", "<=", ">", ">="):
        return _ref_order(op, _ref(args[0], props), _ref(args[1], props))
    if op in ("between", "not between"):
        v, lo, hi = (_ref(a, props) for a in args)
        if op == "between":
            return _ref_and(_ref_order(">=", v, lo), _ref_order("<=", v, hi))
        return _ref_or(_ref_order("<", v, lo), _ref_order(">", v, hi))
    if op == "in":
        name, values, negated = args
        v = props.get(name)
        if v is None:
            return None
        return (isinstance(v, str) and v in values) != negated
    if op == "like":
        name, elements, _escape, negated = args
        v = props.get(name)
        if v is None:
            return None
        return (isinstance(v, str) and _ref_like(elements, v)) != negated
    if op == "is null":
        return (props.get(args[0]) is None) != args[1]
    if op == "not":
        v = _ref_truth(_ref(args[0], props))
        return None if v is None else not v
    if op == "and":
        return _ref_and(_ref_truth(_ref(args[0], props)), _ref_truth(_ref(args[1], props)))
    if op == "or":
        return _ref_or(_ref_truth(_ref(args[0], props)), _ref_truth(_ref(args[1], props)))
    if op == "cond":
        return _ref_truth(_ref(args[0], props))
    raise AssertionError(op)


def _ref_equal(x: object, y: object) -> bool:
    if type(x) is type(y):
        return x == y
    if isinstance(x, bool) or isinstance(y, bool):
        b, other = (x, y) if isinstance(x, bool) else (y, x)
        return isinstance(other, str) and _as_bool(other) is b
    nx, ny = _number(x), _number(y)
    return nx is not None and ny is not None and nx == ny


def _ref_order(op: str, x: object, y: object) -> bool | None:
    if x is None or y is None:
        return None
    nx, ny = _number(x), _number(y)
    if nx is None or ny is None:
        return False
    return {"<": nx < ny, "<=": nx <= ny, ">": nx > ny, ">=": nx >= ny}[op]


def _ref_truth(v: object) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    return isinstance(v, str) and _as_bool(v) is True


def _ref_and(x: bool | None, y: bool | None) -> bool | None:
    if x is False or y is False:
        return False
    return None if x is None or y is None else True


def _ref_or(x: bool | None, y: bool | None) -> bool | None:
    if x is True or y is True:
        return True
    return None if x is None or y is None else False


def _ref_like(elements: tuple[str, ...], value: str) -> bool:
    """Dynamic programming over pattern elements: 'ANY' (%), 'ONE' (_) or one literal char."""
    reachable = {0}
    for e in elements:
        if e == "ANY":
            reachable = set(range(min(reachable), len(value) + 1)) if reachable else set()
        elif e == "ONE":
            reachable = {i + 1 for i in reachable if i < len(value)}
        else:
            reachable = {i + 1 for i in reachable if i < len(value) and value[i] == e}
    return len(value) in reachable


# Rendering. Precedence: OR 1, AND 2, NOT 3, predicates 4, + - 5, * / 6, unary 7, atoms 8.
_PREC = {"or": 1, "and": 2, "not": 3, "+": 5, "-": 5, "*": 6, "/": 6, "neg": 7, "pos": 7}


def _prec(t: Tree) -> int:
    if t.op in ("lit", "id", "cond"):
        return 8
    return _PREC.get(t.op, 4)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _render(t: Tree, full: bool, kw: Callable[[str], str]) -> str:
    def sub(child: Tree, min_prec: int) -> str:
        text = _render(child, full, kw)
        if (full and child.op not in ("lit", "id")) or _prec(child) < min_prec:
            return f"({text})"
        return text

    op, args = t.op, t.args
    if op == "lit":
        v = args[0]
        if isinstance(v, bool):
            return kw("TRUE" if v else "FALSE")
        if isinstance(v, str):
            return _quote(v)
        return repr(v)
    if op in ("id", "cond"):
        return args[0] if op == "id" else _render(args[0], full, kw)
    if op in ("neg", "pos"):
        return ("-" if op == "neg" else "+") + " " + sub(args[0], 7)
    if op in "+-*/":
        return f"{sub(args[0], 5 if op in '+-' else 6)} {op} {sub(args[1], _PREC[op] + 1)}"
    if op in ("=", "<>", "<", "<=", ">", ">="):
        return f"{sub(args[0], 5)} {op} {sub(args[1], 5)}"
    if op in ("between", "not between"):
        word = kw("NOT BETWEEN" if op == "not between" else "BETWEEN")
        v, lo, hi = (sub(a, 5) for a in args)
        return f"{v} {word} {lo} {kw('AND')} {hi}"
    if op == "in":
        name, values, negated = args
        listed = ", ".join(_quote(v) for v in values)
        return f"{name} {kw('NOT IN' if negated else 'IN')} ({listed})"
    if op == "like":
        name, elements, escape, negated = args
        pattern = ""
        for e in elements:
            if e == "ANY":
                pattern += "%"
            elif e == "ONE":
                pattern += "_"
            elif e in ("%", "_", escape):
                assert escape is not None
                pattern += escape + e
            else:
                pattern += e
        text = f"{name} {kw('NOT LIKE' if negated else 'LIKE')} {_quote(pattern)}"
        return text + (f" {kw('ESCAPE')} {_quote(escape)}" if escape is not None else "")
    if op == "is null":
        return f"{args[0]} {kw('IS NOT NULL' if args[1] else 'IS NULL')}"
    if op == "not":
        return f"{kw('NOT')} {sub(args[0], 3)}"
    if op in ("and", "or"):
        p = _PREC[op]
        return f"{sub(args[0], p)} {kw(op.upper())} {sub(args[1], p)}"
    raise AssertionError(op)


def _numbers() -> st.SearchStrategy[Tree]:
    leaves = st.one_of(
        st.integers(0, 20).map(lambda n: Tree("lit", (n,))),
        st.sampled_from([0.5, 2.5, 1e3, 1.5e-3, 7.0]).map(lambda f: Tree("lit", (f,))),
        st.sampled_from(_NAMES).map(lambda n: Tree("id", (n,))),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(lambda op, x: Tree(op, (x,)), st.sampled_from(["neg", "pos"]), inner),
            st.builds(lambda op, x, y: Tree(op, (x, y)), st.sampled_from("+-*/"), inner, inner),
        ),
        max_leaves=4,
    )


def _operands() -> st.SearchStrategy[Tree]:
    return st.one_of(
        _numbers(),
        st.sampled_from(_STRINGS).map(lambda s: Tree("lit", (s,))),
        st.booleans().map(lambda b: Tree("lit", (b,))),
    )


_LIKE_ELEMENTS = st.lists(st.sampled_from(["ANY", "ONE", "a", "c", "%", "_", "!", "'", "."]))


def _like(name: str, elements: list[str], escape: str | None, negated: bool) -> Tree:
    if escape is None:
        elements = [e for e in elements if e not in ("%", "_")]
    return Tree("like", (name, tuple(elements), escape, negated))


def _conditions() -> st.SearchStrategy[Tree]:
    names = st.sampled_from(_NAMES)
    leaves = st.one_of(
        st.booleans().map(lambda b: Tree("lit", (b,))),
        names.map(lambda n: Tree("cond", (Tree("id", (n,)),))),
        st.builds(
            lambda op, x, y: Tree(op, (x, y)),
            st.sampled_from(["=", "<>"]),
            _operands(),
            _operands(),
        ),
        st.builds(
            lambda op, x, y: Tree(op, (x, y)),
            st.sampled_from(["<", "<=", ">", ">="]),
            _numbers(),
            _numbers(),
        ),
        st.builds(
            lambda op, v, lo, hi: Tree(op, (v, lo, hi)),
            st.sampled_from(["between", "not between"]),
            _numbers(),
            _numbers(),
            _numbers(),
        ),
        st.builds(
            lambda n, vs, neg: Tree("in", (n, tuple(vs), neg)),
            names,
            st.lists(st.sampled_from(_STRINGS), min_size=1, max_size=4),
            st.booleans(),
        ),
        st.builds(_like, names, _LIKE_ELEMENTS, st.sampled_from([None, "!", "\\"]), st.booleans()),
        st.builds(lambda n, neg: Tree("is null", (n, neg)), names, st.booleans()),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            inner.map(lambda c: Tree("not", (c,))),
            st.builds(
                lambda op, x, y: Tree(op, (x, y)), st.sampled_from(["and", "or"]), inner, inner
            ),
        ),
        max_leaves=6,
    )


_KEYWORD_CASES: list[Callable[[str], str]] = [str.upper, str.lower, str.title]


@settings(max_examples=600, deadline=None)
@given(
    tree=_conditions(),
    props=st.dictionaries(st.sampled_from(_NAMES), _VALUES),
    full=st.booleans(),
    kw=st.sampled_from(_KEYWORD_CASES),
)
def test_random_trees_match_direct_evaluation(
    tree: Tree, props: dict[str, object], full: bool, kw: Callable[[str], str]
) -> None:
    text = _render(tree, full, kw)
    expected = _ref_truth(_ref(tree, props))
    sel = compile_selector(text, max_length=100_000)
    assert sel.matches(props.get) is (expected is True), text
    negated = compile_selector(f"NOT ({text})", max_length=100_000)
    assert negated.matches(props.get) is (expected is False), text
    headers = {k: v for k, v in props.items() if isinstance(v, str)}
    extra = {k: v for k, v in props.items() if not isinstance(v, str)}
    assert sel.matches_headers(headers, extra) is (expected is True), text


_VOCABULARY = [
    "(", ")", "NOT", "AND", "OR", "a", "b", "'x'", "'%'", "''", "1", "2.5", "0x1F", "7L", "=",
    "<>", "<", ">=", "+", "-", "*", "/", "BETWEEN", "LIKE", "IN", "IS", "NULL", "ESCAPE", ",",
    "TRUE", "false", "'!'", "!", "'", ".", "\n", "1e", "€", "\u0131n",
]  # fmt: skip


@settings(max_examples=800, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=60),
        st.lists(st.sampled_from(_VOCABULARY), max_size=25).map(" ".join),
        st.lists(st.sampled_from(_VOCABULARY), max_size=25).map("".join),
    ),
    props=st.dictionaries(st.sampled_from(["a", "b"]), _VALUES),
)
def test_garbage_raises_only_selector_error(text: str, props: dict[str, object]) -> None:
    error: SelectorError | None = None
    try:
        sel = compile_selector(text)
    except SelectorError as exc:
        error = exc
    if error is not None:
        assert str(error).startswith("selector: ")
        assert error.position is None or 0 <= error.position <= len(text)
    else:
        assert sel.matches(props.get) in (True, False)


def test_reference_renderer_round_trips_a_known_tree() -> None:
    # Guard the guard: the renderer and evaluator above agree with a hand-written case.
    tree = Tree(
        "and",
        (
            Tree("not", (Tree("=", (Tree("id", ("a",)), Tree("lit", (1,)))),)),
            Tree("or", (Tree("lit", (True,)), Tree("is null", ("b", False)))),
        ),
    )
    assert _render(tree, False, str.upper) == "NOT a = 1 AND (TRUE OR b IS NULL)"
    assert _ref(tree, {"a": 2}) is True
    assert _ref(tree, {}) is None
    assert re.fullmatch(r"[()a-zA-Z0-9 =]+", _render(tree, True, str.lower))
