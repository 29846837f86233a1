"""ActiveMQ destination wildcards: match topic names against patterns, one at a time or indexed.

A name is a sequence of words separated by `.` (the part after `/topic/`, e.g.
`PRICE.STOCK.NASDAQ`). In a pattern, a word that is exactly `*` matches any one word, and a final
word that is exactly `>` matches the rest of the name: zero or more words. Zero, not one: ActiveMQ
Classic delivers a message published to `PRICE.STOCK` to a subscriber of `PRICE.STOCK.>` (both its
destination filter and its destination map say so), and users of ActiveMQ rely on it, so we do the
same. `>` on its own matches every name.

Only whole words are wildcards: `PRICE*` is an ordinary word. `>` anywhere but last is refused
(`WildcardError`) rather than given a meaning of its own. Empty words (`A..B`) are ordinary words.

`WildcardIndex` keeps many patterns in a trie over words, so a publish visits only the branches
that can match (one literal child and one `*` child per level) instead of testing every pattern.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from sluice.errors import SluiceError

__all__ = [
    "ANY_DESCENDANTS",
    "ANY_WORD",
    "SEPARATOR",
    "WildcardError",
    "WildcardIndex",
    "WildcardPattern",
    "compile_pattern",
    "is_wildcard",
]

SEPARATOR = "."
ANY_WORD = "*"
ANY_DESCENDANTS = ">"

T = TypeVar("T")


class WildcardError(SluiceError):
    """A destination pattern is malformed (`>` somewhere other than the last word)."""


def is_wildcard(name: str) -> bool:
    """Tell whether `name` has a `*` or `>` word, i.e. is a pattern rather than a destination."""
    if ANY_WORD not in name and ANY_DESCENDANTS not in name:
        return False
    return any(word in (ANY_WORD, ANY_DESCENDANTS) for word in name.split(SEPARATOR))


def _split_pattern(pattern: str) -> tuple[tuple[str, ...], bool]:
    """Split a pattern into its fixed words and whether it ends with `>`."""
    words = pattern.split(SEPARATOR)
    tail = words[-1] == ANY_DESCENDANTS
    if tail:
        words.pop()
    if ANY_DESCENDANTS in words:
        raise WildcardError(f"destination pattern {pattern!r}: '>' may only be the last word")
    return tuple(words), tail


class WildcardPattern:
    """One compiled destination pattern; `matches` tests a concrete destination name."""

    __slots__ = ("_tail", "_words", "text")

    def __init__(self, text: str, words: tuple[str, ...], tail: bool) -> None:
        self.text = text
        self._words = words
        self._tail = tail

    @property
    def is_wildcard(self) -> bool:
        """Whether the pattern can match more than one name."""
        return self._tail or ANY_WORD in self._words

    def matches(self, name: str) -> bool:
        """Tell whether destination `name` (words separated by `.`) matches this pattern."""
        words = name.split(SEPARATOR)
        fixed = self._words
        if len(words) != len(fixed) and not (self._tail and len(words) >= len(fixed)):
            return False
        return all(p in (ANY_WORD, w) for p, w in zip(fixed, words, strict=False))

    def __repr__(self) -> str:
        return f"WildcardPattern({self.text!r})"


def compile_pattern(name: str) -> WildcardPattern:
    """Compile a destination name or pattern; raise `WildcardError` if `>` is not last."""
    words, tail = _split_pattern(name)
    return WildcardPattern(name, words, tail)


class _Node(Generic[T]):
    """One trie level: what ends here, what ends here followed by `>`, and the next words."""

    __slots__ = ("any_word", "children", "exact", "tail")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.any_word: _Node[T] | None = None
        self.exact: list[T] = []
        self.tail: list[T] = []

    def is_empty(self) -> bool:
        return not (self.children or self.any_word or self.exact or self.tail)


class WildcardIndex(Generic[T]):
    """Patterns (wildcard or exact) mapped to items, looked up by destination name.

    Each `add(pattern, item)` is one registration; `match` returns the item of every registration
    whose pattern matches, so an item registered under two matching patterns comes back twice.
    Items need not be hashable; `remove` compares them with `==`. The work of `match` is bounded by
    the number of words times the number of trie branches that can match, not by the number of
    patterns.
    """

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Node[T] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, pattern: str, item: T) -> None:
        """Register `item` under `pattern`; raise `WildcardError` if the pattern is malformed."""
        words, tail = _split_pattern(pattern)
        node = self._root
        for word in words:
            if word == ANY_WORD:
                if node.any_word is None:
                    node.any_word = _Node()
                node = node.any_word
            else:
                child = node.children.get(word)
                if child is None:
                    child = node.children[word] = _Node()
                node = child
        (node.tail if tail else node.exact).append(item)
        self._count += 1

    def remove(self, pattern: str, item: T) -> None:
        """Remove one registration of `item` under `pattern`; raise `KeyError` if there is none."""
        words, tail = _split_pattern(pattern)
        path: list[tuple[_Node[T], str]] = []
        node: _Node[T] | None = self._root
        for word in words:
            assert node is not None
            path.append((node, word))
            node = node.any_word if word == ANY_WORD else node.children.get(word)
            if node is None:
                raise KeyError((pattern, item))
        assert node is not None
        items = node.tail if tail else node.exact
        try:
            items.remove(item)
        except ValueError:
            raise KeyError((pattern, item)) from None
        self._count -= 1
        # Prune the branch bottom-up so that removed patterns cost nothing on later matches.
        while path and node.is_empty():
            parent, word = path.pop()
            if word == ANY_WORD:
                parent.any_word = None
            else:
                del parent.children[word]
            node = parent

    def match(self, name: str) -> list[T]:
        """Items of every registration whose pattern matches destination `name`."""
        found: list[T] = []
        frontier = [self._root]
        for word in name.split(SEPARATOR):
            following: list[_Node[T]] = []
            for node in frontier:
                # `>` after the words consumed so far takes this word and all that follow.
                found.extend(node.tail)
                child = node.children.get(word)
                if child is not None:
                    following.append(child)
                if node.any_word is not None:
                    following.append(node.any_word)
            if not following:
                return found
            frontier = following
        for node in frontier:
            found.extend(node.exact)
            found.extend(node.tail)  # `>` matching zero words
        return found
