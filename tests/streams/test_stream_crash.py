"""The broker killed with SIGKILL mid-stream, restarted on the same data directory: the stream is
completed after the restart, from the last receipted chunk on the producer's side and the first
unacknowledged chunk on the consumer's."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from sluice.client import (
    Client,
    ClientError,
    InboundStream,
    StreamAborted,
    StreamProgress,
    StreamResume,
)

from .conftest import JOURNAL_FILE_BYTES, Q, RawProducer, payload, sha

CHUNK = 64 * 1024
BROKER_TOML = f"""
[store]
kind = "journal"
data_dir = "data"
journal_file_bytes = {JOURNAL_FILE_BYTES}
"""


async def _source(
    data: bytes, pause_at: int, paused: asyncio.Event, go: asyncio.Event
) -> AsyncIterator[bytes]:
    for i in range(0, len(data), CHUNK):
        if i == pause_at:
            paused.set()
            await go.wait()  # the broker dies meanwhile
        yield data[i : i + CHUNK]


async def _read(stream: InboundStream, count: int) -> bytes:
    out = bytearray()
    while len(out) < count:
        piece = await stream.read(count - len(out))
        assert piece
        out += piece
    return bytes(out)


@pytest.mark.crash
async def test_broker_killed_mid_stream_completes_after_restart(tmp_path: Path) -> None:
    data = payload(40 * CHUNK)
    process = BrokerProcess(BROKER_TOML, tmp_path).start()
    try:
        paused, go, receipted = asyncio.Event(), asyncio.Event(), asyncio.Event()
        offsets: list[int] = []

        def progress(done: StreamProgress) -> None:
            offsets.append(done.offset_end)
            if done.offset_end == 19 * CHUNK:
                receipted.set()

        producer = await Client.connect(f"127.0.0.1:{process.port}", reconnect=False)
        sending = asyncio.create_task(
            producer.send_stream(
                Q,
                _source(data, 20 * CHUNK, paused, go),
                chunk_size=CHUNK,
                stream_id="S",
                on_progress=progress,
            )
        )
        await paused.wait()
        await receipted.wait()  # chunks 0-18 are on disk; 19 waits for the source
        consumer = await Client.connect(f"127.0.0.1:{process.port}", reconnect=False)
        reader = await consumer.stream_reader(Q, prefetch_bytes=2 * CHUNK).open()
        stream = await reader.next_stream(timeout=5)
        assert stream is not None
        got = await _read(stream, 10 * CHUNK + 100)

        process.kill()
        go.set()
        with pytest.raises(ClientError):
            await sending
        await producer.close()
        await consumer.close()

        process = BrokerProcess(BROKER_TOML, tmp_path).start()
        address = f"127.0.0.1:{process.port}"
        offset = offsets[-1]
        assert offset == 19 * CHUNK
        async with await Client.connect(address) as again:
            resume = StreamResume(offset // CHUNK, offset, hashlib.sha256(data[:offset]))
            sent = await again.send_stream(
                Q, data[offset:], chunk_size=CHUNK, stream_id="S", resume=resume
            )
        assert sent.sha256 == sha(data)
        async with await Client.connect(address) as client:
            async with client.stream_reader(Q) as reader:
                stream = await reader.next_stream(timeout=10)
                assert stream is not None
                assert stream.id == "S"
                # Chunks whose ACK reached the journal before the kill do not come back.
                assert stream.resumed_at <= len(got)
                assert stream.resumed_at % CHUNK == 0
                stream.seed_sha256(hashlib.sha256(got[: stream.resumed_at]))
                rest = bytearray()
                async for piece in stream:
                    rest += piece
                assert got[: stream.resumed_at] + rest == data
                assert stream.verified
                assert await reader.next_stream(timeout=0.3) is None
    finally:
        process.kill()


@pytest.mark.crash
async def test_broker_killed_mid_stream_whose_producer_never_returns_aborts_it(
    tmp_path: Path,
) -> None:
    config = BROKER_TOML + "[policy]\nstream_idle_timeout_s = 1.0\n"
    data = payload(2 * CHUNK)
    process = BrokerProcess(config, tmp_path).start()
    try:
        raw = RawProducer(process.port)
        raw.chunk("S", 0, 0, data[:CHUNK])
        raw.chunk("S", 1, CHUNK, data[CHUNK:])  # receipted: on disk
        process.kill()  # no disconnect seen, no abort marker written
        raw.close()
        process = BrokerProcess(config, tmp_path).start()
        async with await Client.connect(f"127.0.0.1:{process.port}") as client:
            async with client.stream_reader(Q) as reader:
                stream = await reader.next_stream(timeout=10)
                assert stream is not None
                assert await _read(stream, len(data)) == data
                # The producer never comes back: its stream is ended, the reader not left
                # waiting (and free for the next stream).
                async with asyncio.timeout(10):
                    with pytest.raises(StreamAborted, match="stream_idle_timeout_s") as info:
                        await stream.read()
                assert info.value.offset == len(data)
                assert await reader.next_stream(timeout=0.2) is None
    finally:
        process.kill()
