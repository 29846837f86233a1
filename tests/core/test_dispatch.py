"""Queue and topic dispatch: credit, order, redelivery, dead letters, priorities, groups."""

from __future__ import annotations

import pytest

from sluice.core.connection import SubscribeOptions
from sluice.core.message import AckMode
from sluice.errors import LimitExceeded, RequestError

from .fakes import Harness


def test_round_robin_between_consumers_with_credit() -> None:
    h = Harness()
    producer, _ = h.connect()
    a, link_a = h.connect()
    b, link_b = h.connect()
    a.subscribe("s", "/queue/q", AckMode.AUTO)
    b.subscribe("s", "/queue/q", AckMode.AUTO)
    for i in range(6):
        h.send(producer, "/queue/q", b"%d" % i)
    assert link_a.bodies() == [b"0", b"2", b"4"]
    assert link_b.bodies() == [b"1", b"3", b"5"]


def test_prefetch_in_messages_then_ack_frees_credit() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(prefetch=2))
    for i in range(5):
        h.send(producer, "/queue/q", b"%d" % i)
    assert link.bodies() == [b"0", b"1"]
    first_tag = link.delivered[0][2]
    consumer.ack(first_tag)
    h.loop.run()
    assert link.bodies() == [b"0", b"1", b"2"]


def test_prefetch_in_bytes_allows_one_oversize_message() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe(
        "s",
        "/queue/q",
        AckMode.CLIENT_INDIVIDUAL,
        SubscribeOptions(prefetch=100, prefetch_bytes=10),
    )
    h.send(producer, "/queue/q", b"x" * 50)
    h.send(producer, "/queue/q", b"y")
    # The first exceeds the byte credit on its own and still moves; then credit is exhausted.
    assert link.bodies() == [b"x" * 50]
    consumer.ack(link.delivered[0][2])
    h.loop.run()
    assert link.bodies()[-1] == b"y"


def test_prefetch_in_bytes_is_a_cap() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    # Room for two and a half messages: the third would go over the credit, so it waits.
    consumer.subscribe(
        "s",
        "/queue/q",
        AckMode.CLIENT_INDIVIDUAL,
        SubscribeOptions(prefetch=100, prefetch_bytes=25),
    )
    for i in range(5):
        h.send(producer, "/queue/q", b"%d" % i * 10)
    assert link.bodies() == [b"0" * 10, b"1" * 10]
    assert consumer.subs["s"].inflight_bytes == 20
    consumer.ack(link.delivered[0][2])
    h.loop.run()
    assert link.bodies()[-1] == b"2" * 10
    assert consumer.subs["s"].inflight_bytes == 20


def test_byte_credit_holds_a_group_back_in_order() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    # Each message counts its header too (14 bytes): two of 24 fit, a third does not, though
    # the short one after it would (63 of 65 bytes).
    consumer.subscribe(
        "s",
        "/queue/q",
        AckMode.CLIENT_INDIVIDUAL,
        SubscribeOptions(prefetch=100, prefetch_bytes=65),
    )
    headers = {"JMSXGroupID": "g"}
    for body in (b"a" * 10, b"b" * 10, b"c" * 10, b"d"):
        h.send(producer, "/queue/q", body, headers=dict(headers))
    # "d" would fit the credit left, but it must not overtake "c".
    assert [b[:1] for b in link.bodies()] == [b"a", b"b"]
    for _, _, tag, _ in link.take():
        consumer.ack(tag)
    h.loop.run()
    assert [b[:1] for b in link.bodies()] == [b"c", b"d"]


def test_unwritable_link_is_skipped_until_it_drains() -> None:
    h = Harness()
    producer, _ = h.connect()
    slow, slow_link = h.connect()
    fast, fast_link = h.connect()
    sub = slow.subscribe("s", "/queue/q", AckMode.AUTO)
    fast.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(prefetch=2))
    slow_link.writable = False
    for i in range(4):
        h.send(producer, "/queue/q", b"%d" % i)
    assert fast_link.bodies() == [b"0", b"1"]
    assert slow_link.bodies() == []  # "2" and "3" wait: fast has no credit, slow is full
    # The link drains; the session wakes its destinations (as on `resume_writing`).
    slow_link.writable = True
    assert sub is not None
    sub.destination.wakeup()
    h.loop.run()
    assert slow_link.bodies() == [b"2", b"3"]
    assert fast_link.bodies() == [b"0", b"1"]


def test_nack_puts_message_back_at_its_place() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(prefetch=1))
    for i in range(3):
        h.send(producer, "/queue/q", b"%d" % i)
    ((_, first, tag, count),) = link.take()
    assert (first.body, count) == (b"0", 1)
    consumer.nack(tag)
    h.loop.run()
    ((_, again, _, count),) = link.take()
    assert (again.body, count) == (b"0", 2)


def test_consumer_leaving_returns_messages_in_order() -> None:
    h = Harness()
    producer, _ = h.connect()
    first, link1 = h.connect()
    first.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL)
    for i in range(5):
        h.send(producer, "/queue/q", b"%d" % i)
    first.ack(link1.delivered[1][2])
    first.close()
    h.loop.run()
    second, link2 = h.connect()
    second.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL)
    h.loop.run()
    assert link2.bodies() == [b"0", b"2", b"3", b"4"]
    assert all(count == 2 for _, _, _, count in link2.delivered)


def test_cumulative_ack_settles_everything_up_to_the_tag() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    sub = consumer.subscribe("s", "/queue/q", AckMode.CLIENT)
    for i in range(4):
        h.send(producer, "/queue/q", b"%d" % i)
    consumer.ack(link.delivered[2][2])
    assert [m.body for m in sub.inflight.values()] == [b"3"]


def test_max_redeliveries_sends_to_dlq_with_reason() -> None:
    h = Harness(policy={"max_redeliveries": 2})
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/work", AckMode.CLIENT_INDIVIDUAL)
    h.send(producer, "/queue/work", b"poison")
    for _ in range(3):
        ((_, _, tag, _),) = link.take()
        consumer.nack(tag)
        h.loop.run()
    assert link.take() == []
    dlq_consumer, dlq_link = h.connect()
    dlq_consumer.subscribe("d", "/queue/DLQ.work", AckMode.AUTO)
    h.loop.run()
    ((_, dead, _, _),) = dlq_link.take()
    assert dead.body == b"poison"
    assert dead.headers["x-original-destination"] == "/queue/work"
    assert "max_redeliveries=2" in dead.headers["x-dlq-reason"]


def test_expired_messages_are_not_delivered_and_go_to_dlq() -> None:
    h = Harness()
    producer, _ = h.connect()
    h.send(producer, "/queue/q", b"stale", expires_ms=h.now + 10)
    h.send(producer, "/queue/q", b"fresh")
    h.now += 100
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.AUTO)
    h.loop.run()
    assert link.bodies() == [b"fresh"]
    dlq, dlq_link = h.connect()
    dlq.subscribe("d", "/queue/DLQ.q", AckMode.AUTO)
    h.loop.run()
    assert dlq_link.bodies() == [b"stale"]
    assert dlq_link.delivered[0][1].headers["x-dlq-reason"] == "expired"


def test_priority_higher_first_fifo_within() -> None:
    h = Harness()
    producer, _ = h.connect()
    for body, priority in [(b"a4", 4), (b"b9", 9), (b"c0", 0), (b"d9", 9), (b"e4", 4)]:
        h.send(producer, "/queue/p", body, priority=priority)
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/p", AckMode.AUTO)
    h.loop.run()
    assert link.bodies() == [b"b9", b"d9", b"a4", b"e4", b"c0"]


def test_message_group_sticks_to_one_consumer_and_closes() -> None:
    h = Harness()
    producer, _ = h.connect()
    a, link_a = h.connect()
    b, link_b = h.connect()
    a.subscribe("s", "/queue/g", AckMode.AUTO)
    b.subscribe("s", "/queue/g", AckMode.AUTO)
    for i in range(4):
        h.send(producer, "/queue/g", b"g1-%d" % i, headers={"JMSXGroupID": "g1"})
    owner = link_a if link_a.delivered else link_b
    assert owner.bodies() == [b"g1-0", b"g1-1", b"g1-2", b"g1-3"]
    h.send(producer, "/queue/g", b"g1-end", headers={"JMSXGroupID": "g1", "JMSXGroupSeq": "-1"})
    queue = h.broker.destinations["/queue/g"]
    assert "g1" not in queue.groups  # type: ignore[attr-defined]


def test_new_groups_go_to_least_loaded_and_respect_max_open_groups() -> None:
    h = Harness()
    producer, _ = h.connect()
    a, link_a = h.connect()
    b, link_b = h.connect()
    a.subscribe("s", "/queue/g", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(max_open_groups=1))
    b.subscribe("s", "/queue/g", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(max_open_groups=1))
    for group in ("x", "y", "z"):
        h.send(producer, "/queue/g", group.encode(), headers={"JMSXGroupID": group})
    # Two consumers, one open group each: the third group waits.
    assert sorted(link_a.bodies() + link_b.bodies()) == [b"x", b"y"]


def test_transaction_is_invisible_until_commit_and_dropped_on_abort() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/t", AckMode.AUTO)
    producer.begin("tx1")
    h.send(producer, "/queue/t", b"in-tx", txid="tx1")
    assert link.bodies() == []
    done: list[bool] = []
    producer.commit("tx1", lambda: done.append(True))
    h.loop.run()
    assert done == [True]
    assert link.bodies() == [b"in-tx"]
    producer.begin("tx2")
    h.send(producer, "/queue/t", b"aborted", txid="tx2")
    producer.abort("tx2")
    h.loop.run()
    assert link.bodies() == [b"in-tx"]
    assert h.broker.usage.used == 0


def test_transaction_errors_name_the_transaction() -> None:
    h = Harness()
    conn, _ = h.connect()
    with pytest.raises(RequestError, match="nope"):
        conn.commit("nope", lambda: None)
    conn.begin("t")
    with pytest.raises(RequestError, match="'t' is already open"):
        conn.begin("t")


def test_unknown_ack_tag_is_an_error() -> None:
    h = Harness()
    conn, _ = h.connect()
    with pytest.raises(RequestError, match="ack id 12345"):
        conn.ack(12345)


def test_subscription_limit_is_named() -> None:
    h = Harness(limits={"max_subscriptions_per_connection": 2})
    conn, _ = h.connect()
    conn.subscribe("1", "/queue/a", AckMode.AUTO)
    conn.subscribe("2", "/queue/a", AckMode.AUTO)
    with pytest.raises(LimitExceeded, match="max_subscriptions_per_connection"):
        conn.subscribe("3", "/queue/a", AckMode.AUTO)


def test_producer_paused_when_destination_full_and_resumed_when_drained() -> None:
    h = Harness(limits={"destination_memory_limit_bytes": 1000, "memory_resume_ratio": 0.5})
    producer, plink = h.connect()
    for _ in range(3):
        h.send(producer, "/queue/full", b"x" * 400)
    assert plink.paused  # 1200 bytes queued against a 1000-byte limit
    consumer, _ = h.connect()
    consumer.subscribe("s", "/queue/full", AckMode.AUTO)
    h.loop.run()
    assert not plink.paused
    assert h.broker.usage.used == 0


def test_topic_subscribers_see_what_is_published_while_subscribed() -> None:
    h = Harness()
    producer, _ = h.connect()
    h.send(producer, "/topic/t", b"before")
    early, early_link = h.connect()
    early.subscribe("s", "/topic/t", AckMode.AUTO)
    h.send(producer, "/topic/t", b"one")
    late, late_link = h.connect()
    late.subscribe("s", "/topic/t", AckMode.AUTO)
    h.send(producer, "/topic/t", b"two")
    assert early_link.bodies() == [b"one", b"two"]
    assert late_link.bodies() == [b"two"]
    assert [m.seq for _, m, _, _ in early_link.delivered] == [2, 3]
    # Everyone has passed every message: the log keeps nothing.
    assert h.broker.destinations["/topic/t"].depth == 0
    assert h.broker.usage.used == 0


def test_topic_slow_subscriber_holds_the_log_until_it_catches_up() -> None:
    h = Harness()
    producer, _ = h.connect()
    slow, slow_link = h.connect()
    slow.subscribe("s", "/topic/t", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(prefetch=1))
    for i in range(3):
        h.send(producer, "/topic/t", b"%d" % i)
    topic = h.broker.destinations["/topic/t"]
    assert topic.depth == 2
    for _ in range(3):
        ((_, _, tag, _),) = slow_link.take()
        slow.ack(tag)
        h.loop.run()
    assert topic.depth == 0


def test_delivery_tags_are_each_connections_own() -> None:
    """Tags count from 1 on every connection, whichever broker or connection came first, and
    an ACK with another connection's tag is refused."""
    tags = []
    for _ in range(2):
        h = Harness()
        producer, _ = h.connect()
        a, link_a = h.connect()
        b, link_b = h.connect()
        a.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL)
        b.subscribe("s", "/topic/t", AckMode.CLIENT_INDIVIDUAL)
        for i in range(2):
            h.send(producer, "/queue/q", b"%d" % i)
            h.send(producer, "/topic/t", b"%d" % i)
        tags.append(([d[2] for d in link_a.delivered], [d[2] for d in link_b.delivered]))
        with pytest.raises(RequestError):
            b.ack(link_a.delivered[-1][2] + 100)
    assert tags == [([1, 2], [1, 2]), ([1, 2], [1, 2])]
