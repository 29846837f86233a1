"""The reader never hands out a chunk out of place: crafted frames from a raw STOMP producer,
under on_gap="raise" and on_gap="skip"."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from conftest import RunningBroker
from sluice.client import (
    Client,
    InboundStream,
    StreamAborted,
    StreamCorrupted,
    StreamOutOfOrder,
    StreamReader,
)

from .conftest import Q, RawProducer, payload, sha


@pytest.fixture
def producer(jbroker: RunningBroker) -> Iterator[RawProducer]:
    raw = RawProducer(jbroker.port)
    try:
        yield raw
    finally:
        raw.close()


async def _drain(stream: InboundStream, into: bytearray) -> None:
    async for piece in stream:
        into += piece


async def _next(reader: StreamReader) -> InboundStream:
    stream = await reader.next_stream(timeout=5)
    assert stream is not None
    return stream


async def test_sequence_gap(jbroker: RunningBroker, producer: RawProducer) -> None:
    data = payload(30)
    producer.chunk("S", 0, 0, data[:10])
    producer.chunk("S", 2, 20, data[20:], end=data)  # chunk 1 never sent
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            stream = await _next(reader)
            got = bytearray()
            with pytest.raises(StreamOutOfOrder) as info:
                await _drain(stream, got)
            assert bytes(got) == data[:10]  # only what was in place
            assert info.value.seq == 2
            assert info.value.skipped is False
            assert "chunk 1 was due" in str(info.value)
            # Raise mode: the reader stops.
            with pytest.raises(StreamOutOfOrder):
                await reader.next_stream(timeout=1)


async def test_sequence_gap_skipped_then_next_stream(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    data = payload(30)
    producer.chunk("S", 0, 0, data[:10])
    producer.chunk("S", 2, 20, data[20:], end=data)
    good = payload(25, seed=2)
    producer.stream("T", good, 10)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q, on_gap="skip") as reader:
            stream = await _next(reader)
            got = bytearray()
            with pytest.raises(StreamOutOfOrder) as info:
                await _drain(stream, got)
            assert info.value.skipped is True
            assert bytes(got) == data[:10]
            following = await _next(reader)
            assert following.id == "T"
            rest = bytearray()
            await _drain(following, rest)
            assert bytes(rest) == good
            assert reader.skipped_chunks == 1  # S's end chunk, dropped
            assert isinstance(reader.last_error, StreamOutOfOrder)
    assert jbroker.stats()["memory_used_bytes"] == 0  # nothing left behind


async def test_mid_stream_chunk_without_resume_mark(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    data = payload(30)
    producer.chunk("S", 1, 10, data[10:20])
    producer.chunk("S", 2, 20, data[20:], end=data)
    good = payload(5, seed=3)
    producer.stream("T", good, 10)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q, on_gap="skip") as reader:
            stream = await _next(reader)
            assert stream.id == "T"
            rest = bytearray()
            await _drain(stream, rest)
            assert bytes(rest) == good
            assert reader.skipped_chunks == 2
            assert isinstance(reader.last_error, StreamOutOfOrder)
            assert "resume mark" in str(reader.last_error)
    async with await Client.connect(jbroker.address) as client:
        producer.chunk("U", 3, 30, b"x")
        async with client.stream_reader(Q) as reader:
            with pytest.raises(StreamOutOfOrder, match="resume mark"):
                await reader.next_stream(timeout=5)


@pytest.mark.parametrize(
    ("second", "match"),
    [
        ((0, 0), "chunk 1 was due"),  # a duplicate of chunk 0
        ((1, 11), "offset 11 where 10 was due"),
    ],
)
async def test_duplicate_and_wrong_offset(
    jbroker: RunningBroker, producer: RawProducer, second: tuple[int, int], match: str
) -> None:
    data = payload(30)
    producer.chunk("S", 0, 0, data[:10])
    producer.chunk("S", second[0], second[1], data[10:20])
    producer.chunk("S", 2, 20, data[20:], end=data)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            stream = await _next(reader)
            got = bytearray()
            with pytest.raises(StreamOutOfOrder, match=match):
                await _drain(stream, got)
            assert bytes(got) == data[:10]


async def test_another_stream_in_the_middle(jbroker: RunningBroker, producer: RawProducer) -> None:
    # Without x-max-open-groups (another broker), chunks of two streams would interleave: a
    # chunk of T arriving in the middle of S fails S.
    data = payload(20)
    producer.chunk("S", 0, 0, data[:10], JMSXGroupID="g")
    producer.chunk("T", 0, 0, b"t", JMSXGroupID="g")
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q, on_gap="skip") as reader:
            stream = await _next(reader)
            got = bytearray()
            with pytest.raises(
                StreamOutOfOrder, match="of stream T came in the middle of stream S"
            ):
                await _drain(stream, got)
            assert bytes(got) == data[:10]
            # T's chunk 0 may start a stream: it is kept for the next one.
            following = await _next(reader)
            assert following.id == "T"


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({"x-stream-sha256": sha(b"other")}, "SHA-256"),
        ({"x-stream-length": "99"}, "x-stream-length is 99"),
    ],
)
async def test_end_checks_before_the_last_bytes(
    jbroker: RunningBroker, producer: RawProducer, headers: dict[str, str], match: str
) -> None:
    data = payload(20)
    producer.chunk("S", 0, 0, data[:10])
    end_headers = {
        "x-stream-id": "S",
        "x-stream-seq": "1",
        "x-stream-offset": "10",
        "x-stream-end": "true",
        "x-stream-length": "20",
        "x-stream-sha256": sha(data),
    }
    end_headers.update(headers)
    producer.send(end_headers, data[10:])
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            stream = await _next(reader)
            got = bytearray()
            with pytest.raises(StreamCorrupted, match=match) as info:
                await _drain(stream, got)
            assert not isinstance(info.value, StreamOutOfOrder)
            assert bytes(got) == data[:10]  # the end chunk's bytes were never handed out


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({"x-stream-id": "S", "x-stream-seq": "one"}, "not a non-negative integer"),
        ({"x-stream-id": "S"}, "no x-stream-seq"),
        ({"colour": "red"}, "not a stream chunk"),
        ({"x-stream-id": "S", "x-stream-seq": "0", "x-stream-offset": "5"}, "chunk 0 at offset"),
        (
            {
                "x-stream-id": "S",
                "x-stream-seq": "0",
                "x-stream-sha256": "zz",
                "x-stream-end": "true",
            },
            "malformed x-stream-sha256",
        ),
    ],
)
async def test_malformed_chunks(
    jbroker: RunningBroker, producer: RawProducer, headers: dict[str, str], match: str
) -> None:
    producer.send(headers, b"body")
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            with pytest.raises(StreamCorrupted, match=match):
                await reader.next_stream(timeout=5)
        async with client.stream_reader(Q, on_gap="skip") as reader:
            assert await reader.next_stream(timeout=0.5) is None
            assert reader.skipped_chunks == 1


async def test_abort_marker_then_continuation(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    data = payload(30)
    producer.chunk("S", 0, 0, data[:10])
    producer.send({"x-stream-id": "S", "x-stream-abort": "true", "x-stream-abort-reason": "gone"})
    # A new producer resumes the stream: no resume mark, but exactly where it stopped.
    producer.chunk("S", 1, 10, data[10:20])
    producer.chunk("S", 2, 20, data[20:], end=data)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            stream = await _next(reader)
            got = bytearray()
            with pytest.raises(StreamAborted, match="gone") as info:
                await _drain(stream, got)
            assert info.value.offset == 10
            assert bytes(got) == data[:10]
            continued = await _next(reader)
            assert continued.continued
            assert continued.resumed_at == 10
            continued.seed_sha256(hashlib.sha256(data[:10]))
            rest = bytearray()
            await _drain(continued, rest)
            assert bytes(rest) == data[10:]
            assert continued.verified


async def test_continuation_at_another_offset_is_refused(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    producer.chunk("S", 0, 0, b"0123456789")
    producer.send({"x-stream-id": "S", "x-stream-abort": "true"})
    producer.chunk("S", 2, 20, b"x")
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q, on_gap="skip") as reader:
            stream = await _next(reader)
            with pytest.raises(StreamAborted):
                await _drain(stream, bytearray())
            assert await reader.next_stream(timeout=0.5) is None
            assert reader.skipped_chunks == 1


async def test_expect_accepts_a_continuation_the_application_holds(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    data = payload(20)
    producer.chunk("S", 1, 10, data[10:], end=data)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            reader.expect("S", 10)
            stream = await _next(reader)
            assert stream.resumed_at == 10
            rest = bytearray()
            await _drain(stream, rest)
            assert bytes(rest) == data[10:]
            assert stream.verified is False


async def test_abort_marker_of_an_unseen_stream_is_acknowledged(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    producer.send({"x-stream-id": "S", "x-stream-abort": "true"})
    producer.stream("T", b"t", 10)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q) as reader:
            stream = await _next(reader)
            assert stream.id == "T"
            assert await stream.read() == b"t"
    assert jbroker.stats()["memory_used_bytes"] == 0


async def test_corrupt_stream_skipped_then_next(
    jbroker: RunningBroker, producer: RawProducer
) -> None:
    data = payload(20)
    producer.chunk("S", 0, 0, data[:10])
    producer.chunk("S", 1, 10, data[10:], end=b"not the data")
    producer.stream("T", b"fine", 10)
    async with await Client.connect(jbroker.address) as client:
        async with client.stream_reader(Q, on_gap="skip") as reader:
            stream = await _next(reader)
            with pytest.raises(StreamCorrupted, match="skipped") as info:
                await _drain(stream, bytearray())
            assert info.value.skipped
            following = await _next(reader)
            assert following.id == "T"
            assert await following.read() == b"fine"
    assert jbroker.stats()["memory_used_bytes"] == 0
