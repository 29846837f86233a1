"""Streams in the core: one stream per consumer, consumer death under each policy, producer
death and idle producers."""

from __future__ import annotations

from typing import Any

from sluice.core.message import AckMode

from .fakes import FakeLink, Harness

Q = "/queue/files"


def _chunks(h: Harness, conn: Any, stream: str, n: int, *, end: bool = True) -> None:
    for i in range(n):
        headers = {"x-stream-id": stream, "x-stream-seq": str(i), "x-stream-offset": str(i * 10)}
        if end and i == n - 1:
            headers["x-stream-end"] = "true"
        h.send(conn, Q, b"%s-%d" % (stream.encode(), i), headers=headers)


def _stream_consumer(h: Harness, prefetch: int = 2) -> tuple[Any, FakeLink]:
    conn, link = h.connect()
    conn.subscribe("s", Q, AckMode.CLIENT_INDIVIDUAL, prefetch=prefetch, max_open_groups=1)
    return conn, link


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
    dlq, dlq_link = h.connect()
    dlq.subscribe("d", "/queue/DLQ.files", AckMode.AUTO)
    h.loop.run()
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
    assert not producer.open_streams


def test_finished_stream_is_not_aborted() -> None:
    h = Harness()
    producer, _ = h.connect()
    _consumer, link = _stream_consumer(h, prefetch=10)
    _chunks(h, producer, "S", 2)
    producer.close()
    h.loop.run()
    assert all("x-stream-abort" not in m.headers for _, m, _, _ in link.delivered)
