"""Consumers and producers that die mid-stream, under each stream policy, through the journal
store: the reader resumes, restarts, or moves on, and raises instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import RunningBroker
from sluice.client import (
    Client,
    ClientError,
    ConnectionLost,
    InboundStream,
    StreamAborted,
    StreamCorrupted,
    StreamProgress,
    StreamResume,
)
from waiting import wait_until, wait_until_async

from .conftest import Q, RawProducer, journal_broker, payload

CHUNK = 1000


def _die(client: Client) -> None:
    """Drop the client's connection at once, as a crash would (no DISCONNECT, no ACK)."""
    link = client._connector.link
    assert link is not None
    link.abort(ConnectionLost("killed by the test"))


async def _connect(broker: RunningBroker, **options: object) -> Client:
    return await Client.connect(broker.address, **options)  # type: ignore[arg-type]


async def _read(stream: InboundStream, count: int) -> bytes:
    out = bytearray()
    while len(out) < count:
        piece = await stream.read(count - len(out))
        assert piece, "stream ended early"
        out += piece
    return bytes(out)


async def _rest(stream: InboundStream) -> bytes:
    out = bytearray()
    async for piece in stream:
        out += piece
    return bytes(out)


async def _first_consumer_dies_after(broker: RunningBroker, count: int) -> None:
    """A consumer reads `count` bytes of the stream waiting on Q, then crashes."""
    client = await _connect(broker, reconnect=False)
    reader = await client.stream_reader(Q, prefetch_bytes=3 * CHUNK).open()
    stream = await reader.next_stream(timeout=5)
    assert stream is not None
    await _read(stream, count)
    # It leaves without finishing the stream (a crash mid-chunk is the CLI tests' business).
    await client.close()


@pytest.mark.parametrize("seed", ["none", "right", "wrong"])
async def test_consumer_death_resumes_at_the_first_unacknowledged_chunk(
    jbroker: RunningBroker, seed: str
) -> None:
    data = payload(10 * CHUNK)
    async with await _connect(jbroker) as producer:
        sent = await producer.send_stream(Q, data, chunk_size=CHUNK)
    # Chunks 0 and 1 were consumed (the reader asked for bytes past them), chunk 2 half.
    await _first_consumer_dies_after(jbroker, 2500)
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert stream.id == sent.stream_id
            assert stream.resumed
            assert stream.resumed_at == 2000
            if seed == "right":
                stream.seed_sha256(hashlib.sha256(data[:2000]))
            elif seed == "wrong":
                stream.seed_sha256(hashlib.sha256(b"x" * 2000))
                with pytest.raises(StreamCorrupted, match="SHA-256"):
                    await _rest(stream)
                return
            assert await _rest(stream) == data[2000:]
            assert stream.verified is (seed == "right")
            assert stream.sha256 == sent.sha256
    assert jbroker.stats()["memory_used_bytes"] == 0


def _queue(broker: RunningBroker) -> Any:
    return broker.server.broker.destinations[Q]


async def _reader_dies_waiting_for_chunk_1(broker: RunningBroker, data: bytes) -> None:
    """A reader reads chunk 0, asks for more (which acknowledges chunk 0) and dies while it
    waits for chunk 1: nothing of the stream is in flight when it goes."""
    client = await _connect(broker, reconnect=False)
    reader = await client.stream_reader(Q, prefetch_bytes=3 * CHUNK).open()
    stream = await reader.next_stream(timeout=5)
    assert stream is not None
    assert await _read(stream, CHUNK) == data[:CHUNK]
    waiting = asyncio.create_task(stream.read())
    queue = _queue(broker)
    await asyncio.to_thread(
        wait_until,
        lambda: broker.call(lambda: not any(s.inflight for s in queue.subscriptions)),
        what="the acknowledgement of chunk 0",
    )
    _die(client)
    with contextlib.suppress(ClientError):
        await waiting
    await client.close()


@pytest.mark.parametrize("on_gap", ["raise", "skip"])
async def test_reader_gone_between_chunks_the_next_reader_resumes(
    jbroker: RunningBroker, on_gap: str
) -> None:
    data = payload(3 * CHUNK)
    raw = RawProducer(jbroker.port)
    raw.chunk("S", 0, 0, data[:CHUNK])
    await _reader_dies_waiting_for_chunk_1(jbroker, data)
    raw.chunk("S", 1, CHUNK, data[CHUNK : 2 * CHUNK])
    raw.chunk("S", 2, 2 * CHUNK, data[2 * CHUNK :], end=data)
    raw.close()
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q, on_gap=on_gap) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert stream.id == "S"
            assert stream.resumed_at == CHUNK
            assert stream.headers["x-stream-resume"] == "true"
            assert await _rest(stream) == data[CHUNK:]
            assert reader.skipped_chunks == 0
    assert jbroker.stats()["memory_used_bytes"] == 0


async def test_reader_gone_between_chunks_discard_moves_the_rest_to_the_dlq(
    tmp_path: Path,
) -> None:
    broker = journal_broker(tmp_path, stream_policy="discard")
    try:
        data = payload(3 * CHUNK)
        raw = RawProducer(broker.port)
        raw.chunk("S", 0, 0, data[:CHUNK])
        await _reader_dies_waiting_for_chunk_1(broker, data)
        raw.chunk("S", 1, CHUNK, data[CHUNK : 2 * CHUNK])
        raw.chunk("S", 2, 2 * CHUNK, data[2 * CHUNK :], end=data)
        raw.stream("T", b"next", CHUNK)
        raw.close()
        async with await _connect(broker) as client:
            async with client.stream_reader(Q) as reader:
                stream = await reader.next_stream(timeout=5)
                assert stream is not None
                assert stream.id == "T"
                assert await _rest(stream) == b"next"
            dlq = await client.subscribe("/queue/DLQ.files", ack="auto")
            seqs = []
            while (message := await dlq.get(timeout=1)) is not None:
                assert message.headers["x-stream-id"] == "S"
                assert "stream_policy=discard" in message.headers["x-dlq-reason"]
                seqs.append(int(message.headers["x-stream-seq"]))
            assert seqs == [1, 2]
    finally:
        broker.stop()


async def test_bytes_delivered_twice_are_at_most_the_byte_credit(jbroker: RunningBroker) -> None:
    # Three chunks and their headers fit in the credit, a fourth does not.
    credit = 3 * CHUNK + 800
    data = payload(12 * CHUNK)
    async with await _connect(jbroker) as producer:
        await producer.send_stream(Q, data, chunk_size=CHUNK, stream_id="S")
    first = await _connect(jbroker, reconnect=False)
    reader = await first.stream_reader(Q, prefetch_bytes=credit).open()
    stream = await reader.next_stream(timeout=5)
    assert stream is not None
    await _read(stream, 2 * CHUNK + CHUNK // 2)  # chunks 0 and 1 acknowledged, 2 being read
    queue = _queue(jbroker)

    sent_unacknowledged: list[int] = []  # bytes of the chunks the first reader may lose

    def credit_filled() -> bool:
        queue.dispatch()  # whatever the broker would send now is sent
        inflight = [m for s in queue.subscriptions for m in s.inflight.values()]
        if not inflight or min(int(m.headers["x-stream-seq"]) for m in inflight) != 2:
            return False  # the acknowledgement of chunk 1 is not there yet
        sent_unacknowledged[:] = [len(m.body) for m in inflight]
        return True

    await asyncio.to_thread(wait_until, lambda: jbroker.call(credit_filled))
    _die(first)
    await first.close()
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q, prefetch_bytes=credit) as second:
            resumed = await second.next_stream(timeout=5)
            assert resumed is not None
            # Everything from the first unacknowledged chunk comes again.
            assert resumed.resumed_at == 2 * CHUNK
            assert await _rest(resumed) == data[2 * CHUNK :]
    assert 0 < sum(sent_unacknowledged) <= credit


async def test_restart_policy_starts_again_from_chunk_zero(tmp_path: Path) -> None:
    broker = journal_broker(tmp_path, stream_policy="restart")
    try:
        data = payload(10 * CHUNK)
        async with await _connect(broker) as producer:
            await producer.send_stream(Q, data, chunk_size=CHUNK)
        await _first_consumer_dies_after(broker, 4500)
        async with await _connect(broker) as client:
            async with client.stream_reader(Q) as reader:
                stream = await reader.next_stream(timeout=5)
                assert stream is not None
                assert stream.resumed_at == 0
                assert await _rest(stream) == data
                assert stream.verified
        assert broker.stats()["memory_used_bytes"] == 0
    finally:
        broker.stop()


async def test_discard_policy_moves_the_rest_to_the_dlq(tmp_path: Path) -> None:
    broker = journal_broker(tmp_path, stream_policy="discard")
    try:
        async with await _connect(broker) as producer:
            await producer.send_stream(Q, payload(10 * CHUNK), chunk_size=CHUNK, stream_id="S")
            await producer.send_stream(Q, b"next", stream_id="T")
        await _first_consumer_dies_after(broker, 2500)
        async with await _connect(broker) as client:
            async with client.stream_reader(Q) as reader:
                stream = await reader.next_stream(timeout=5)
                assert stream is not None
                assert stream.id == "T"
                assert await _rest(stream) == b"next"
            dlq = await client.subscribe("/queue/DLQ.files", ack="auto")
            seqs = []
            while (message := await dlq.get(timeout=1)) is not None:
                assert message.headers["x-stream-id"] == "S"
                assert "stream_policy=discard" in message.headers["x-dlq-reason"]
                seqs.append(int(message.headers["x-stream-seq"]))
            assert seqs == list(range(2, 10))
    finally:
        broker.stop()


async def test_live_producer_death_aborts_the_stream(jbroker: RunningBroker) -> None:
    data = payload(2 * CHUNK)
    raw = RawProducer(jbroker.port)
    raw.chunk("S", 0, 0, data[:CHUNK])
    raw.chunk("S", 1, CHUNK, data[CHUNK:])
    raw.close()  # dies before the end chunk
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert await _read(stream, len(data)) == data
            with pytest.raises(StreamAborted, match="disconnected") as info:
                await stream.read()
            assert info.value.offset == len(data)
            assert await reader.next_stream(timeout=0.3) is None
    assert jbroker.stats()["memory_used_bytes"] == 0


async def test_transactional_producer_death_leaves_nothing(jbroker: RunningBroker) -> None:
    raw = RawProducer(jbroker.port)
    raw.begin("t1")
    raw.chunk("S", 0, 0, b"a" * CHUNK, transaction="t1")
    raw.chunk("S", 1, CHUNK, b"b" * CHUNK, transaction="t1")
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q) as reader:
            assert await reader.next_stream(timeout=0.5) is None  # not before COMMIT
            raw.close()  # dies: the broker aborts the transaction
            assert await reader.next_stream(timeout=0.5) is None
    assert jbroker.stats()["memory_used_bytes"] == 0


async def _paused(
    data: bytes, pause_at: int, reached: asyncio.Event, go: asyncio.Event
) -> AsyncIterator[bytes]:
    for i in range(0, len(data), CHUNK):
        if i == pause_at:
            reached.set()
            await go.wait()
        yield data[i : i + CHUNK]


async def test_transactional_send_that_fails_is_invisible(jbroker: RunningBroker) -> None:
    data = payload(6 * CHUNK)
    reached, never = asyncio.Event(), asyncio.Event()
    producer = await _connect(jbroker, reconnect=False)
    sending = asyncio.create_task(
        producer.send_stream(
            Q, _paused(data, 4 * CHUNK, reached, never), chunk_size=CHUNK, transactional=True
        )
    )
    await reached.wait()
    _die(producer)
    never.set()
    with pytest.raises(ConnectionLost):
        await sending
    await producer.close()
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q) as reader:
            assert await reader.next_stream(timeout=0.5) is None
    assert jbroker.stats()["memory_used_bytes"] == 0


async def test_live_send_that_fails_is_aborted_then_resumed(jbroker: RunningBroker) -> None:
    data = payload(6 * CHUNK)
    reached, go, receipted = asyncio.Event(), asyncio.Event(), asyncio.Event()
    offsets: list[int] = []

    def progress(done: StreamProgress) -> None:
        offsets.append(done.offset_end)
        if done.offset_end == 2 * CHUNK:
            receipted.set()

    producer = await _connect(jbroker, reconnect=False)
    sending = asyncio.create_task(
        producer.send_stream(
            Q,
            _paused(data, 3 * CHUNK, reached, go),
            chunk_size=CHUNK,
            stream_id="S",
            on_progress=progress,
        )
    )
    await reached.wait()
    await receipted.wait()
    async with await _connect(jbroker) as client:
        async with client.stream_reader(Q) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            # Paused before chunk 3: chunk 2 waits too (the end is only known by reading ahead).
            assert await _read(stream, 2 * CHUNK) == data[: 2 * CHUNK]
            _die(producer)
            go.set()
            with pytest.raises(ConnectionLost):
                await sending
            await producer.close()
            with pytest.raises(StreamAborted):
                await stream.read()
            # A new producer continues after the last receipted chunk.
            offset = offsets[-1]
            assert offset == 2 * CHUNK
            async with await _connect(jbroker) as again:
                resume = StreamResume(offset // CHUNK, offset, hashlib.sha256(data[:offset]))
                sent = await again.send_stream(
                    Q, data[offset:], chunk_size=CHUNK, stream_id="S", resume=resume
                )
            assert sent.resumed_at == offset
            continued = await reader.next_stream(timeout=5)
            assert continued is not None
            assert continued.continued
            assert continued.resumed_at == offset
            continued.seed_sha256(hashlib.sha256(data[:offset]))
            assert await _rest(continued) == data[offset:]
            assert continued.verified


async def test_lost_consumer_connection_fails_the_stream_then_resumes(
    jbroker: RunningBroker,
) -> None:
    data = payload(8 * CHUNK)
    async with await _connect(jbroker) as producer:
        await producer.send_stream(Q, data, chunk_size=CHUNK)
    async with await _connect(jbroker, initial_reconnect_delay_s=0.01) as client:
        async with client.stream_reader(Q, prefetch_bytes=2 * CHUNK) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert await _read(stream, 2500) == data[:2500]
            epoch = client.epoch
            _die(client)  # the client reconnects and restores the subscription
            with pytest.raises(ConnectionLost, match="resumed stream"):
                await _rest(stream)
            resumed = await reader.next_stream(timeout=5)
            assert resumed is not None
            assert client.epoch > epoch
            # Acknowledgements not yet written when the connection died are lost with it.
            assert resumed.resumed_at in (0, 1000, 2000)
            assert await _rest(resumed) == data[resumed.resumed_at :]


async def test_reader_takes_its_stream_back_after_a_broker_restart(tmp_path: Path) -> None:
    data = payload(3 * CHUNK)
    broker = journal_broker(tmp_path)
    port = broker.port
    try:
        # The producer stays connected: the broker goes down before it sends chunk 2.
        first = RawProducer(port)
        first.chunk("S", 0, 0, data[:CHUNK])
        first.chunk("S", 1, CHUNK, data[CHUNK : 2 * CHUNK])
        async with await Client.connect(broker.address, initial_reconnect_delay_s=0.01) as client:
            async with client.stream_reader(Q, prefetch_bytes=2 * CHUNK) as reader:
                stream = await reader.next_stream(timeout=5)
                assert stream is not None
                assert await _read(stream, 2 * CHUNK) == data[: 2 * CHUNK]
                # Asking for more acknowledges chunk 1; then nothing of S is left stored.
                waiting = asyncio.create_task(stream.read(1))

                def settled() -> bool:
                    queue = broker.server.broker.destinations[Q]
                    return not any(sub.inflight for sub in queue.subscriptions)

                await wait_until_async(lambda: broker.call(settled), what="chunk 1 acknowledged")
                # The broker stops and starts again: it never saw the reader leave S.
                await asyncio.to_thread(broker.stop)
                # Its loop has stopped: read its counters directly. A clean stop left S open.
                assert broker.server.broker.snapshot().get("streams_aborted", 0) == 0
                first.close()
                broker = journal_broker(tmp_path, stomp_port=port)
                # The client reconnects; the read that waited fails with the old connection.
                with pytest.raises(ConnectionLost):
                    await waiting
                raw = RawProducer(port)  # the producer continues after its last receipt
                raw.chunk("S", 2, 2 * CHUNK, data[2 * CHUNK :], end=data)
                raw.close()
                continued = await reader.next_stream(timeout=10)
                assert continued is not None
                assert (continued.id, continued.resumed_at) == ("S", 2 * CHUNK)
                assert continued.continued
                assert "x-stream-resume" not in continued.headers
                continued.seed_sha256(hashlib.sha256(data[: 2 * CHUNK]))
                assert await _rest(continued) == data[2 * CHUNK :]
                assert continued.verified
    finally:
        broker.stop()


async def test_reader_that_lost_its_stream_takes_a_new_producer_s_continuation(
    jbroker: RunningBroker,
) -> None:
    data = payload(3 * CHUNK)
    first = RawProducer(jbroker.port)
    first.chunk("S", 0, 0, data[:CHUNK])
    first.chunk("S", 1, CHUNK, data[CHUNK : 2 * CHUNK])
    async with await _connect(jbroker, initial_reconnect_delay_s=0.01) as client:
        async with client.stream_reader(Q, prefetch_bytes=2 * CHUNK) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert await _read(stream, 2 * CHUNK) == data[: 2 * CHUNK]
            waiting = asyncio.create_task(stream.read(1))  # acknowledges chunk 1, then waits

            def settled() -> bool:
                queue = jbroker.server.broker.destinations[Q]
                return not any(sub.inflight for sub in queue.subscriptions)

            await wait_until_async(lambda: jbroker.call(settled), what="chunk 1 acknowledged")
            _die(client)  # the reader's connection drops; the client reconnects
            with pytest.raises(ConnectionLost):
                await waiting
            first.close()  # then the producer dies: the broker ends S with an abort marker
            second = RawProducer(jbroker.port)  # and another continues it
            second.chunk("S", 2, 2 * CHUNK, data[2 * CHUNK :], end=data)
            second.close()
            continued = await reader.next_stream(timeout=10)
            assert continued is not None
            assert (continued.id, continued.resumed_at, continued.continued) == (
                "S",
                2 * CHUNK,
                True,
            )
            continued.seed_sha256(hashlib.sha256(data[: 2 * CHUNK]))
            assert await _rest(continued) == data[2 * CHUNK :]
            assert continued.verified


async def test_idle_producer_stream_is_aborted(tmp_path: Path) -> None:
    broker = journal_broker(tmp_path, stream_idle_timeout_s=0.2)
    try:
        raw = RawProducer(broker.port)
        raw.chunk("S", 0, 0, b"x" * 10)  # then nothing: the broker's sweep aborts it
        async with await _connect(broker) as client:
            async with client.stream_reader(Q) as reader:
                stream = await reader.next_stream(timeout=5)
                assert stream is not None
                assert await stream.read() == b"x" * 10
                with pytest.raises(StreamAborted, match="stream_idle_timeout_s"):
                    await stream.read()
        raw.close()
    finally:
        broker.stop()
