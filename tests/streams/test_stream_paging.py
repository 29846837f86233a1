"""Streams larger than the destination's memory limit: sent at the same time, the broker pages in
what a consumer can take, other streams wait on disk, and memory stays bounded; discarded, the rest
of the stream goes to the DLQ from disk and the next stream follows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import RunningBroker, start_broker
from sluice.client import Client, ConnectionLost
from sluice.core.usage import Usage

from .conftest import JOURNAL_FILE_BYTES, Q, payload

KiB = 1024
MEMORY_LIMIT = 1024 * KiB
CHUNK = 64 * KiB
CREDIT = 256 * KiB
STREAM_BYTES = 4 * 1024 * KiB
STREAMS = 3


@pytest.fixture
def peak_memory(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The highest memory use any destination reached (the broker runs in this process)."""
    peaks: dict[str, int] = {}
    add = Usage.add

    def tracking_add(self: Usage, nbytes: int) -> None:
        add(self, nbytes)
        if self.used > peaks.get(self.name, 0):
            peaks[self.name] = self.used

    monkeypatch.setattr(Usage, "add", tracking_add)
    return peaks


def _broker(tmp_path: Path, **policy: str) -> RunningBroker:
    return start_broker(
        store={
            "kind": "journal",
            "data_dir": str(tmp_path / "data"),
            "journal_file_bytes": JOURNAL_FILE_BYTES,
        },
        limits={"destination_memory_limit_bytes": MEMORY_LIMIT},
        policy=policy,
    )


async def test_concurrent_streams_larger_than_memory_complete_in_bounded_memory(
    tmp_path: Path, peak_memory: dict[str, int]
) -> None:
    broker = _broker(tmp_path)
    try:
        streams = {f"s{i}": payload(STREAM_BYTES, seed=i) for i in range(STREAMS)}
        producers = [await Client.connect(broker.address) for _ in streams]
        try:
            await asyncio.gather(
                *(
                    producer.send_stream(Q, data, chunk_size=CHUNK, stream_id=stream_id)
                    for producer, (stream_id, data) in zip(producers, streams.items(), strict=True)
                )
            )
        finally:
            for producer in producers:
                await producer.close()
        received: dict[str, bytes] = {}
        async with await Client.connect(broker.address) as consumer:
            async with consumer.stream_reader(Q, prefetch_bytes=CREDIT) as reader:
                for _ in streams:
                    stream = await reader.next_stream(timeout=10)
                    assert stream is not None
                    out = bytearray()
                    async for piece in stream:
                        out += piece
                    assert stream.verified
                    received[stream.id] = bytes(out)
        assert received == streams
    finally:
        broker.stop()
    # Never more than the limit and a chunk or two: a chunk that arrives, or is read back, while
    # memory is just under the limit.
    assert peak_memory[Q] <= MEMORY_LIMIT + 2 * (CHUNK + KiB)


async def test_discarded_stream_larger_than_memory_goes_to_the_dlq(tmp_path: Path) -> None:
    broker = _broker(tmp_path, stream_policy="discard")
    try:
        data = payload(STREAM_BYTES)
        async with await Client.connect(broker.address) as producer:
            await producer.send_stream(Q, data, chunk_size=CHUNK, stream_id="S")
            await producer.send_stream(Q, b"next", stream_id="T")
        first = await Client.connect(broker.address, reconnect=False)
        reader = await first.stream_reader(Q, prefetch_bytes=CREDIT).open()
        stream = await reader.next_stream(timeout=5)
        assert stream is not None
        read = 0
        while read < MEMORY_LIMIT:  # chunks 0-14 acknowledged, 15 read but not yet
            read += len(await stream.read(CHUNK))
        link = first._connector.link
        assert link is not None
        link.abort(ConnectionLost("killed by the test"))
        await first.close()
        async with await Client.connect(broker.address) as client:
            async with client.stream_reader(Q) as second:
                following = await second.next_stream(timeout=5)
                assert following is not None
                assert following.id == "T"
                assert await following.read() == b"next"
            dlq = await client.subscribe("/queue/DLQ.files", ack="auto")
            seqs = []
            while (message := await dlq.get(timeout=1)) is not None:
                seqs.append(int(message.headers["x-stream-seq"]))
        assert seqs == list(range(MEMORY_LIMIT // CHUNK - 1, STREAM_BYTES // CHUNK))
    finally:
        broker.stop()
