"""`[[acl]]` rules: who may read, write or administer which destinations.

Rules are tried in order and the first whose `destination` pattern matches decides (the broker's
wildcards: `*` one word, a final `>` the rest). Without rules, every identity may do everything;
once a rule exists, a destination no rule matches is refused to everyone. A rule names users or
groups in each list; `*` names every client, anonymous ones too.

A wildcard subscription (`/topic/prices.>`) is judged for every name it can match: it is allowed
when a rule that covers all of them allows it and every earlier rule that matches some of them
allows it too; otherwise it is refused (so a rule on `/topic/prices.*` does not let anyone read
`/topic/prices.>`).

Decisions are cached per (identity, destination, permission), in a bounded map that is emptied
when it fills; a new `AccessControl` (a reload) starts with an empty one.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.auth.identity import Identity, Permission
from sluice.config import ACL_EVERYONE, AclRule
from sluice.core.wildcard import (
    ANY_DESCENDANTS,
    ANY_WORD,
    SEPARATOR,
    WildcardError,
    compile_pattern,
    is_wildcard,
)
from sluice.errors import ConfigError

__all__ = ["AccessControl"]

# Cached decisions before the cache is emptied (a few MiB at most).
MAX_CACHED_DECISIONS = 65_536


def _split(name: str) -> tuple[str, tuple[str, ...], bool]:
    """`/topic/a.*.>` -> ("/topic/", ("a", "*"), True)."""
    kind, _, rest = name.partition("/")[2].partition("/")
    words = rest.split(SEPARATOR)
    tail = words[-1] == ANY_DESCENDANTS
    if tail:
        words.pop()
    return f"/{kind}/", tuple(words), tail


def _intersects(a: tuple[str, ...], a_tail: bool, b: tuple[str, ...], b_tail: bool) -> bool:
    """Whether some name matches both patterns."""
    for x, y in zip(a, b, strict=False):
        if x != y and ANY_WORD not in (x, y):
            return False
    if len(a) == len(b):
        return True
    return b_tail if len(a) > len(b) else a_tail


def _covers(rule: tuple[str, ...], rule_tail: bool, sub: tuple[str, ...], sub_tail: bool) -> bool:
    """Whether every name `sub` matches, `rule` matches too."""
    if len(sub) < len(rule):
        return False
    for r, s in zip(rule, sub, strict=False):
        if r not in (ANY_WORD, s):
            return False
    if len(sub) == len(rule) and not sub_tail:
        return True
    return rule_tail


class _Rule:
    __slots__ = ("allowed", "prefix", "tail", "words")

    def __init__(self, rule: AclRule) -> None:
        self.prefix, self.words, self.tail = _split(rule.destination)
        try:
            compile_pattern(rule.destination[len(self.prefix) :])
        except WildcardError as exc:
            raise ConfigError(f"[[acl]] destination {rule.destination!r}: {exc}") from None
        self.allowed = {
            Permission.READ: frozenset(rule.read),
            Permission.WRITE: frozenset(rule.write),
            Permission.ADMIN: frozenset(rule.admin),
        }

    def allows(self, identity: Identity, permission: Permission) -> bool:
        names = self.allowed[permission]
        return (
            ACL_EVERYONE in names or identity.user in names or not names.isdisjoint(identity.groups)
        )


class AccessControl:
    """The `[[acl]]` rules, compiled; `allows` answers one question."""

    def __init__(self, rules: Sequence[AclRule]) -> None:
        self.rules = tuple(rules)
        self._rules = [_Rule(rule) for rule in rules]
        self._cache: dict[tuple[Identity, str, Permission], bool] = {}
        # No rules: everyone may do everything. (A plain attribute: it is read for every frame,
        # and the rules of an instance never change; a reload makes a new one.)
        self.open = not self._rules

    def allows(self, identity: Identity, destination: str, permission: Permission) -> bool:
        """Whether `identity` may do `permission` on `destination` (a full name such as
        `/queue/orders`; a wildcard subscription's pattern is judged as written)."""
        if not self._rules:
            return True
        key = (identity, destination, permission)
        cache = self._cache
        decision = cache.get(key)
        if decision is None:
            decision = self._decide(identity, destination, permission)
            if len(cache) >= MAX_CACHED_DECISIONS:
                cache.clear()
            cache[key] = decision
        return decision

    def _decide(self, identity: Identity, destination: str, permission: Permission) -> bool:
        prefix, words, tail = _split(destination)
        if tail or is_wildcard(destination[len(prefix) :]):
            return self._decide_pattern(identity, prefix, words, tail, permission)
        for rule in self._rules:
            if rule.prefix != prefix:
                continue
            if _covers(rule.words, rule.tail, words, False):
                return rule.allows(identity, permission)
        return False

    def _decide_pattern(
        self,
        identity: Identity,
        prefix: str,
        words: tuple[str, ...],
        tail: bool,
        permission: Permission,
    ) -> bool:
        for rule in self._rules:
            if rule.prefix != prefix or not _intersects(rule.words, rule.tail, words, tail):
                continue
            if not rule.allows(identity, permission):
                return False
            if _covers(rule.words, rule.tail, words, tail):
                return True
        return False
