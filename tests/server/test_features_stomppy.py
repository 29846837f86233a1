"""Each messaging feature through stomp.py: priorities, DLQ, expiry, exclusive consumers, groups,
duplicate detection, durable subscriptions, x-offset, wildcards and selectors."""

from __future__ import annotations

import time
import uuid
from typing import Any

import stomp

from conftest import RunningBroker, start_broker
from server.test_interop_stomppy import Collector, _connect, _subscribe


def _name(kind: str) -> str:
    return f"/{kind}/feature-{uuid.uuid4().hex[:12]}"


def test_priorities_higher_first_and_headers_untouched(broker: RunningBroker) -> None:
    dest = _name("queue")
    conn, col = _connect(broker.port)
    for body, priority in [("low", 1), ("high", 9), ("mid", 5), ("high-2", 9)]:
        conn.send(
            dest,
            body,
            headers={
                "priority": str(priority),
                "reply-to": "/queue/replies",
                "correlation-id": "c-" + body,
                "type": "order",
                "custom": "v:1",
            },
            receipt="r-" + body,
        )
        col.receipt("r-" + body)
    _subscribe(conn, col, dest, "s", "auto")
    frames = [col.message() for _ in range(4)]
    assert [f.body for f in frames] == ["high", "high-2", "mid", "low"]
    assert frames[0].headers["reply-to"] == "/queue/replies"
    assert frames[0].headers["correlation-id"] == "c-high"
    assert frames[0].headers["type"] == "order"
    assert frames[0].headers["custom"] == "v:1"
    conn.disconnect()


def test_dead_letter_queue_after_max_redeliveries() -> None:
    running = start_broker(policy={"max_redeliveries": 1})
    try:
        dest = _name("queue")
        conn, col = _connect(running.port)
        _subscribe(conn, col, dest, "s", "client-individual")
        conn.send(dest, "poison")
        for expected_count in ("1", "2"):
            frame = col.message()
            assert frame.headers["x-delivery-count"] == expected_count
            conn.nack(frame.headers["ack"])
        assert col.no_message()
        short = dest[len("/queue/") :]
        _subscribe(conn, col, f"/queue/DLQ.{short}", "dlq", "auto")
        dead = col.message()
        assert dead.body == "poison"
        assert dead.headers["x-original-destination"] == dest
        assert "max_redeliveries=1" in dead.headers["x-dlq-reason"]
        conn.disconnect()
    finally:
        running.stop()


def test_expired_message_goes_to_dlq(broker: RunningBroker) -> None:
    dest = _name("queue")
    conn, col = _connect(broker.port)
    already = int(time.time() * 1000) - 1
    conn.send(dest, "stale", headers={"expires": str(already)}, receipt="r1")
    col.receipt("r1")
    conn.send(dest, "fresh", receipt="r2")
    col.receipt("r2")
    _subscribe(conn, col, dest, "s", "auto")
    assert col.message().body == "fresh"
    assert col.no_message()
    short = dest[len("/queue/") :]
    _subscribe(conn, col, f"/queue/DLQ.{short}", "dlq", "auto")
    assert col.message().headers["x-dlq-reason"] == "expired"
    conn.disconnect()


def test_exclusive_consumer(broker: RunningBroker) -> None:
    dest = _name("queue")
    first, col1 = _connect(broker.port)
    second, col2 = _connect(broker.port)
    _subscribe(first, col1, dest, "s", "client-individual", **{"activemq.exclusive": "true"})
    _subscribe(second, col2, dest, "s", "client-individual", **{"activemq.exclusive": "true"})
    for i in range(3):
        first.send(dest, str(i))
    assert [col1.message().body for _ in range(3)] == ["0", "1", "2"]
    assert col2.no_message()
    first.disconnect()
    taken_over = [col2.message() for _ in range(3)]
    assert [f.body for f in taken_over] == ["0", "1", "2"]
    assert all(f.headers["redelivered"] == "true" for f in taken_over)
    second.disconnect()


def test_message_groups_stick_close_and_respect_max_open_groups(broker: RunningBroker) -> None:
    dest = _name("queue")
    consumers = [_connect(broker.port) for _ in range(2)]
    for i, (conn, col) in enumerate(consumers):
        _subscribe(conn, col, dest, f"s{i}", "client-individual", **{"x-max-open-groups": "1"})
    producer, pcol = _connect(broker.port)
    for n in range(3):
        for group in ("A", "B", "C"):
            producer.send(dest, f"{group}{n}", headers={"JMSXGroupID": group})
    producer.send(dest, "A-end", headers={"JMSXGroupID": "A", "JMSXGroupSeq": "-1"}, receipt="r")
    pcol.receipt("r")
    # One open group each: A and B are taken, C waits for a consumer with room.
    first = {i: [col.message() for _ in range(3)] for i, (_, col) in enumerate(consumers)}
    owner = {frames[0].headers["JMSXGroupID"]: i for i, frames in first.items()}
    assert sorted(owner) == ["A", "B"]
    for group, i in owner.items():
        assert [f.body for f in first[i]] == [f"{group}{n}" for n in range(3)]
    a_conn, a_col = consumers[owner["A"]]
    _, b_col = consumers[owner["B"]]
    a_end = a_col.message()
    assert a_end.body == "A-end"
    # C waits: both consumers have their one group.
    assert a_col.no_message()
    assert b_col.no_message()
    # A closes once its last message is acknowledged: its consumer takes C, in order.
    for frame in first[owner["A"]]:
        a_conn.ack(frame.headers["ack"])
    assert a_col.no_message()  # A-end is not acknowledged yet: A is still open
    a_conn.ack(a_end.headers["ack"])
    assert [a_col.message().body for _ in range(3)] == ["C0", "C1", "C2"]
    assert b_col.no_message()
    producer.disconnect()
    for conn, _ in consumers:
        conn.disconnect()


def test_duplicate_detection(broker: RunningBroker) -> None:
    dest = _name("queue")
    conn, col = _connect(broker.port)
    for body in ("first", "second"):
        conn.send(dest, body, headers={"x-dedup-id": "same-id"}, receipt="r-" + body)
        col.receipt("r-" + body)  # both are receipted
    _subscribe(conn, col, dest, "s", "auto")
    assert col.message().body == "first"
    assert col.no_message()
    conn.disconnect()


def test_durable_subscription_across_connections(broker: RunningBroker) -> None:
    topic = _name("topic")
    client_id = "durable-" + uuid.uuid4().hex[:8]
    durable = {"activemq.subscriptionName": "audit"}
    s_conn, s_col = _connect_with_client_id(broker.port, client_id)
    _subscribe(s_conn, s_col, topic, "d", "client-individual", **durable)
    s_conn.disconnect()
    producer, pcol = _connect(broker.port)
    for i in range(3):
        producer.send(topic, f"m{i}", receipt=f"r{i}")
        pcol.receipt(f"r{i}")
    back, back_col = _connect_with_client_id(broker.port, client_id)
    _subscribe(back, back_col, topic, "d", "auto", **durable)
    assert [back_col.message().body for _ in range(3)] == ["m0", "m1", "m2"]
    back.unsubscribe("d", headers=durable, receipt="gone")
    back_col.receipt("gone")
    back.disconnect()
    # Deleted, not detached: what is published now is kept for nobody, and subscribing again
    # with the same name starts a new subscription.
    producer.send(topic, "after delete", receipt="r9")
    pcol.receipt("r9")
    assert broker.call(lambda: broker.server.broker.destinations[topic].durables) == {}
    again, again_col = _connect_with_client_id(broker.port, client_id)
    _subscribe(again, again_col, topic, "d", "auto", **durable)
    assert again_col.no_message()
    producer.send(topic, "new", receipt="r10")
    pcol.receipt("r10")
    assert again_col.message().body == "new"
    again.disconnect()
    producer.disconnect()


def test_duplicate_transaction_id_is_an_error_naming_it(broker: RunningBroker) -> None:
    conn, col = _connect(broker.port)
    conn.begin("tx-1")
    conn.begin("tx-1")
    error = col.errors.get(timeout=10)
    assert "tx-1" in error.headers["message"]
    assert "already open" in error.headers["message"]


def _connect_with_client_id(port: int, client_id: str) -> tuple[Any, Collector]:
    conn = stomp.Connection12([("127.0.0.1", port)])
    collector = Collector()
    conn.set_listener("collector", collector)
    conn.connect(wait=True, headers={"client-id": client_id})
    return conn, collector


def test_x_offset_replays_a_retained_topic() -> None:
    running = start_broker(policy={"retention_s": 3600.0})
    try:
        topic = _name("topic")
        producer, pcol = _connect(running.port)
        for i in range(5):
            producer.send(topic, f"e{i}", receipt=f"r{i}")
            pcol.receipt(f"r{i}")
        reader, rcol = _connect(running.port)
        _subscribe(reader, rcol, topic, "r", "auto", **{"x-offset": "earliest"})
        frames = [rcol.message() for _ in range(5)]
        assert [f.body for f in frames] == [f"e{i}" for i in range(5)]
        offsets = [int(f.headers["x-offset"]) for f in frames]
        assert offsets == list(range(offsets[0], offsets[0] + 5))
        middle, mcol = _connect(running.port)
        _subscribe(middle, mcol, topic, "m", "auto", **{"x-offset": str(offsets[3])})
        assert [mcol.message().body for _ in range(2)] == ["e3", "e4"]
        for conn in (producer, reader, middle):
            conn.disconnect()
    finally:
        running.stop()


def test_wildcards_and_selectors(broker: RunningBroker) -> None:
    prefix = "PRICE" + uuid.uuid4().hex[:6]
    watcher, wcol = _connect(broker.port)
    _subscribe(watcher, wcol, f"/topic/{prefix}.>", "all", "auto")
    picky, pcol = _connect(broker.port)
    _subscribe(
        picky,
        pcol,
        f"/topic/{prefix}.*.NYSE",
        "nyse",
        "auto",
        selector="price > 100 AND symbol LIKE 'IB%'",
    )
    producer, prod_col = _connect(broker.port)
    sends = [
        (f"/topic/{prefix}.STOCK.NYSE", {"symbol": "IBM", "price": "140"}),
        (f"/topic/{prefix}.STOCK.NYSE", {"symbol": "IBM", "price": "90"}),
        (f"/topic/{prefix}.STOCK.NASDAQ", {"symbol": "IBKR", "price": "150"}),
        ("/topic/OTHER", {"symbol": "IBM", "price": "500"}),
    ]
    for i, (dest, headers) in enumerate(sends):
        producer.send(dest, f"p{i}", headers=headers, receipt=f"r{i}")
        prod_col.receipt(f"r{i}")
    assert sorted(wcol.message().body for _ in range(3)) == ["p0", "p1", "p2"]
    assert wcol.no_message()
    assert pcol.message().body == "p0"
    assert pcol.no_message()
    for conn in (watcher, picky, producer):
        conn.disconnect()


def test_bad_selector_error_reaches_stomp_py(broker: RunningBroker) -> None:
    conn, col = _connect(broker.port)
    conn.subscribe("/queue/x", id="s", ack="auto", headers={"selector": "price >"})
    error = col.errors.get(timeout=10)
    assert "selector" in error.headers["message"]
