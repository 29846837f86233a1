"""Range reads (a block of a topic's log in one MESSAGE, from memory and from the journal) and
records blocks (many messages in one SEND)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RunningBroker, start_broker
from sluice.errors import BrokerErrorFrame
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command, Frame
from sluice.stomp.records import encode_block

pyarrow = pytest.importorskip("pyarrow", reason="the block decoder needs the spark extra")
from sluice.spark.blocks import decode_block  # noqa: E402


@pytest.fixture
def journal_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A journal store whose topics keep a day, holding little in memory: reads hit the store."""
    running = start_broker(
        store={"kind": "journal", "data_dir": str(tmp_path / "data")},
        policy={"retention_s": 86400.0},
        limits={"destination_memory_limit_bytes": 64 * 1024},
    )
    try:
        yield running
    finally:
        running.stop()


def _publish(session: WireSession, topic: str, count: int) -> None:
    for i in range(count):
        headers = {"destination": topic, "persistent": "true", "n": str(i)}
        session.send(Command.SEND, headers, b"%d:" % i + b"x" * 1000)
    session.request(Command.SEND, {"destination": "/queue/flush"})


def _block(session: WireSession, topic: str, start: int, end: int, **extra: str) -> Frame:
    headers = {"destination": topic, "id": "b", "x-offset": str(start), "x-range-end": str(end)}
    session.request(Command.SUBSCRIBE, {**headers, **extra})
    [frame] = session.take_messages()
    return frame


def test_blocks_from_the_journal_are_exact_and_bounded(journal_broker: RunningBroker) -> None:
    topic = "/topic/range.journal"
    with WireSession.open(journal_broker.address) as session:
        _publish(session, topic, 300)  # 300 KiB: most of it only in the store
        frame = _block(session, topic, 10, 200, **{"x-range-max-count": "50"})
        h = frame.headers
        assert (h["x-range-count"], h["x-range-next"]) == ("50", "60")
        assert (h["x-first-offset"], h["x-last-offset"]) == ("1", "300")
        batch, count = decode_block(frame.body, topic)
        assert count == 50
        assert batch.column("offset").to_pylist() == list(range(10, 60))
        assert batch.column("body")[0].as_py() == b"9:" + b"x" * 1000
        assert dict(batch.column("headers")[0].as_py()) == {"persistent": "true", "n": "9"}
        # A byte budget stops a block early, but never before one message.
        small = _block(session, topic, 60, 200, **{"x-range-max-bytes": "1"})
        assert small.headers["x-range-count"] == "1"
        # Past the visible end: nothing, and the next offset stays put.
        empty = _block(session, topic, 301, 400)
        assert (empty.headers["x-range-count"], empty.headers["x-range-next"]) == ("0", "301")
        # The broker keeps no subscription for a range read.
        assert (
            journal_broker.call(
                lambda: len(journal_broker.server.broker.destinations[topic].subscriptions)
            )
            == 0
        )


def test_a_range_read_of_a_queue_is_refused(journal_broker: RunningBroker) -> None:
    with WireSession.open(journal_broker.address) as session:
        with pytest.raises(BrokerErrorFrame, match="reads a topic"):
            _block(session, "/queue/range.q", 1, 5)


# -- records blocks: many messages in one SEND -----------------------------------------------------


def _records(*rows: tuple[dict[str, str], bytes]) -> bytes:
    class Row:
        seq = timestamp_ms = expires_ms = 0
        message_id = ""
        priority = 4
        persistent = False

        def __init__(self, headers: dict[str, str], body: bytes) -> None:
            self.headers, self.body = headers, body

    return b"".join(encode_block([Row(h, b) for h, b in rows]))


def _drain(session: WireSession, queue: str, expected: int) -> list[Frame]:
    session.request(Command.SUBSCRIBE, {"destination": queue, "id": "q", "ack": "auto"})
    frames = session.take_messages()
    while len(frames) < expected:
        frames.append(session.receive())
    return frames


def test_a_records_block_sends_each_row_once(journal_broker: RunningBroker) -> None:
    queue = "/queue/records.once"
    block = _records(
        ({"x-dedup-id": "w:0", "k": "a"}, b"zero"),
        ({"x-dedup-id": "w:1", "destination": "/queue/elsewhere"}, b"one"),
        ({"x-dedup-id": "w:2"}, b""),
    )
    before = journal_broker.stats().get("duplicates_dropped", 0)
    with WireSession.open(journal_broker.address) as session:
        for tx in ("t1", "t2"):  # the second is a replay: every id is a duplicate
            session.send(Command.BEGIN, {"transaction": tx})
            headers = {"destination": queue, "transaction": tx, "persistent": "true"}
            session.send(Command.SEND, {**headers, "x-records-block": "1"}, block)
            session.request(Command.COMMIT, {"transaction": tx})
        session.set_timeout(10)
        frames = _drain(session, queue, 3)
        session.set_timeout(0.5)
        with pytest.raises(TimeoutError):
            session.receive()
    assert [f.body for f in frames] == [b"zero", b"one", b""]
    assert frames[0].headers["k"] == "a"
    assert frames[0].headers["persistent"] == "true"
    assert all(f.headers["destination"] == queue for f in frames)
    assert journal_broker.stats().get("duplicates_dropped", 0) - before == 3


def test_a_records_block_outside_a_transaction_or_malformed_is_refused(
    journal_broker: RunningBroker,
) -> None:
    block = _records(({"x-dedup-id": "z"}, b"z"))
    headers = {"destination": "/queue/records.bad", "x-records-block": "1"}
    with WireSession.open(journal_broker.address) as session:
        with pytest.raises(BrokerErrorFrame, match="inside a transaction"):
            session.request(Command.SEND, dict(headers), block)
    with WireSession.open(journal_broker.address) as session:
        session.send(Command.BEGIN, {"transaction": "t"})
        with pytest.raises(BrokerErrorFrame, match="malformed records block"):
            session.request(Command.SEND, {**headers, "transaction": "t"}, block[:-1])
    with WireSession.open(journal_broker.address) as session:
        session.request(Command.SUBSCRIBE, {"destination": "/queue/records.bad", "id": "q"})
        session.set_timeout(0.5)
        with pytest.raises(TimeoutError):
            session.receive()
