"""LIKE patterns, compiled once into matchers.

`LIKE` patterns are turned into regular expressions once, at compile time, but one per stretch
between `%` signs rather than one for the whole pattern: a single `.*?a.*?b` style regex backtracks
quadratically on long header values, while placing each fixed-length stretch at its leftmost
place needs no backtracking and gives the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sluice.core.selector.errors import SelectorError


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
