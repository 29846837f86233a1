"""`[[acl]]` rules: first match wins, default deny once a rule exists, users and groups, and
wildcard subscriptions judged for every name they can match."""

from __future__ import annotations

from sluice.auth.acl import MAX_CACHED_DECISIONS, AccessControl
from sluice.auth.identity import ANONYMOUS, Identity, Permission
from sluice.config import AclRule

READ, WRITE, ADMIN = Permission.READ, Permission.WRITE, Permission.ADMIN
ALICE = Identity("alice", frozenset({"ops"}))
BOB = Identity("bob", frozenset({"shop"}))


def test_no_rules_allow_everything() -> None:
    acl = AccessControl(())
    assert acl.open
    assert acl.allows(ANONYMOUS, "/queue/x", ADMIN)


def test_first_match_wins() -> None:
    acl = AccessControl(
        [
            AclRule("/queue/orders.secret", read=["ops"]),
            AclRule("/queue/orders.>", read=["ops", "shop"], write=["shop"]),
        ]
    )
    assert acl.allows(BOB, "/queue/orders.eu", READ)
    assert acl.allows(BOB, "/queue/orders.eu", WRITE)
    # The first rule decides, though the second would allow it.
    assert not acl.allows(BOB, "/queue/orders.secret", READ)
    assert acl.allows(ALICE, "/queue/orders.secret", READ)
    assert not acl.allows(ALICE, "/queue/orders.secret", WRITE)
    # `>` takes zero words too, as the broker's wildcards do.
    assert acl.allows(BOB, "/queue/orders", WRITE)


def test_default_deny_once_a_rule_exists() -> None:
    acl = AccessControl([AclRule("/queue/a", read=["*"])])
    assert not acl.open
    assert not acl.allows(ALICE, "/queue/b", READ)
    assert not acl.allows(ALICE, "/topic/a", READ)  # queues and topics are apart


def test_users_groups_and_everyone() -> None:
    acl = AccessControl(
        [
            AclRule("/topic/a", read=["bob"]),
            AclRule("/topic/b", read=["ops"]),
            AclRule("/topic/c", read=["*"]),
            AclRule("/topic/d", read=["anonymous"]),
        ]
    )
    assert acl.allows(BOB, "/topic/a", READ)
    assert not acl.allows(ALICE, "/topic/a", READ)
    assert acl.allows(ALICE, "/topic/b", READ)
    assert not acl.allows(BOB, "/topic/b", READ)
    assert acl.allows(ANONYMOUS, "/topic/c", READ)
    assert acl.allows(ANONYMOUS, "/topic/d", READ)
    assert not acl.allows(BOB, "/topic/d", READ)


def test_single_word_wildcard_in_a_rule() -> None:
    acl = AccessControl([AclRule("/topic/prices.*.eu", read=["*"])])
    assert acl.allows(BOB, "/topic/prices.stock.eu", READ)
    assert not acl.allows(BOB, "/topic/prices.stock.us", READ)
    assert not acl.allows(BOB, "/topic/prices.stock.eu.x", READ)


def test_a_wildcard_subscription_needs_every_name_it_can_match() -> None:
    acl = AccessControl(
        [
            AclRule("/topic/prices.secret", read=["ops"]),
            AclRule("/topic/prices.*", read=["*"]),
            AclRule("/topic/news.>", read=["*"]),
        ]
    )
    # `prices.*` would match prices.secret, which the first rule keeps from bob.
    assert not acl.allows(BOB, "/topic/prices.*", READ)
    assert acl.allows(ALICE, "/topic/prices.*", READ)
    # `prices.>` reaches prices.a.b, which no rule grants.
    assert not acl.allows(ALICE, "/topic/prices.>", READ)
    assert acl.allows(BOB, "/topic/news.>", READ)
    assert acl.allows(BOB, "/topic/news.*.eu", READ)
    assert not acl.allows(BOB, "/topic/>", READ)


def test_decisions_are_cached_and_the_cache_is_bounded() -> None:
    acl = AccessControl([AclRule("/queue/>", write=["*"])])
    for n in range(MAX_CACHED_DECISIONS + 10):
        assert acl.allows(BOB, f"/queue/q{n}", WRITE)
    assert len(acl._cache) <= MAX_CACHED_DECISIONS
