"""The broker over real sockets, byte for byte: connects, receipts, ack modes, credit, errors."""

from __future__ import annotations

import pytest

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp


def _send(port: int, dest: str, bodies: list[bytes], headers: str = "") -> None:
    producer = RawStomp(port)
    producer.connect()
    for i, body in enumerate(bodies):
        producer.send(
            f"SEND\ndestination:{dest}\n{headers}content-length:{len(body)}\nreceipt:s{i}\n\n".encode()
            + body
            + b"\0"
        )
        assert producer.frame().headers["receipt-id"] == f"s{i}"
    producer.close()


# -- connecting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "expected"), [("1.0", None), ("1.1", "1.1"), ("1.2", "1.2"), ("1.0,1.1,1.2", "1.2")]
)
def test_version_negotiation(broker: RunningBroker, offered: str, expected: str | None) -> None:
    c = RawStomp(broker.port)
    connected = c.connect(offered)
    # A 1.0 CONNECTED may omit the version header.
    assert connected.headers.get("version", "1.0") == (expected or "1.0")
    c.close()


def test_connect_without_accept_version_is_stomp_1_0(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.send(b"CONNECT\n\n\0")
    frame = c.frame()
    assert frame.command == "CONNECTED"
    assert frame.headers.get("version", "1.0") == "1.0"


def test_stomp_command_is_a_synonym_of_connect(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.send(b"STOMP\naccept-version:1.2\nhost:localhost\n\n\0")
    assert c.frame().headers["version"] == "1.2"


def test_no_common_version_is_an_error_then_close(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.send(b"CONNECT\naccept-version:2.0\nhost:x\n\n\0")
    error = c.frame()
    assert error.command == "ERROR"
    assert "1.2" in error.headers["message"]
    assert c.closed()


def test_frame_before_connect_is_an_error(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.send(b"SEND\ndestination:/queue/a\n\nx\0")
    assert c.frame().command == "ERROR"
    assert c.closed()


# -- receipts ----------------------------------------------------------------------------------


def test_every_frame_with_receipt_gets_one_disconnect_too(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    frames = [
        b"SUBSCRIBE\nid:1\ndestination:/queue/r\nreceipt:a\n\n\0",
        b"SEND\ndestination:/queue/other\nreceipt:b\n\nx\0",
        b"BEGIN\ntransaction:t\nreceipt:c\n\n\0",
        b"ABORT\ntransaction:t\nreceipt:d\n\n\0",
        b"UNSUBSCRIBE\nid:1\nreceipt:e\n\n\0",
        b"SEND\ndestination:/queue/other\npersistent:true\nreceipt:f\n\ny\0",
        b"DISCONNECT\nreceipt:g\n\n\0",
    ]
    for data in frames:
        c.send(data)
    ids = [c.frame().headers["receipt-id"] for _ in frames]
    assert ids == ["a", "b", "c", "d", "e", "f", "g"]
    assert c.closed()


def test_receipt_ids_round_trip_escapes(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SEND\ndestination:/queue/x\nreceipt:ID\\cbroker\\c1\n\nx\0")
    assert c.frame().headers["receipt-id"] == "ID:broker:1"


# -- delivery and acknowledgement ---------------------------------------------------------------


def test_message_carries_headers_and_content_length_with_nuls(broker: RunningBroker) -> None:
    body = b"a\0b\0c"
    _send(
        broker.port,
        "/queue/h",
        [body],
        "reply-to:/queue/back\ncorrelation-id:42\ntype:t\ncolour:blue\n",
    )
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:s\ndestination:/queue/h\n\n\0")
    msg = c.frame()
    assert msg.command == "MESSAGE"
    assert msg.body == body
    assert msg.headers["content-length"] == "5"
    for name, value in [
        ("reply-to", "/queue/back"),
        ("correlation-id", "42"),
        ("type", "t"),
        ("colour", "blue"),
        ("destination", "/queue/h"),
        ("subscription", "s"),
        ("x-delivery-count", "1"),
    ]:
        assert msg.headers[name] == value
    assert "redelivered" not in msg.headers


def test_content_length_is_sent_even_when_send_had_none(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:s\ndestination:/queue/cl\n\n\0SEND\ndestination:/queue/cl\n\nhello\0")
    msg = c.frame()
    assert msg.headers["content-length"] == "5"
    assert msg.body == b"hello"


def test_auto_ack_delivers_everything_in_order(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/auto", [b"%d" % i for i in range(50)])
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/auto\nack:auto\n\n\0")
    messages = [c.frame() for _ in range(50)]
    assert [m.body for m in messages] == [b"%d" % i for i in range(50)]
    # Auto-acknowledged deliveries carry no ack id: there is nothing to acknowledge.
    assert all("ack" not in m.headers for m in messages)
    c.close()


def test_client_ack_is_cumulative(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/cum", [b"1", b"2", b"3"])
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/cum\nack:client\n\n\0")
    msgs = [c.frame() for _ in range(3)]
    # Acknowledge the second: the first goes with it; the third stays unacknowledged.
    c.send(b"ACK\nid:" + msgs[1].headers["ack"].encode() + b"\nreceipt:r\n\n\0")
    assert c.frame().headers["receipt-id"] == "r"
    c.close()
    again = RawStomp(broker.port)
    again.connect()
    again.send(b"SUBSCRIBE\nid:1\ndestination:/queue/cum\nack:client\n\n\0")
    redelivered = again.frame()
    assert redelivered.body == b"3"
    assert redelivered.headers["redelivered"] == "true"
    assert redelivered.headers["x-delivery-count"] == "2"
    with pytest.raises(TimeoutError):
        again.frame(timeout=0.3)


def test_client_individual_ack_is_not_cumulative(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/ind", [b"1", b"2", b"3"])
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/ind\nack:client-individual\n\n\0")
    msgs = [c.frame() for _ in range(3)]
    c.send(b"ACK\nid:" + msgs[1].headers["ack"].encode() + b"\nreceipt:r\n\n\0")
    assert c.frame().headers["receipt-id"] == "r"
    c.close()
    again = RawStomp(broker.port)
    again.connect()
    again.send(b"SUBSCRIBE\nid:1\ndestination:/queue/ind\nack:client-individual\n\n\0")
    assert [again.frame().body for _ in range(2)] == [b"1", b"3"]


def test_nack_redelivers_with_count(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/nack", [b"only"])
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/nack\nack:client-individual\n\n\0")
    first = c.frame()
    c.send(b"NACK\nid:" + first.headers["ack"].encode() + b"\n\n\0")
    second = c.frame()
    assert second.body == b"only"
    assert second.headers["redelivered"] == "true"
    assert second.headers["x-delivery-count"] == "2"
    assert second.headers["ack"] != first.headers["ack"]


def test_unacked_messages_return_in_order_when_consumer_leaves(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/back", [b"%d" % i for i in range(10)])
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/back\nack:client-individual\n\n\0")
    msgs = [c.frame() for _ in range(10)]
    for m in msgs[:4]:
        c.send(b"ACK\nid:" + m.headers["ack"].encode() + b"\n\n\0")
    c.send(b"DISCONNECT\nreceipt:bye\n\n\0")
    assert c.frame().headers["receipt-id"] == "bye"
    d = RawStomp(broker.port)
    d.connect()
    d.send(b"SUBSCRIBE\nid:1\ndestination:/queue/back\nack:client-individual\n\n\0")
    back = [d.frame() for _ in range(6)]
    assert [m.body for m in back] == [b"%d" % i for i in range(4, 10)]
    assert all(m.headers["redelivered"] == "true" for m in back)


def test_prefetch_credit_in_messages(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/credit", [b"%d" % i for i in range(5)])
    c = RawStomp(broker.port)
    c.connect()
    c.send(
        b"SUBSCRIBE\nid:1\ndestination:/queue/credit\nack:client-individual\n"
        b"activemq.prefetchSize:2\n\n\0"
    )
    first, second = c.frame(), c.frame()
    with pytest.raises(TimeoutError):
        c.frame(timeout=0.3)
    c.send(b"ACK\nid:" + first.headers["ack"].encode() + b"\n\n\0")
    assert c.frame().body == b"2"
    assert second.body == b"1"


def test_prefetch_credit_in_bytes(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/bytes", [b"x" * 1000 for _ in range(5)])
    c = RawStomp(broker.port)
    c.connect()
    c.send(
        b"SUBSCRIBE\nid:1\ndestination:/queue/bytes\nack:client-individual\n"
        b"x-prefetch-bytes:2500\n\n\0"
    )
    got = [c.frame() for _ in range(2)]  # 2 x 1000 bytes: a third would cross the credit
    with pytest.raises(TimeoutError):
        c.frame(timeout=0.3)
    c.send(b"ACK\nid:" + got[0].headers["ack"].encode() + b"\n\n\0")
    c.frame()


def test_round_robin_between_consumers(broker: RunningBroker) -> None:
    a, b = RawStomp(broker.port), RawStomp(broker.port)
    for c in (a, b):
        c.connect()
        c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/rr\nreceipt:r\n\n\0")
        assert c.frame().command == "RECEIPT"
    _send(broker.port, "/queue/rr", [b"%d" % i for i in range(10)])
    got_a = [a.frame().body for _ in range(5)]
    got_b = [b.frame().body for _ in range(5)]
    assert sorted(got_a + got_b) == sorted(b"%d" % i for i in range(10))
    assert got_a == sorted(got_a, key=int)


def test_topic_fans_out_to_current_subscribers(broker: RunningBroker) -> None:
    subs = [RawStomp(broker.port) for _ in range(3)]
    for c in subs:
        c.connect()
        c.send(b"SUBSCRIBE\nid:t\ndestination:/topic/news\nreceipt:r\n\n\0")
        assert c.frame().command == "RECEIPT"
    _send(broker.port, "/topic/news", [b"a", b"b"])
    for c in subs:
        first, second = c.frame(), c.frame()
        assert (first.body, second.body) == (b"a", b"b")
        assert int(second.headers["x-offset"]) == int(first.headers["x-offset"]) + 1


# -- STOMP 1.0 and 1.1 --------------------------------------------------------------------------


def test_stomp_1_0_subscribe_without_id_ack_by_message_id(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/old", [b"1", b"2"])
    c = RawStomp(broker.port)
    c.connect("1.0")
    c.send(b"SUBSCRIBE\ndestination:/queue/old\nack:client\n\n\0")
    first = c.frame()
    c.frame()
    c.send(b"ACK\nmessage-id:" + first.headers["message-id"].encode() + b"\nreceipt:r\n\n\0")
    assert c.frame().headers["receipt-id"] == "r"
    c.send(b"UNSUBSCRIBE\ndestination:/queue/old\nreceipt:u\n\n\0")
    assert c.frame().headers["receipt-id"] == "u"
    c.close()
    d = RawStomp(broker.port)
    d.connect("1.0")
    d.send(b"SUBSCRIBE\ndestination:/queue/old\n\n\0")
    assert d.frame().body == b"2"


def test_stomp_1_1_ack_by_message_id_and_subscription(broker: RunningBroker) -> None:
    _send(broker.port, "/queue/one-one", [b"1"])
    c = RawStomp(broker.port)
    c.connect("1.1")
    c.send(b"SUBSCRIBE\nid:s1\ndestination:/queue/one-one\nack:client-individual\n\n\0")
    m = c.frame()
    c.send(
        b"ACK\nsubscription:s1\nmessage-id:"
        + m.headers["message-id"].encode().replace(b":", b"\\c")
        + b"\nreceipt:r\n\n\0"
    )
    assert c.frame().command == "RECEIPT"


# -- errors -------------------------------------------------------------------------------------


def _expect_error(c: RawStomp, data: bytes, receipt: str | None = None) -> None:
    c.send(data)
    error = c.frame()
    assert error.command == "ERROR", error
    assert error.headers["message"]
    if receipt is not None:
        assert error.headers["receipt-id"] == receipt
    assert c.closed()


def test_undefined_escape_is_an_error(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    _expect_error(c, b"SEND\ndestination:/queue/a\nbad:x\\ty\n\nbody\0")


def test_send_without_destination_names_it(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SEND\nreceipt:r1\n\nbody\0")
    error = c.frame()
    assert error.command == "ERROR"
    assert "destination" in error.headers["message"]
    assert error.headers["receipt-id"] == "r1"
    assert c.closed()


@pytest.mark.parametrize(
    ("frame", "receipt"),
    [
        (b"SEND\nreceipt:r1\n\nbody\0", "r1"),  # no destination
        (b"ACK\nreceipt:r1\n\n\0", "r1"),  # no id
        (b"SUBSCRIBE\nid:1\ndestination:/queue/a\nreceipt:r1\n\nnot allowed\0", "r1"),
        (b"SUBSCRIBE\nid:1\ndestination:/queue/a\nreceipt:r1\ncontent-length:3\n\nabc\0", "r1"),
        (b"SEND\ndestination:/queue/a\nreceipt:r1\ncontent-length:1\n\nxy\0", "r1"),
        (b"SEND\ndestination:/queue/a\nreceipt:r1\ncontent-length:z\n\nx\0", "r1"),
        (b"CONNECT\naccept-version:1.2\nreceipt:r1\n\n\0", "r1"),  # connected already
        # Not a frame at all, but the receipt header could be read: it is named.
        (b"SEND\ndestination:/queue/a\nreceipt:r\\c1\nbad:x\\ty\n\nbody\0", "r:1"),
        (b"SEND\ndestination:/queue/a\nbad:x\\ty\nreceipt:r1\n\nbody\0", "r1"),
        # The receipt header itself cannot be read: no receipt-id rather than a guess.
        (b"SEND\ndestination:/queue/a\nreceipt:r\\t1\n\nbody\0", None),
        (b"SEND\ndestination:/queue/a\nreceipt\n\nbody\0", None),
    ],
)
def test_protocol_error_names_the_receipt_of_the_failing_frame(
    broker: RunningBroker, frame: bytes, receipt: str | None
) -> None:
    c = RawStomp(broker.port)
    c.connect()
    c.send(frame)
    error = c.frame()
    assert error.command == "ERROR", error
    assert error.headers.get("receipt-id") == receipt
    assert c.closed()


def test_refused_connect_names_its_receipt(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.send(b"CONNECT\naccept-version:2.0\nhost:x\nreceipt:c1\n\n\0")
    error = c.frame()
    assert error.command == "ERROR"
    assert error.headers["receipt-id"] == "c1"
    assert c.closed()


def test_frame_limit_error_names_the_receipt(small_broker: RunningBroker) -> None:
    c = RawStomp(small_broker.port)
    c.connect()
    headers = b"".join(b"h%d:v\n" % i for i in range(20))
    c.send(b"SEND\ndestination:/queue/a\nreceipt:big\n" + headers + b"\nx\0")
    error = c.frame()
    assert "max_headers" in error.headers["message"]
    assert error.headers["receipt-id"] == "big"


def test_body_on_a_frame_that_must_not_have_one(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    _expect_error(c, b"SUBSCRIBE\nid:1\ndestination:/queue/a\n\nnot allowed\0")


def test_ack_of_unknown_id_with_receipt(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    _expect_error(c, b"ACK\nid:999999\nreceipt:r-9\n\n\0", receipt="r-9")


def test_unknown_transaction_is_named(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"COMMIT\ntransaction:nope\nreceipt:r\n\n\0")
    error = c.frame()
    assert "nope" in error.headers["message"]
    assert error.headers["receipt-id"] == "r"


def test_bad_destination_is_an_error(broker: RunningBroker) -> None:
    c = RawStomp(broker.port)
    c.connect()
    _expect_error(c, b"SEND\ndestination:nowhere\nreceipt:r\n\nx\0", receipt="r")


@pytest.fixture
def small_broker() -> RunningBroker:
    running = start_broker(
        limits={"max_frame_bytes": 4096, "max_header_bytes": 1024, "max_headers": 8}
    )
    yield running  # type: ignore[misc]
    running.stop()


def test_oversize_frame(small_broker: RunningBroker) -> None:
    c = RawStomp(small_broker.port)
    c.connect()
    c.send(b"SEND\ndestination:/queue/a\n\n" + b"x" * 5000)
    error = c.frame()
    assert error.command == "ERROR"
    assert "max_frame_bytes" in error.headers["message"]
    assert c.closed()


def test_oversize_content_length_refused_before_the_body(small_broker: RunningBroker) -> None:
    c = RawStomp(small_broker.port)
    c.connect()
    c.send(b"SEND\ndestination:/queue/a\ncontent-length:1000000000\n\n")
    error = c.frame()
    assert "max_frame_bytes" in error.headers["message"]


def test_too_many_headers(small_broker: RunningBroker) -> None:
    c = RawStomp(small_broker.port)
    c.connect()
    headers = b"".join(b"h%d:v\n" % i for i in range(20))
    c.send(b"SEND\ndestination:/queue/a\n" + headers + b"\nx\0")
    error = c.frame()
    assert "max_headers" in error.headers["message"]
    assert c.closed()


def test_oversize_header_block(small_broker: RunningBroker) -> None:
    c = RawStomp(small_broker.port)
    c.connect()
    c.send(b"SEND\ndestination:/queue/a\nbig:" + b"v" * 2000 + b"\n\nx\0")
    error = c.frame()
    assert "max_header_bytes" in error.headers["message"]


# -- heart-beats --------------------------------------------------------------------------------


@pytest.fixture
def beating_broker() -> RunningBroker:
    running = start_broker(heartbeat={"send_ms": 100, "receive_ms": 100, "grace_factor": 2.0})
    yield running  # type: ignore[misc]
    running.stop()


def test_silent_client_is_timed_out(beating_broker: RunningBroker) -> None:
    c = RawStomp(beating_broker.port)
    connected = c.connect(extra="heart-beat:100,0\n")
    assert connected.headers["heart-beat"].split(",")[1] == "100"
    # We promised a beat every 100 ms and send nothing: closed after about 200 ms.
    assert c.closed(timeout=5)
    assert beating_broker.stats().get("heartbeat_timeouts") == 1


def test_broker_sends_heartbeats(beating_broker: RunningBroker) -> None:
    c = RawStomp(beating_broker.port)
    c.connect(extra="heart-beat:0,100\n")
    with pytest.raises(TimeoutError):
        c.frame(timeout=0.6)
    assert c.heartbeats >= 2
    assert not c.closed(timeout=0.1)


def test_client_that_beats_stays_connected(beating_broker: RunningBroker) -> None:
    c = RawStomp(beating_broker.port)
    c.connect(extra="heart-beat:50,0\n")
    for i in range(8):
        c.send(b"\n")
        with pytest.raises(TimeoutError):
            c.frame(timeout=0.05)
        del i
    c.send(b"SEND\ndestination:/queue/a\nreceipt:alive\n\nx\0")
    assert c.frame().headers["receipt-id"] == "alive"


def test_subscribe_receipt_on_a_topic_carries_its_offsets(broker: RunningBroker) -> None:
    _send(broker.port, "/topic/offsets", [b"nobody hears this"])
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/topic/offsets\nreceipt:r\n\n\0")
    receipt = c.frame()
    assert receipt.headers["x-last-offset"] == "1"
    assert receipt.headers["x-first-offset"] == "2"  # nothing is kept: the next one is first
    _send(broker.port, "/topic/offsets", [b"heard"])
    assert c.frame().headers["x-offset"] == "2"


def test_connection_limit_is_named_and_counted() -> None:
    running = start_broker(limits={"max_connections": 2})
    try:
        kept = [RawStomp(running.port) for _ in range(2)]
        for c in kept:
            c.connect()
        refused = RawStomp(running.port)
        error = refused.frame()
        assert error.command == "ERROR"
        assert "max_connections=2" in error.headers["message"]
        assert refused.closed()
        assert running.stats()["limit_max_connections"] == 1
        kept[0].close()
        # A slot freed: a new connection is accepted once the broker saw the close.
        for _attempt in range(50):
            again = RawStomp(running.port)
            again.send(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
            if again.frame().command == "CONNECTED":
                break
        else:
            raise AssertionError("never accepted again")
    finally:
        running.stop()


def test_unsubscribe_receipt_on_a_topic_says_where_the_cursor_stopped(
    broker: RunningBroker,
) -> None:
    c = RawStomp(broker.port)
    c.connect()
    c.send(b"SUBSCRIBE\nid:1\ndestination:/topic/cursor\nreceipt:s\n\n\0")
    assert c.frame().command == "RECEIPT"
    _send(broker.port, "/topic/cursor", [b"a", b"b"])
    assert [c.frame().body for _ in range(2)] == [b"a", b"b"]
    c.send(b"UNSUBSCRIBE\nid:1\nreceipt:u\n\n\0")
    assert c.frame().headers["x-next-offset"] == "3"


def test_a_producer_held_back_by_flow_control_is_not_timed_out() -> None:
    running = start_broker(
        heartbeat={"send_ms": 100, "receive_ms": 100},
        limits={"destination_memory_limit_bytes": 4096},
    )
    try:
        producer = RawStomp(running.port)
        producer.connect(extra="heart-beat:100,0\n")
        for _ in range(3):  # the queue is over its limit after these: reading stops
            producer.send(b"SEND\ndestination:/queue/held\n\n" + b"x" * 3000 + b"\0")
        # The producer keeps beating; the broker does not read them while it holds it back.
        for _ in range(10):
            producer.send(b"\n")
            with pytest.raises(TimeoutError):
                producer.frame(timeout=0.1)
        assert running.stats().get("heartbeat_timeouts", 0) == 0
        consumer = RawStomp(running.port)
        consumer.connect()
        consumer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/held\n\n\0")
        assert len(consumer.frame().body) == 3000
        producer.send(b"SEND\ndestination:/queue/held\nreceipt:alive\n\nx\0")
        assert producer.frame().headers["receipt-id"] == "alive"
    finally:
        running.stop()
