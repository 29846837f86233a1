"""JMS/ActiveMQ semantics in the core: durables, offsets, retention, wildcards, selectors,
exclusive consumers, duplicate detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import StoreConfig
from sluice.core.connection import BrokerConnection, SubscribeOptions
from sluice.core.message import AckMode
from sluice.core.topic import Topic
from sluice.errors import RequestError
from sluice.store.api import MessageStore
from sluice.store.journal.store import JournalStore
from sluice.store.journal.tools import rebuild_index
from sluice.store.memory import MemoryStore
from waiting import wait_until

from .fakes import Harness


def _topic(h: Harness, name: str) -> Topic:
    topic = h.broker.destinations[name]
    assert isinstance(topic, Topic)
    return topic


def test_durable_subscription_receives_what_was_published_while_away() -> None:
    h = Harness()
    producer, _ = h.connect()
    sub, link = h.connect("client-1")
    sub.subscribe(
        "d", "/topic/t", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(durable_name="audit")
    )
    h.send(producer, "/topic/t", b"one")
    ((_, first, tag, _),) = link.take()
    sub.ack(tag)
    sub.close()
    h.send(producer, "/topic/t", b"two")
    h.send(producer, "/topic/t", b"three")
    back, back_link = h.connect("client-1")
    back.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="audit"))
    h.loop.run()
    assert back_link.bodies() == [b"two", b"three"]
    assert first.body == b"one"


def test_durable_unacked_messages_come_back_marked_redelivered() -> None:
    h = Harness()
    producer, _ = h.connect()
    sub, link = h.connect("c")
    sub.subscribe("d", "/topic/t", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(durable_name="n"))
    h.send(producer, "/topic/t", b"a")
    h.send(producer, "/topic/t", b"b")
    sub.ack(link.delivered[0][2])
    sub.close()
    again, again_link = h.connect("c")
    again.subscribe("d", "/topic/t", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(durable_name="n"))
    h.loop.run()
    ((_, message, _, count),) = again_link.take()
    assert (message.body, count) == (b"b", 2)


def _restarted(h: Harness, kind: str, data_dir: Path) -> Harness:
    """The broker stopped and started again on the same store (with its index rebuilt from the
    journal for `journal-rebuilt`)."""
    if kind == "memory":
        return Harness(h.store)
    h.broker.close()
    if kind == "journal-rebuilt":
        rebuild_index(data_dir)
    return Harness(JournalStore(StoreConfig(data_dir=data_dir, journal_file_bytes=1 << 20)))


def _send_written(h: Harness, conn: BrokerConnection, dest: str, body: bytes) -> None:
    """A persistent send, once the store has written it (the journal completes on its thread)."""
    receipts = len(h.receipts)
    h.send(conn, dest, body, persistent=True)
    wait_until(lambda: h.loop.ready or len(h.receipts) > receipts, what="the write")
    h.loop.run()
    assert len(h.receipts) == receipts + 1


@pytest.mark.parametrize("kind", ["memory", "journal", "journal-rebuilt"])
def test_durable_created_after_unstored_messages_gets_what_follows_a_restart(
    kind: str, tmp_path: Path
) -> None:
    """Messages the store never held (published before the topic kept any, non-persistent
    ones) used sequences; the durable cursor stands past them, and after a restart the topic
    must not number new messages below it."""
    data_dir = tmp_path / "data"
    store: MessageStore = (
        MemoryStore()
        if kind == "memory"
        else JournalStore(StoreConfig(data_dir=data_dir, journal_file_bytes=1 << 20))
    )
    h = Harness(store)
    producer, _ = h.connect()
    for i in range(10):
        h.send(producer, "/topic/t", b"before %d" % i, persistent=True)  # nobody keeps them
    sub, _ = h.connect("c")
    sub.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    h.send(producer, "/topic/t", b"non-persistent")  # delivered, acknowledged, not stored
    sub.close()
    assert _topic(h, "/topic/t").durables[("c", "n")].cursor == 11

    h = _restarted(h, kind, data_dir)
    producer, _ = h.connect()
    _send_written(h, producer, "/topic/t", b"after the restart")
    back, link = h.connect("c")
    back.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    h.loop.run()
    assert link.bodies() == [b"after the restart"]
    assert [m.seq for _, m, _, _ in link.delivered] == [12]

    # And again, once the cursor is past what the store holds.
    back.close()
    h = _restarted(h, kind, data_dir)
    producer, _ = h.connect()
    _send_written(h, producer, "/topic/t", b"after the second restart")
    again, again_link = h.connect("c")
    again.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    h.loop.run()
    assert again_link.bodies() == [b"after the second restart"]
    h.broker.close()


def test_durable_needs_client_id_and_only_one_consumer() -> None:
    h = Harness()
    anonymous, _ = h.connect()
    with pytest.raises(RequestError, match="client-id"):
        anonymous.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    first, _ = h.connect("same")
    first.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    second, _ = h.connect("same")
    with pytest.raises(RequestError, match="already has a consumer"):
        second.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))


def test_unsubscribe_with_name_deletes_the_durable_and_releases_the_log() -> None:
    h = Harness()
    producer, _ = h.connect()
    sub, _ = h.connect("c")
    sub.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    sub.unsubscribe("d")  # the consumer leaves; the durable stays
    h.send(producer, "/topic/t", b"kept")
    topic = _topic(h, "/topic/t")
    assert topic.depth == 1
    sub.unsubscribe(None, "n")
    assert ("c", "n") not in topic.durables
    assert topic.depth == 0
    assert h.broker.usage.used == 0


def test_x_offset_reads_the_retained_log() -> None:
    h = Harness(policy={"retention_s": 3600.0})
    producer, _ = h.connect()
    for i in range(5):
        h.send(producer, "/topic/log", b"%d" % i)
        h.now += 1000
    reader, link = h.connect()
    reader.subscribe("r", "/topic/log", AckMode.AUTO, SubscribeOptions(offset="earliest"))
    h.loop.run()
    assert link.bodies() == [b"0", b"1", b"2", b"3", b"4"]
    from_three, link3 = h.connect()
    from_three.subscribe("r", "/topic/log", AckMode.AUTO, SubscribeOptions(offset="3"))
    h.loop.run()
    assert [m.seq for _, m, _, _ in link3.delivered] == [3, 4, 5]
    by_time, link_t = h.connect()
    by_time.subscribe(
        "r", "/topic/log", AckMode.AUTO, SubscribeOptions(offset=f"timestamp={h.now - 2500}")
    )
    h.loop.run()
    assert link_t.bodies() == [b"3", b"4"]
    latest, link_l = h.connect()
    latest.subscribe("r", "/topic/log", AckMode.AUTO, SubscribeOptions(offset="latest"))
    h.send(producer, "/topic/log", b"new")
    assert link_l.bodies() == [b"new"]


def test_bad_x_offset_is_a_clear_error() -> None:
    h = Harness()
    conn, _ = h.connect()
    with pytest.raises(RequestError, match="x-offset"):
        conn.subscribe("r", "/topic/t", AckMode.AUTO, SubscribeOptions(offset="yesterday"))


MESSAGE_BYTES = 101  # each retained test message: 100 bytes and a digit, no headers


def _publish_a_second_apart(h: Harness, topic: str, count: int) -> None:
    producer, _ = h.connect()
    for i in range(count):
        message = h.send(producer, topic, b"x" * 100 + b"%d" % i)
        assert message.nbytes == MESSAGE_BYTES
        h.now += 1000


def _kept(h: Harness, topic: str) -> list[bytes]:
    """The last byte of every message a reader from the earliest offset gets."""
    reader, link = h.connect()
    reader.subscribe("r", topic, AckMode.AUTO, SubscribeOptions(offset="earliest"))
    h.loop.run()
    reader.close()
    return [body[-1:] for body in link.bodies()]


@pytest.mark.parametrize(
    ("messages", "extra_bytes", "kept"),
    [(0, 1, 1), (1, 0, 1), (1, 1, 2), (2, 1, 3), (100, 0, 5)],
)
def test_retention_by_bytes_keeps_exactly_the_newest_bytes(
    messages: int, extra_bytes: int, kept: int
) -> None:
    h = Harness(policy={"retention_bytes": messages * MESSAGE_BYTES + extra_bytes})
    _publish_a_second_apart(h, "/topic/r", 5)
    topic = _topic(h, "/topic/r")
    assert topic.depth == kept
    assert _kept(h, "/topic/r") == [b"%d" % i for i in range(5 - kept, 5)]


def test_retention_by_time_applies_on_an_idle_topic() -> None:
    h = Harness(policy={"retention_s": 10.0})
    start = h.now
    producer, _ = h.connect()
    for i in range(5):  # at 0, 2, 4, 6 and 8 s
        h.now = start + 2000 * i
        h.send(producer, "/topic/idle", b"%d" % i)
    topic = _topic(h, "/topic/idle")
    assert topic.depth == 5
    h.now = start + 15_000  # keeps what is at most 10 s old: the messages of 6 and 8 s
    h.loop.fire_timers()  # the broker's sweep; nothing is published
    assert topic.depth == 2
    assert _kept(h, "/topic/idle") == [b"3", b"4"]
    h.now = start + 60_000
    h.loop.fire_timers()
    assert topic.depth == 0
    assert h.broker.usage.used == 0


def test_wildcard_subscription_gets_existing_and_new_topics() -> None:
    h = Harness()
    producer, _ = h.connect()
    h.send(producer, "/topic/PRICE.STOCK.NASDAQ", b"early")  # creates the topic
    watcher, link = h.connect()
    watcher.subscribe("w", "/topic/PRICE.>", AckMode.AUTO)
    star, star_link = h.connect()
    star.subscribe("s", "/topic/PRICE.*.NYSE", AckMode.AUTO)
    h.send(producer, "/topic/PRICE.STOCK.NASDAQ", b"nasdaq")
    h.send(producer, "/topic/PRICE.STOCK.NYSE", b"nyse")  # a topic created after subscribing
    h.send(producer, "/topic/OTHER", b"other")
    assert sorted(link.bodies()) == [b"nasdaq", b"nyse"]
    assert star_link.bodies() == [b"nyse"]
    watcher.unsubscribe("w")
    h.send(producer, "/topic/PRICE.STOCK.NYSE", b"after")
    assert sorted(link.bodies()) == [b"nasdaq", b"nyse"]


def test_bad_wildcard_is_an_error() -> None:
    h = Harness()
    conn, _ = h.connect()
    with pytest.raises(RequestError):
        conn.subscribe("w", "/topic/A.>.B", AckMode.AUTO)


def test_selectors_filter_on_headers_and_jms_fields() -> None:
    h = Harness()
    producer, _ = h.connect()
    red, red_link = h.connect()
    red.subscribe(
        "s",
        "/queue/cars",
        AckMode.AUTO,
        SubscribeOptions(selector="colour = 'red' AND weight > 1000"),
    )
    urgent, urgent_link = h.connect()
    urgent.subscribe(
        "s", "/queue/cars", AckMode.AUTO, SubscribeOptions(selector="JMSPriority >= 7")
    )
    h.send(producer, "/queue/cars", b"heavy red", headers={"colour": "red", "weight": "1500"})
    h.send(producer, "/queue/cars", b"light red", headers={"colour": "red", "weight": "900"})
    h.send(producer, "/queue/cars", b"urgent", priority=8)
    assert red_link.bodies() == [b"heavy red"]
    assert urgent_link.bodies() == [b"urgent"]
    queue = h.broker.destinations["/queue/cars"]
    assert queue.depth == 1  # nobody selects the light red car: it waits


def test_bad_selector_is_an_error_naming_the_position() -> None:
    h = Harness()
    conn, _ = h.connect()
    with pytest.raises(RequestError, match="position"):
        conn.subscribe("s", "/queue/q", AckMode.AUTO, SubscribeOptions(selector="colour = = 'red'"))


def test_exclusive_consumer_takes_everything_and_the_next_takes_over() -> None:
    h = Harness()
    producer, _ = h.connect()
    first, first_link = h.connect()
    first.subscribe("s", "/queue/x", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(exclusive=True))
    second, second_link = h.connect()
    second.subscribe("s", "/queue/x", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(exclusive=True))
    plain, plain_link = h.connect()
    plain.subscribe("s", "/queue/x", AckMode.CLIENT_INDIVIDUAL)
    for i in range(4):
        h.send(producer, "/queue/x", b"%d" % i)
    assert first_link.bodies() == [b"0", b"1", b"2", b"3"]
    assert second_link.bodies() == plain_link.bodies() == []
    first.ack(first_link.delivered[1][2])
    first.close()
    h.loop.run()
    # The next exclusive consumer takes over, in order, with the unacknowledged redelivered.
    assert second_link.bodies() == [b"0", b"2", b"3"]
    assert plain_link.bodies() == []


def test_duplicate_detection_drops_a_second_send_with_the_same_id() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/d", AckMode.AUTO)
    h.send(producer, "/queue/d", b"first", headers={"x-dedup-id": "order-1"})
    h.send(producer, "/queue/d", b"again", headers={"x-dedup-id": "order-1"})
    h.send(producer, "/queue/d", b"other", headers={"x-dedup-id": "order-2"})
    assert link.bodies() == [b"first", b"other"]
    assert h.broker.counters["duplicates_dropped"] == 1
    assert len(h.receipts) == 3  # the duplicate is still acknowledged to its producer


def test_duplicate_window_is_bounded() -> None:
    h = Harness(limits={"dedup_window": 2})
    producer, _ = h.connect()
    for key in ("a", "b", "c"):
        h.send(producer, "/queue/d", key.encode(), headers={"x-dedup-id": key})
    h.send(producer, "/queue/d", b"a-again", headers={"x-dedup-id": "a"})  # "a" left the window
    queue = h.broker.destinations["/queue/d"]
    assert len(queue.dedup) == 2
    assert queue.depth == 4


def test_dedup_in_transactions_registers_ids_at_commit() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/d", AckMode.AUTO)
    producer.begin("t1")
    h.send(producer, "/queue/d", b"aborted", txid="t1", headers={"x-dedup-id": "k"})
    producer.abort("t1")
    producer.begin("t2")
    h.send(producer, "/queue/d", b"retried", txid="t2", headers={"x-dedup-id": "k"})
    producer.commit("t2", lambda: None)
    h.loop.run()
    producer.begin("t3")
    h.send(producer, "/queue/d", b"replayed", txid="t3", headers={"x-dedup-id": "k"})
    producer.commit("t3", lambda: None)
    h.loop.run()
    assert link.bodies() == [b"retried"]


def test_transacted_ack_is_final_at_commit_and_redelivered_on_abort() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/t", AckMode.CLIENT_INDIVIDUAL)
    h.send(producer, "/queue/t", b"m")
    ((_, _, tag, _),) = link.take()
    consumer.begin("a")
    consumer.ack(tag, "a")
    consumer.abort("a")
    h.loop.run()
    ((_, again, tag2, count),) = link.take()
    assert (again.body, count) == (b"m", 2)
    consumer.begin("b")
    consumer.ack(tag2, "b")
    consumer.commit("b", lambda: None)
    h.loop.run()
    consumer.close()
    h.loop.run()
    assert h.broker.destinations["/queue/t"].depth == 0
    assert h.broker.usage.used == 0


def test_group_owner_leaving_reassigns_its_group() -> None:
    h = Harness()
    producer, _ = h.connect()
    a, link_a = h.connect()
    a.subscribe("s", "/queue/g", AckMode.CLIENT_INDIVIDUAL)
    for i in range(3):
        h.send(producer, "/queue/g", b"%d" % i, headers={"JMSXGroupID": "G"})
    b, link_b = h.connect()
    b.subscribe("s", "/queue/g", AckMode.CLIENT_INDIVIDUAL)
    h.send(producer, "/queue/g", b"3", headers={"JMSXGroupID": "G"})
    assert link_a.bodies() == [b"0", b"1", b"2", b"3"]
    assert link_b.bodies() == []
    a.ack(link_a.delivered[0][2])
    a.close()
    h.loop.run()
    assert link_b.bodies() == [b"1", b"2", b"3"]


def test_group_map_is_bounded_and_evictions_counted() -> None:
    h = Harness(limits={"max_message_groups": 2})
    producer, _ = h.connect()
    consumer, _ = h.connect()
    consumer.subscribe("s", "/queue/g", AckMode.AUTO)
    for group in ("a", "b", "c"):
        h.send(producer, "/queue/g", b"x", headers={"JMSXGroupID": group})
    queue = h.broker.destinations["/queue/g"]
    assert len(queue.groups) == 2  # type: ignore[attr-defined]
    assert h.broker.counters["message_group_evictions"] == 1


def test_expired_messages_go_to_the_dlq_without_a_consumer() -> None:
    h = Harness()
    producer, _ = h.connect()
    h.send(producer, "/queue/idle", b"short-lived", expires_ms=h.now + 10)
    h.now += 100
    h.loop.fire_timers()
    assert h.broker.destinations["/queue/idle"].depth == 0
    assert h.broker.destinations["/queue/DLQ.idle"].depth == 1


def test_idle_group_is_released_to_make_room() -> None:
    h = Harness(policy={"group_idle_timeout_s": 1.0})
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe(
        "s", "/queue/g", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(max_open_groups=1)
    )
    h.send(producer, "/queue/g", b"a1", headers={"JMSXGroupID": "A"})
    consumer.ack(link.take()[0][2])
    h.send(producer, "/queue/g", b"b1", headers={"JMSXGroupID": "B"})
    assert link.bodies() == []  # A is still open and not yet idle
    h.now += 2000
    h.send(producer, "/queue/g", b"b2", headers={"JMSXGroupID": "B"})
    assert link.bodies() == [b"b1", b"b2"]
    assert h.broker.counters["message_groups_idle_released"] == 1


def test_dlq_prefix_is_per_destination() -> None:
    h = Harness(destination=[{"pattern": "/queue/orders.>", "dlq_prefix": "DEAD."}])
    producer, _ = h.connect()
    h.send(producer, "/queue/orders.eu", b"late", expires_ms=h.now + 10)
    h.send(producer, "/queue/other", b"late", expires_ms=h.now + 10)
    h.now += 100
    h.loop.fire_timers()
    destinations = h.broker.destinations
    assert destinations["/queue/DEAD.orders.eu"].depth == 1
    assert "/queue/DLQ.orders.eu" not in destinations
    assert destinations["/queue/DLQ.other"].depth == 1
    # What fails in a DLQ is not dead-lettered again, whichever prefix named it.
    assert destinations["/queue/DEAD.orders.eu"].is_dlq  # type: ignore[attr-defined]


def _dlq_messages(h: Harness, name: str) -> list[tuple[bytes, dict[str, str]]]:
    queue = h.broker.destinations.get(name)
    if queue is None:
        return []
    return [(m.body, m.headers) for m in queue.pending.values()]  # type: ignore[attr-defined]


def test_expired_topic_message_goes_to_the_topic_dlq_once() -> None:
    h = Harness()
    producer, _ = h.connect()
    links = []
    for _ in range(2):
        conn, link = h.connect()
        conn.subscribe("s", "/topic/prices", AckMode.AUTO)
        links.append(link)
    h.send(producer, "/topic/prices", b"stale", expires_ms=h.now - 1, persistent=True)
    h.send(producer, "/topic/prices", b"fresh", expires_ms=h.now + 60_000, persistent=True)
    assert [link.bodies() for link in links] == [[b"fresh"], [b"fresh"]]
    ((body, headers),) = _dlq_messages(h, "/queue/DLQ.Topic.prices")
    assert body == b"stale"
    assert headers["x-original-destination"] == "/topic/prices"
    assert headers["x-dlq-reason"] == "expired"
    assert "/queue/DLQ.prices" not in h.broker.destinations  # apart from a queue's DLQ
    assert len(h.receipts) == 2


def test_expired_message_retained_for_a_durable_goes_to_the_dlq_once() -> None:
    h = Harness()
    producer, _ = h.connect()
    for name in ("a", "b"):
        away, _ = h.connect("client-" + name)
        away.subscribe(
            "d", "/topic/audit", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(durable_name=name)
        )
        away.close()
    h.send(producer, "/topic/audit", b"short-lived", expires_ms=h.now + 10, persistent=True)
    h.send(producer, "/topic/audit", b"lasting", persistent=True)
    h.now += 100
    h.loop.fire_timers()  # the sweep finds it in the log, with nobody connected
    assert [body for body, _ in _dlq_messages(h, "/queue/DLQ.Topic.audit")] == [b"short-lived"]
    for name in ("a", "b"):
        back, link = h.connect("client-" + name)
        back.subscribe("d", "/topic/audit", AckMode.AUTO, SubscribeOptions(durable_name=name))
        h.loop.run()
        assert link.bodies() == [b"lasting"]
    h.loop.fire_timers()
    assert len(_dlq_messages(h, "/queue/DLQ.Topic.audit")) == 1
    assert h.broker.counters["dead_lettered"] == 1


def test_expired_non_persistent_topic_message_is_discarded_and_counted() -> None:
    h = Harness()
    producer, _ = h.connect()
    subscriber, link = h.connect()
    subscriber.subscribe("s", "/topic/ticks", AckMode.AUTO)
    h.send(producer, "/topic/ticks", b"stale", expires_ms=h.now - 1)
    assert link.bodies() == []
    assert "/queue/DLQ.Topic.ticks" not in h.broker.destinations
    assert h.broker.counters["expired_discarded"] == 1


def test_topic_dlq_after_max_redeliveries_uses_the_topic_prefix() -> None:
    h = Harness(policy={"max_redeliveries": 0, "topic_dlq_prefix": "DEAD.T."})
    producer, _ = h.connect()
    consumer, link = h.connect()
    consumer.subscribe("s", "/topic/jobs", AckMode.CLIENT_INDIVIDUAL)
    h.send(producer, "/topic/jobs", b"poison", persistent=True)
    consumer.nack(link.take()[0][2])
    h.loop.run()
    assert [body for body, _ in _dlq_messages(h, "/queue/DEAD.T.jobs")] == [b"poison"]
    assert h.broker.destinations["/queue/DEAD.T.jobs"].is_dlq  # type: ignore[attr-defined]
