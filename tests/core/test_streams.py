"""Streams in the core: one stream per consumer, consumer death under each policy (whatever it had
in flight), producer death, idle producers (also after a restart), and streams larger than memory
read back a credit at a time while the others wait on disk."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.core.connection import SubscribeOptions
from sluice.core.message import AckMode
from sluice.errors import LimitExceeded

from .fakes import FakeLink, Harness, paging_store

Q = "/queue/files"
ABORT = "x-stream-abort"


def _chunk(
    h: Harness, conn: Any, stream: str, i: int, *, end: bool = False, body: bytes = b""
) -> None:
    headers = {"x-stream-id": stream, "x-stream-seq": str(i), "x-stream-offset": str(i * 10)}
    if end:
        headers["x-stream-end"] = "true"
    h.send(conn, Q, body or b"%s-%d" % (stream.encode(), i), headers=headers, persistent=True)


def _chunks(h: Harness, conn: Any, stream: str, n: int, *, end: bool = True) -> None:
    for i in range(n):
        _chunk(h, conn, stream, i, end=end and i == n - 1)


def _stream_consumer(
    h: Harness, prefetch: int = 2, prefetch_bytes: int = 0
) -> tuple[Any, FakeLink]:
    conn, link = h.connect()
    conn.subscribe(
        "s",
        Q,
        AckMode.CLIENT_INDIVIDUAL,
        SubscribeOptions(prefetch=prefetch, prefetch_bytes=prefetch_bytes, max_open_groups=1),
    )
    return conn, link


def _dlq(h: Harness) -> FakeLink:
    dlq, dlq_link = h.connect()
    dlq.subscribe("d", "/queue/DLQ.files", AckMode.AUTO)
    h.loop.run()
    return dlq_link


def test_one_stream_at_a_time_never_interleaved() -> None:
    h = Harness()
    a, _ = h.connect()
    b, _ = h.connect()
    consumer, link = _stream_consumer(h, prefetch=10)
    for i in range(3):  # two producers, chunks interleaved in the queue
        for producer, stream in ((a, "A"), (b, "B")):
            headers = {"x-stream-id": stream, "x-stream-seq": str(i)}
            if i == 2:
                headers["x-stream-end"] = "true"
            h.send(producer, Q, b"%s%d" % (stream.encode(), i), headers=headers)
    first = link.bodies()
    assert first == [b"A0", b"A1", b"A2"] or first == [b"B0", b"B1", b"B2"]
    for _, _, tag, _ in link.take():
        consumer.ack(tag)
    h.loop.run()
    second = link.bodies()
    assert len(second) == 3
    assert {body[:1] for body in second} == ({b"A", b"B"} - {first[0][:1]})


def test_resume_continues_from_the_first_unacknowledged_chunk() -> None:
    h = Harness()
    producer, _ = h.connect()
    first, link1 = _stream_consumer(h)
    _chunks(h, producer, "S", 5)
    d = link1.take()
    first.ack(d[0][2])  # chunk 0 done; chunk 1 in flight
    first.close()
    h.loop.run()
    _second, link2 = _stream_consumer(h, prefetch=10)
    h.loop.run()
    got = link2.take()
    assert [m.body for _, m, _, _ in got] == [b"S-1", b"S-2", b"S-3", b"S-4"]
    assert got[0][3] == 2  # the resumed chunk is marked redelivered
    assert got[0][1].headers["x-stream-offset"] == "10"
    assert got[0][1].headers["x-stream-resume"] == "true"
    assert all("x-stream-resume" not in m.headers for _, m, _, _ in got[1:])


def test_consumer_gone_between_chunks_the_next_chunk_carries_the_resume_mark() -> None:
    # The live case: the reader acknowledged chunk 0 and waits for chunk 1 when it dies.
    h = Harness()
    producer, _ = h.connect()
    first, link1 = _stream_consumer(h)
    _chunk(h, producer, "S", 0)
    first.ack(link1.take()[0][2])
    first.close()
    h.loop.run()
    _second, link2 = _stream_consumer(h, prefetch=10)
    _chunk(h, producer, "S", 1)
    _chunk(h, producer, "S", 2, end=True)
    got = link2.take()
    assert [m.body for _, m, _, _ in got] == [b"S-1", b"S-2"]
    assert got[0][1].headers["x-stream-resume"] == "true"
    assert got[0][3] == 1  # never delivered before: not marked redelivered
    assert "x-stream-resume" not in got[1][1].headers


def test_consumer_gone_between_chunks_discard_sends_the_rest_to_the_dlq() -> None:
    h = Harness(policy={"stream_policy": "discard"})
    producer, _ = h.connect()
    first, link1 = _stream_consumer(h)
    _chunk(h, producer, "S", 0)
    first.ack(link1.take()[0][2])
    first.close()
    h.loop.run()
    _second, link2 = _stream_consumer(h, prefetch=10)
    _chunk(h, producer, "S", 1)
    _chunk(h, producer, "S", 2, end=True)
    _chunks(h, producer, "T", 1)
    assert link2.bodies() == [b"T-0"]
    dlq_link = _dlq(h)
    assert dlq_link.bodies() == [b"S-1", b"S-2"]
    assert "stream_policy=discard" in dlq_link.delivered[0][1].headers["x-dlq-reason"]


def test_restart_delivers_again_from_chunk_zero() -> None:
    h = Harness(policy={"stream_policy": "restart"})
    producer, _ = h.connect()
    first, link1 = _stream_consumer(h, prefetch=3)
    _chunks(h, producer, "S", 5)
    for _, _, tag, _ in link1.take()[:2]:
        first.ack(tag)
    first.close()
    h.loop.run()
    second, link2 = _stream_consumer(h, prefetch=10)
    h.loop.run()
    got = link2.take()
    assert [m.body for _, m, _, _ in got] == [b"S-0", b"S-1", b"S-2", b"S-3", b"S-4"]
    for _, _, tag, _ in got:
        second.ack(tag)
    h.loop.run()
    assert h.broker.usage.used == 0  # the end was acknowledged: nothing is kept


def test_discard_sends_the_rest_of_the_stream_to_the_dlq() -> None:
    h = Harness(policy={"stream_policy": "discard"})
    producer, _ = h.connect()
    first, link1 = _stream_consumer(h)
    _chunks(h, producer, "S", 4)
    first.ack(link1.take()[0][2])
    first.close()
    h.loop.run()
    _second, link2 = _stream_consumer(h, prefetch=10)
    _chunks(h, producer, "T", 1)
    assert link2.bodies() == [b"T-0"]
    dlq_link = _dlq(h)
    assert dlq_link.bodies() == [b"S-1", b"S-2", b"S-3"]
    assert "stream_policy=discard" in dlq_link.delivered[0][1].headers["x-dlq-reason"]


def test_producer_death_puts_an_abort_marker_in_the_stream() -> None:
    h = Harness()
    producer, _ = h.connect()
    consumer, link = _stream_consumer(h, prefetch=10)
    _chunks(h, producer, "S", 2, end=False)
    producer.close()
    h.loop.run()
    *chunks, marker = link.take()
    assert [m.body for _, m, _, _ in chunks] == [b"S-0", b"S-1"]
    assert marker[1].headers["x-stream-abort"] == "true"
    assert "disconnected" in marker[1].headers["x-stream-abort-reason"]
    consumer.ack(marker[2])
    assert consumer.subs["s"].groups == {}  # the marker closed the stream's group


def test_idle_stream_is_aborted_by_the_sweep() -> None:
    h = Harness(policy={"stream_idle_timeout_s": 10.0})
    producer, _ = h.connect()
    _consumer, link = _stream_consumer(h, prefetch=10)
    _chunks(h, producer, "S", 1, end=False)
    h.loop.fire_timers()
    assert len(link.delivered) == 1  # not idle yet
    h.now += 11_000
    h.loop.fire_timers()
    marker = link.delivered[-1][1]
    assert marker.headers["x-stream-abort"] == "true"
    assert "stream_idle_timeout_s" in marker.headers["x-stream-abort-reason"]
    assert "S" not in h.broker.destinations[Q].open_streams
    producer.close()
    h.loop.run()
    assert len(link.delivered) == 2  # no second marker when the producer leaves


def test_finished_stream_is_not_aborted() -> None:
    h = Harness()
    producer, _ = h.connect()
    _consumer, link = _stream_consumer(h, prefetch=10)
    _chunks(h, producer, "S", 2)
    producer.close()
    h.loop.run()
    assert len(link.delivered) == 2
    assert all("x-stream-abort" not in m.headers for _, m, _, _ in link.delivered)


def test_stream_is_not_taken_from_its_consumer_by_the_group_idle_timeout() -> None:
    # The consumer has nothing in flight (its producer is slow, or held by flow control) for
    # longer than group_idle_timeout_s: the stream stays its own.
    h = Harness(policy={"group_idle_timeout_s": 1.0})
    s_producer, _ = h.connect()
    t_producer, _ = h.connect()
    consumer, link = _stream_consumer(h, prefetch=10)
    _chunk(h, s_producer, "S", 0)
    consumer.ack(link.delivered[0][2])
    h.now += 5_000
    _chunks(h, t_producer, "T", 1)
    assert link.bodies() == [b"S-0"]  # not T: one stream at a time
    _chunk(h, s_producer, "S", 1, end=True)
    assert link.bodies() == [b"S-0", b"S-1"]
    consumer.ack(link.delivered[1][2])
    h.loop.run()
    assert link.bodies() == [b"S-0", b"S-1", b"T-0"]


def test_idle_timeout_is_the_destination_s_own() -> None:
    h = Harness(
        policy={"stream_idle_timeout_s": 60.0},
        destination=[{"pattern": Q, "stream_idle_timeout_s": 5.0}],  # type: ignore[arg-type]
    )
    producer, _ = h.connect()
    _consumer, link = _stream_consumer(h, prefetch=10)
    _chunks(h, producer, "S", 1, end=False)
    h.now += 6_000
    h.loop.fire_timers()
    marker = link.delivered[-1][1]
    assert marker.headers[ABORT] == "true"


def _recovered(store: Any, **policy: Any) -> Harness:
    """A broker that crashed with stream S half sent (no disconnect, no abort marker), and the
    broker started again on what it had stored."""
    before = Harness(store, policy=policy)
    producer, _ = before.connect()
    _chunks(before, producer, "S", 2, end=False)
    return Harness(store, policy=policy)


def test_stream_recovered_after_a_crash_is_aborted_if_its_producer_never_returns() -> None:
    h = _recovered(paging_store(), stream_idle_timeout_s=10.0)
    consumer, link = _stream_consumer(h, prefetch=10)
    h.loop.run()
    assert link.bodies() == [b"S-0", b"S-1"]
    for _, _, tag, _ in link.take():
        consumer.ack(tag)
    h.now += 5_000
    h.loop.fire_timers()
    assert not link.delivered  # not idle yet
    h.now += 6_000
    h.loop.fire_timers()
    (marker,) = link.take()
    assert marker[1].headers[ABORT] == "true"
    assert "stream_idle_timeout_s" in marker[1].headers["x-stream-abort-reason"]
    consumer.ack(marker[2])
    assert consumer.subs["s"].groups == {}  # free for the next stream


def test_recovered_stream_is_not_aborted_while_its_chunks_wait_for_a_reader() -> None:
    h = _recovered(paging_store(), stream_idle_timeout_s=10.0)
    h.now += 60_000
    h.loop.fire_timers()
    _consumer, link = _stream_consumer(h, prefetch=10)
    h.loop.run()
    assert link.bodies() == [b"S-0", b"S-1"]  # no marker before or between them


def test_recovered_stream_continued_by_its_returning_producer_is_not_aborted() -> None:
    h = _recovered(paging_store(), stream_idle_timeout_s=10.0)
    consumer, link = _stream_consumer(h, prefetch=10)
    h.loop.run()
    for _, _, tag, _ in link.take():
        consumer.ack(tag)
    h.now += 8_000
    producer, _ = h.connect()  # `sluice put` run again: it continues after its last receipt
    _chunk(h, producer, "S", 2)
    h.now += 8_000
    h.loop.fire_timers()
    _chunk(h, producer, "S", 3, end=True)
    h.now += 60_000
    h.loop.fire_timers()
    assert link.bodies() == [b"S-2", b"S-3"]
    producer.close()
    h.loop.run()
    assert all(ABORT not in m.headers for _, m, _, _ in link.delivered)


def test_streams_larger_than_memory_one_read_back_at_a_time_others_wait_on_disk() -> None:
    limit = 8_000
    h = Harness(paging_store(), limits={"destination_memory_limit_bytes": limit})
    producers = {name: h.connect()[0] for name in "ABC"}
    for i in range(20):  # the three streams' chunks interleaved in the queue
        for name, producer in producers.items():
            _chunk(h, producer, name, i, end=i == 19, body=name.encode() * 1000)
    queue = h.broker.destinations[Q]
    chunk_bytes = max(m.nbytes for m in queue.pending.values())  # type: ignore[attr-defined]
    consumer, link = _stream_consumer(h, prefetch=100, prefetch_bytes=3 * chunk_bytes)
    h.loop.run()
    order: list[tuple[str, str]] = []
    peak = 0
    while link.delivered:
        _, message, tag, _ = link.delivered.pop(0)
        order.append((message.headers["x-stream-id"], message.headers["x-stream-seq"]))
        assert consumer.subs["s"].inflight_bytes <= 3 * chunk_bytes
        if len(order) == 10:
            # Reading A: B and C wait on disk, not in memory.
            waiting = {m.group_id for m in queue.pending.values()}  # type: ignore[attr-defined]
            assert waiting <= {"A"}
        consumer.ack(tag)
        h.loop.run()
        peak = max(peak, queue.usage.used)
    assert order == [(name, str(i)) for name in "ABC" for i in range(20)]
    assert peak <= limit + chunk_bytes
    assert queue.usage.used == 0


def test_live_streams_per_destination_are_bounded() -> None:
    h = Harness(limits={"max_open_streams_per_destination": 1})
    a, _ = h.connect()
    b, _ = h.connect()
    _chunk(h, a, "S", 0)
    headers = {"x-stream-id": "T", "x-stream-seq": "0", "x-dedup-id": "T:0"}
    with pytest.raises(LimitExceeded, match="max_open_streams_per_destination"):
        h.send(b, Q, b"T-0", headers=dict(headers), persistent=True)
    assert h.broker.counters["limit_max_open_streams_per_destination"] == 1
    _chunk(h, a, "S", 1, end=True)
    h.send(b, Q, b"T-0", headers=dict(headers), persistent=True)  # its dedup id was not kept
    assert h.broker.destinations[Q].depth == 3
