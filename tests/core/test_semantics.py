"""JMS/ActiveMQ semantics in the core: durables, offsets, retention, wildcards, selectors,
exclusive consumers, duplicate detection."""

from __future__ import annotations

import pytest

from sluice.core.message import AckMode
from sluice.core.topic import Topic
from sluice.errors import RequestError

from .fakes import Harness


def _topic(h: Harness, name: str) -> Topic:
    topic = h.broker.destinations[name]
    assert isinstance(topic, Topic)
    return topic


def test_durable_subscription_receives_what_was_published_while_away() -> None:
    h = Harness()
    producer, _ = h.connect()
    sub, link = h.connect("client-1")
    sub.subscribe("d", "/topic/t", AckMode.CLIENT_INDIVIDUAL, durable_name="audit")
    h.send(producer, "/topic/t", b"one")
    ((_, first, tag, _),) = link.take()
    sub.ack(tag)
    sub.close()
    h.send(producer, "/topic/t", b"two")
    h.send(producer, "/topic/t", b"three")
    back, back_link = h.connect("client-1")
    back.subscribe("d", "/topic/t", AckMode.AUTO, durable_name="audit")
    h.loop.run()
    assert back_link.bodies() == [b"two", b"three"]
    assert first.body == b"one"


def test_durable_unacked_messages_come_back_marked_redelivered() -> None:
    h = Harness()
    producer, _ = h.connect()
    sub, link = h.connect("c")
    sub.subscribe("d", "/topic/t", AckMode.CLIENT_INDIVIDUAL, durable_name="n")
    h.send(producer, "/topic/t", b"a")
    h.send(producer, "/topic/t", b"b")
    sub.ack(link.delivered[0][2])
    sub.close()
    again, again_link = h.connect("c")
    again.subscribe("d", "/topic/t", AckMode.CLIENT_INDIVIDUAL, durable_name="n")
    h.loop.run()
    ((_, message, _, count),) = again_link.take()
    assert (message.body, count) == (b"b", 2)


def test_durable_needs_client_id_and_only_one_consumer() -> None:
    h = Harness()
    anonymous, _ = h.connect()
    with pytest.raises(RequestError, match="client-id"):
        anonymous.subscribe("d", "/topic/t", AckMode.AUTO, durable_name="n")
    first, _ = h.connect("same")
    first.subscribe("d", "/topic/t", AckMode.AUTO, durable_name="n")
    second, _ = h.connect("same")
    with pytest.raises(RequestError, match="already has a consumer"):
        second.subscribe("d", "/topic/t", AckMode.AUTO, durable_name="n")


def test_unsubscribe_with_name_deletes_the_durable_and_releases_the_log() -> None:
    h = Harness()
    producer, _ = h.connect()
    sub, _ = h.connect("c")
    sub.subscribe("d", "/topic/t", AckMode.AUTO, durable_name="n")
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
    reader.subscribe("r", "/topic/log", AckMode.AUTO, offset="earliest")
    h.loop.run()
    assert link.bodies() == [b"0", b"1", b"2", b"3", b"4"]
    from_three, link3 = h.connect()
    from_three.subscribe("r", "/topic/log", AckMode.AUTO, offset="3")
    h.loop.run()
    assert [m.seq for _, m, _, _ in link3.delivered] == [3, 4, 5]
    by_time, link_t = h.connect()
    by_time.subscribe("r", "/topic/log", AckMode.AUTO, offset=f"timestamp={h.now - 2500}")
    h.loop.run()
    assert link_t.bodies() == [b"3", b"4"]
    latest, link_l = h.connect()
    latest.subscribe("r", "/topic/log", AckMode.AUTO, offset="latest")
    h.send(producer, "/topic/log", b"new")
    assert link_l.bodies() == [b"new"]


def test_bad_x_offset_is_a_clear_error() -> None:
    h = Harness()
    conn, _ = h.connect()
    with pytest.raises(RequestError, match="x-offset"):
        conn.subscribe("r", "/topic/t", AckMode.AUTO, offset="yesterday")


def test_retention_by_bytes_drops_the_oldest() -> None:
    h = Harness(policy={"retention_bytes": 1})
    producer, _ = h.connect()
    for i in range(3):
        h.send(producer, "/topic/r", b"x" * 100 + b"%d" % i)
    topic = _topic(h, "/topic/r")
    # The newest message covers the byte retention; older ones may go (the floor is coarse, so
    # at least the newest stays).
    assert 1 <= topic.depth <= 3
    reader, link = h.connect()
    reader.subscribe("r", "/topic/r", AckMode.AUTO, offset="earliest")
    h.loop.run()
    assert link.bodies()[-1].endswith(b"2")


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
    red.subscribe("s", "/queue/cars", AckMode.AUTO, selector="colour = 'red' AND weight > 1000")
    urgent, urgent_link = h.connect()
    urgent.subscribe("s", "/queue/cars", AckMode.AUTO, selector="JMSPriority >= 7")
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
        conn.subscribe("s", "/queue/q", AckMode.AUTO, selector="colour = = 'red'")


def test_exclusive_consumer_takes_everything_and_the_next_takes_over() -> None:
    h = Harness()
    producer, _ = h.connect()
    first, first_link = h.connect()
    first.subscribe("s", "/queue/x", AckMode.CLIENT_INDIVIDUAL, exclusive=True)
    second, second_link = h.connect()
    second.subscribe("s", "/queue/x", AckMode.CLIENT_INDIVIDUAL, exclusive=True)
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
    consumer.subscribe("s", "/queue/g", AckMode.CLIENT_INDIVIDUAL, max_open_groups=1)
    h.send(producer, "/queue/g", b"a1", headers={"JMSXGroupID": "A"})
    consumer.ack(link.take()[0][2])
    h.send(producer, "/queue/g", b"b1", headers={"JMSXGroupID": "B"})
    assert link.bodies() == []  # A is still open and not yet idle
    h.now += 2000
    h.send(producer, "/queue/g", b"b2", headers={"JMSXGroupID": "B"})
    assert link.bodies() == [b"b1", b"b2"]
    assert h.broker.counters["message_groups_idle_released"] == 1
