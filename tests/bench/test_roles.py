"""Producer and consumer on a link whose transport is a recording fake (no sockets)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from sluice.bench.payload import MARKER_MAGIC, decode_body, encode_body, encode_marker
from sluice.bench.roles import (
    BenchConsumer,
    BenchProducer,
    ConsumerSpec,
    ProducerSpec,
    receipt_window,
)
from sluice.bench.stomplink import LinkError, StompLink
from sluice.stomp import Command, Frame, FrameParser, StompLimits, Version, encode_frame


class _Transport:
    """Records writes; enough of asyncio.Transport for StompLink."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False
        self.written = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.data += data
        self.written.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        del high, low

    def get_extra_info(self, name: str) -> Any:
        return None

    def frames(self) -> list[Frame]:
        parser = FrameParser(StompLimits(), Version.V1_2)
        parser.feed(bytes(self.data))
        found = []
        while (event := parser.next_event()) is not None:
            if isinstance(event, Frame):
                found.append(event)
        return found

    async def frames_once(self, count: int) -> list[Frame]:
        """The frames written, once there are at least `count`. A writer runs on until it
        awaits something, so this sees everything it wrote before it stopped to wait."""
        async with asyncio.timeout(5):
            while len(found := self.frames()) < count:
                self.written.clear()
                await self.written.wait()
        return found


def _link(version: Version = Version.V1_2) -> tuple[StompLink, _Transport]:
    link = StompLink("test")
    transport = _Transport()
    link.connection_made(transport)  # type: ignore[arg-type]
    link.version = version
    return link, transport


def _receipt(link: StompLink, receipt_id: str) -> None:
    link.data_received(encode_frame(Command.RECEIPT, {"receipt-id": receipt_id}))


def _message(seq: int, ack: str, *, size: int = 64, producer: int = 0) -> bytes:
    headers = {"destination": "/queue/q", "message-id": f"m-{seq}", "subscription": "bench-0"}
    headers["ack"] = ack
    body = encode_body(producer, seq, time.monotonic_ns(), size)
    return encode_frame(Command.MESSAGE, headers, body)


async def test_producer_windows_carry_receipts_and_valid_bodies() -> None:
    link, transport = _link()
    spec = ProducerSpec(3, "/queue/q", 64, count=5, receipt_every=2, max_receipts=10)
    producer = BenchProducer(spec, link)
    task = asyncio.create_task(producer.run(0, 5, measured=True))
    frames = await transport.frames_once(5)
    assert [f.command for f in frames] == [Command.SEND] * 5
    assert [f.headers.get("receipt") for f in frames] == [None, "m1", None, "m3", "m4"]
    for seq, frame in enumerate(frames):
        assert frame.headers["destination"] == "/queue/q"
        assert "persistent" not in frame.headers
        head = decode_body(frame.body, 64)
        assert (head.producer, head.seq) == (3, seq)
    assert not task.done()  # waits for its receipts
    for receipt_id in ("m1", "m3", "m4"):
        _receipt(link, receipt_id)
    await asyncio.wait_for(task, 1)
    assert producer.sent == 5
    assert producer.receipt_latency.total == 3


async def test_persistent_is_only_ever_true() -> None:
    link, transport = _link()
    spec = ProducerSpec(0, "/queue/q", 64, count=1, persistent=True)
    task = asyncio.create_task(BenchProducer(spec, link).run(0, 1, measured=False))
    (frame,) = await transport.frames_once(1)
    assert frame.headers["persistent"] == "true"
    _receipt(link, "w0")
    await asyncio.wait_for(task, 1)


async def test_producer_stops_at_max_receipts_until_answered() -> None:
    link, transport = _link()
    spec = ProducerSpec(0, "/queue/q", 64, count=10, receipt_every=1, max_receipts=2)
    task = asyncio.create_task(BenchProducer(spec, link).run(0, 10, measured=True))
    assert len(await transport.frames_once(1)) == 2  # two windows out, none answered
    for seq in range(10):
        # Each receipt lets exactly one more window out, never more than two unanswered.
        _receipt(link, f"m{seq}")
        expected = min(seq + 3, 10)
        assert len(await transport.frames_once(expected)) == expected
    await asyncio.wait_for(task, 1)
    assert len(transport.frames()) == 10


async def test_producer_fails_when_the_link_dies() -> None:
    link, transport = _link()
    spec = ProducerSpec(0, "/queue/q", 64, count=10, receipt_every=1, max_receipts=1)
    task = asyncio.create_task(BenchProducer(spec, link).run(0, 10, measured=True))
    await transport.frames_once(1)
    link.data_received(encode_frame(Command.ERROR, {"message": "go away"}))
    with pytest.raises(LinkError, match="go away"):
        await asyncio.wait_for(task, 1)


async def test_timetable_stamps_due_times() -> None:
    link, transport = _link()
    spec = ProducerSpec(0, "/queue/q", 64, count=4, rate_per_s=1000.0, receipt_every=2)
    producer = BenchProducer(spec, link)
    task = asyncio.create_task(producer.run(0, 4, measured=True))
    answered = 0
    while answered < 4:
        frames = await transport.frames_once(answered + 1)
        for frame in frames[answered:]:
            receipt = frame.headers.get("receipt")
            if receipt is not None:
                _receipt(link, receipt)
        answered = len(frames)
    await asyncio.wait_for(task, 1)
    heads = [decode_body(f.body, 64) for f in transport.frames()]
    steps = [b.intended_ns - a.intended_ns for a, b in itertools.pairwise(heads)]
    assert all(abs(step - 1_000_000) <= 1 for step in steps)
    assert all(h.sent_ns >= h.intended_ns for h in heads)


async def test_a_timetable_starts_after_its_offset() -> None:
    link, transport = _link()
    spec = ProducerSpec(0, "/queue/q", 64, count=1, rate_per_s=1000.0, start_offset_s=0.01)
    producer = BenchProducer(spec, link)
    started = time.monotonic_ns()
    task = asyncio.create_task(producer.run(0, 1, measured=True))
    (first,) = await transport.frames_once(1)
    assert decode_body(first.body, 64).intended_ns - started >= 10_000_000
    _receipt(link, "m0")
    await asyncio.wait_for(task, 1)


async def test_a_sync_producer_behind_its_timetable_counts_late_sends() -> None:
    link, transport = _link()
    # A timetable that began 10 ms ago: every send is more than 1 ms behind it.
    spec = ProducerSpec(
        0,
        "/queue/q",
        64,
        count=2,
        rate_per_s=1000.0,
        receipt_every=1,
        max_receipts=1,
        start_offset_s=-0.01,
    )
    producer = BenchProducer(spec, link)
    task = asyncio.create_task(producer.run(0, 2, measured=True))
    await transport.frames_once(1)
    _receipt(link, "m0")
    await transport.frames_once(2)
    _receipt(link, "m1")
    await asyncio.wait_for(task, 1)
    assert producer.late_sends == 2
    assert producer.result()["late_sends"] == 2


async def test_the_window_is_used_as_given() -> None:
    link, transport = _link()
    spec = ProducerSpec(0, "/queue/q", 1024 * 1024, count=8, receipt_every=4, max_receipts=4)
    producer = BenchProducer(spec, link)
    assert producer.window == 4
    task = asyncio.create_task(producer.run(0, 8, measured=True))
    receipts = [f.headers.get("receipt") for f in await transport.frames_once(8)]
    assert receipts == [None, None, None, "m3", None, None, None, "m7"]
    for receipt_id in ("m3", "m7"):
        _receipt(link, receipt_id)
    await asyncio.wait_for(task, 1)


def test_default_window_keeps_near_1_mib() -> None:
    assert receipt_window(300 * 1024, None) == 3
    assert receipt_window(100, None) == 100
    assert receipt_window(1024 * 1024, None) == 1
    assert receipt_window(4 * 1024 * 1024, None) == 1
    assert receipt_window(1024 * 1024, 4) == 4


async def test_end_marker_carries_a_receipt_and_is_counted_once() -> None:
    link, transport = _link()
    producer = BenchProducer(ProducerSpec(2, "/queue/q", 64, count=1), link)
    task = asyncio.create_task(producer.mark())
    (frame,) = await transport.frames_once(1)
    assert frame.headers["receipt"] == "end"
    assert frame.body.startswith(MARKER_MAGIC)
    _receipt(link, "end")
    await asyncio.wait_for(task, 1)
    consumer, _ = _consumer("auto", 1)
    marker = encode_frame(
        Command.MESSAGE,
        {"destination": "/queue/q", "message-id": "m", "subscription": "bench-0"},
        encode_marker(0, 0, time.monotonic_ns(), 64),
    )
    consumer.link.data_received(marker)
    assert consumer.markers == {0}
    assert consumer.tracker.duplicates == 0
    consumer.link.data_received(marker)
    assert consumer.tracker.duplicates == 1
    assert consumer.tracker.trailing_duplicates == 1
    assert consumer.result()["markers"] == [0]


def _consumer(
    ack: str, ack_every: int, version: Version = Version.V1_2
) -> tuple[BenchConsumer, Any]:
    link, transport = _link(version)
    spec = ConsumerSpec(0, "/queue/q", 64, per_producer=[10], ack=ack, ack_every=ack_every)
    return BenchConsumer(spec, link), transport


async def test_client_mode_acks_cumulatively_per_batch() -> None:
    consumer, transport = _consumer("client", 3)
    consumer.link.data_received(b"".join(_message(i, f"a:{i}") for i in range(7)))
    acks = transport.frames()
    assert [f.headers["id"] for f in acks] == ["a:2", "a:5"]  # escaped ids round-trip
    consumer.flush_acks()
    assert [f.headers["id"] for f in transport.frames()] == ["a:2", "a:5", "a:6"]
    assert consumer.unique == 7
    assert consumer.measured == 7
    assert consumer.latency.total == 7


async def test_client_individual_acks_every_message() -> None:
    consumer, transport = _consumer("client-individual", 2)
    consumer.link.data_received(b"".join(_message(i, str(i)) for i in range(3)))
    consumer.flush_acks()
    assert [f.headers["id"] for f in transport.frames()] == ["0", "1", "2"]


async def test_auto_mode_sends_no_acks() -> None:
    consumer, transport = _consumer("auto", 1)
    consumer.link.data_received(_message(0, "0"))
    consumer.flush_acks()
    assert transport.frames() == []
    assert consumer.unique == 1


async def test_stomp_1_1_acks_by_message_id_and_subscription() -> None:
    consumer, transport = _consumer("client", 1, Version.V1_1)
    frame = encode_frame(
        Command.MESSAGE,
        {"destination": "/queue/q", "message-id": "m-0", "subscription": "bench-0"},
        encode_body(0, 0, time.monotonic_ns(), 64),
        Version.V1_1,
    )
    consumer.link.data_received(frame)
    (ack,) = transport.frames()
    assert ack.headers == {"message-id": "m-0", "subscription": "bench-0"}


async def test_consumer_counts_duplicates_and_corrupt_bodies() -> None:
    consumer, _ = _consumer("auto", 1)
    link = consumer.link
    link.data_received(_message(1, "x") + _message(1, "y"))
    link.data_received(_message(2, "z", size=65))  # wrong size
    link.data_received(_message(3, "z", producer=9))  # no such producer
    tracker = consumer.tracker
    assert (tracker.unique, tracker.duplicates, tracker.corrupt, tracker.unexpected) == (1, 1, 1, 1)
    assert consumer.received == 4


async def test_warmup_messages_are_verified_but_not_timed() -> None:
    link, _ = _link()
    spec = ConsumerSpec(0, "/queue/q", 64, per_producer=[4], warmup=[2], ack="auto")
    consumer = BenchConsumer(spec, link)
    link.data_received(b"".join(_message(i, str(i)) for i in range(4)))
    assert consumer.unique == 4
    assert consumer.measured == 2
    assert consumer.latency.total == 2


async def test_messages_after_finish_are_left_to_the_broker() -> None:
    consumer, transport = _consumer("client", 100)
    link = consumer.link
    link.data_received(_message(0, "a-0"))
    consumer.finish()
    assert [f.headers["id"] for f in transport.frames()] == ["a-0"]
    # Not acknowledged: the broker delivers it again, so it must not count as received here.
    link.data_received(_message(1, "a-1"))
    assert consumer.unique == 1
    assert consumer.unacknowledged == 1
    assert consumer.result()["unacknowledged"] == 1


async def test_auto_consumers_count_to_the_end() -> None:
    consumer, _ = _consumer("auto", 1)
    consumer.finish()
    consumer.link.data_received(_message(0, "a-0"))
    assert consumer.unique == 1
    assert consumer.unacknowledged == 0
