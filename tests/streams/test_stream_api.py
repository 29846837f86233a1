"""send_stream and the stream reader through a broker on the journal store: round trips, chunk
headers, the receipt window, transactions, several producers to one consumer, the blocking API."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import RunningBroker
from sluice.client import BlockingClient, Client, StreamProgress, StreamState
from sluice.client.pipeline import PipelinedReceipt
from sluice.errors import ClientError

from .conftest import Q, payload, sha


async def _read_all(stream: Any) -> bytes:
    out = bytearray()
    async for piece in stream:
        out += piece
    return bytes(out)


async def test_round_trip_checks_the_whole_stream(jbroker: RunningBroker) -> None:
    data = payload(300_000)
    async with await Client.connect(jbroker.address) as client:
        sent = await client.send_stream(
            Q, data, chunk_size=64 * 1024, headers={"x-stream-name": "a.bin", "colour": "blue"}
        )
        assert (sent.chunks, sent.length, sent.sha256) == (5, len(data), sha(data))
        async with client.stream_reader(Q) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert (stream.id, stream.name, stream.resumed_at) == (sent.stream_id, "a.bin", 0)
            assert stream.headers["colour"] == "blue"
            assert await _read_all(stream) == data
            assert stream.verified is True
            assert (stream.length, stream.sha256) == (len(data), sha(data))
            assert stream.state is StreamState.AT_END
            assert await reader.next_stream(timeout=0.3) is None
            assert stream.state is StreamState.FINISHED
    assert jbroker.stats()["memory_used_bytes"] == 0


async def test_chunk_headers(jbroker: RunningBroker) -> None:
    data = payload(25)
    async with await Client.connect(jbroker.address) as client:
        sent = await client.send_stream(Q, data, chunk_size=10, stream_id="s-1")
        sub = await client.subscribe(Q, ack="client-individual")
        got = [await sub.get(5) for _ in range(3)]
    headers = [m.headers for m in got if m is not None]
    assert [h["x-stream-seq"] for h in headers] == ["0", "1", "2"]
    assert [h["x-stream-offset"] for h in headers] == ["0", "10", "20"]
    assert [h["x-dedup-id"] for h in headers] == ["s-1:0", "s-1:1", "s-1:2"]
    assert all(h["JMSXGroupID"] == "s-1" == h["x-stream-id"] for h in headers)
    assert all(h["persistent"] == "true" for h in headers)
    assert "x-stream-end" not in headers[1]
    assert headers[2]["x-stream-end"] == "true"
    assert headers[2]["x-stream-length"] == "25"
    assert headers[2]["x-stream-sha256"] == sha(data) == sent.sha256


@pytest.mark.parametrize("kind", ["bytes", "path", "file", "iterable", "async", "empty"])
async def test_sources(jbroker: RunningBroker, tmp_path: Path, kind: str) -> None:
    data = b"" if kind == "empty" else payload(100_003)
    source: Any
    if kind == "path":
        source = tmp_path / "f.bin"
        source.write_bytes(data)
    elif kind == "file":
        source = io.BytesIO(data)
    elif kind == "iterable":
        source = (data[i : i + 7777] for i in range(0, len(data), 7777))
    elif kind == "async":

        async def pieces() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 30_000):
                yield data[i : i + 30_000]

        source = pieces()
    else:
        source = data
    async with await Client.connect(jbroker.address) as client:
        sent = await client.send_stream(Q, source, chunk_size=16 * 1024)
        assert sent.length == len(data)
        assert sent.chunks == max(1, -(-len(data) // (16 * 1024)))
        async with client.stream_reader(Q) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert await _read_all(stream) == data
            assert stream.verified


async def test_read_sizes_and_readinto(jbroker: RunningBroker) -> None:
    data = payload(10_000)
    async with await Client.connect(jbroker.address) as client:
        await client.send_stream(Q, data, chunk_size=3000)
        async with client.stream_reader(Q) as reader:
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            first = await stream.read(100)
            assert first == data[:100]
            assert await stream.read() == data[100:3000]  # the rest of the chunk, no more
            buffer = bytearray(5000)
            count = await stream.readinto(buffer)
            assert buffer[:count] == data[3000 : 3000 + count]
            rest = await _read_all(stream)
            assert first + data[100:3000] + bytes(buffer[:count]) + rest == data
            assert await stream.read(10) == b""


async def test_window_bounds_unreceipted_chunks(
    jbroker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = 3
    outstanding = 0
    peak = 0
    original = Client.send_pipelined

    async def counting(self: Client, *args: Any, **kwargs: Any) -> PipelinedReceipt:
        nonlocal outstanding, peak
        pending = await original(self, *args, **kwargs)
        outstanding += 1
        peak = max(peak, outstanding)
        return pending

    def receipted(progress: StreamProgress) -> None:
        nonlocal outstanding
        outstanding -= 1

    monkeypatch.setattr(Client, "send_pipelined", counting)
    async with await Client.connect(jbroker.address) as client:
        sent = await client.send_stream(
            Q, payload(200_000), chunk_size=4096, window=window, on_progress=receipted
        )
    assert sent.chunks == 49
    assert outstanding == 0
    assert peak == window


async def test_progress_is_reported_in_order(jbroker: RunningBroker) -> None:
    seen: list[StreamProgress] = []
    async with await Client.connect(jbroker.address) as client:
        await client.send_stream(Q, payload(50), chunk_size=20, on_progress=seen.append)
    assert [(p.seq, p.offset_end, p.end) for p in seen] == [
        (0, 20, False),
        (1, 40, False),
        (2, 50, True),
    ]


async def test_reserved_headers_are_refused(jbroker: RunningBroker) -> None:
    async with await Client.connect(jbroker.address) as client:
        with pytest.raises(ClientError, match="x-stream-seq"):
            await client.send_stream(Q, b"x", headers={"x-stream-seq": "4"})
        with pytest.raises(ClientError, match="chunk_size"):
            await client.send_stream(Q, b"x", chunk_size=0)


async def test_several_producers_one_consumer_one_stream_at_a_time(
    jbroker: RunningBroker,
) -> None:
    files = {f"f{i}": payload(120_000 + i, seed=i) for i in range(4)}
    async with await Client.connect(jbroker.address) as consumer:
        async with consumer.stream_reader(Q, prefetch_bytes=20_000) as reader:
            # Chunks of the four streams arrive at the broker interleaved.
            producers = [await Client.connect(jbroker.address) for _ in files]
            try:
                await asyncio.gather(
                    *(
                        p.send_stream(Q, data, chunk_size=5000, stream_id=name, window=2)
                        for p, (name, data) in zip(producers, files.items(), strict=True)
                    )
                )
            finally:
                for p in producers:
                    await p.close()
            received: dict[str, bytes] = {}
            for _ in files:
                # on_gap="raise": a chunk of another stream in the middle would raise here.
                stream = await reader.next_stream(timeout=5)
                assert stream is not None
                received[stream.id] = await _read_all(stream)
                assert stream.verified
            assert received == files
            assert reader.skipped_chunks == 0


async def test_transactional_stream_is_invisible_until_commit(jbroker: RunningBroker) -> None:
    data = payload(40_000)
    release = asyncio.Event()
    sent_some = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 8000):
            if i == 24_000:
                sent_some.set()
                await release.wait()
            yield data[i : i + 8000]

    async with (
        await Client.connect(jbroker.address) as producer,
        await Client.connect(jbroker.address) as consumer,
    ):
        sending = asyncio.create_task(
            producer.send_stream(Q, slow(), chunk_size=8000, transactional=True)
        )
        async with consumer.stream_reader(Q) as reader:
            await sent_some.wait()
            assert await reader.next_stream(timeout=0.5) is None
            release.set()
            sent = await sending
            stream = await reader.next_stream(timeout=5)
            assert stream is not None
            assert stream.id == sent.stream_id
            assert await _read_all(stream) == data


def test_blocking_api(jbroker: RunningBroker, tmp_path: Path) -> None:
    data = payload(70_000)
    (tmp_path / "in.bin").write_bytes(data)
    with BlockingClient(jbroker.address) as client:
        sent = client.send_stream(Q, tmp_path / "in.bin", chunk_size=10_000, stream_id="b")
        client.send_stream(Q, b"second", stream_id="c")
        assert sent.chunks == 7
        with client.stream_reader(Q) as reader:
            got = []
            for stream in reader:
                got.append((stream.id, b"".join(stream), stream.verified))
                if len(got) == 2:
                    break
            assert got == [("b", data, True), ("c", b"second", True)]
            assert reader.next_stream(timeout=0.2) is None


async def test_asking_for_the_next_stream_too_early(jbroker: RunningBroker) -> None:
    async with await Client.connect(jbroker.address) as client:
        await client.send_stream(Q, payload(3000), chunk_size=1000, stream_id="a")
        await client.send_stream(Q, b"b", stream_id="b")
        async with client.stream_reader(Q) as reader:
            first = await reader.next_stream(timeout=5)
            assert first is not None
            await first.read(10)
            with pytest.raises(ClientError, match="not read to its end"):
                await reader.next_stream(timeout=1)
            await first.skip()
            second = await reader.next_stream(timeout=5)
            assert second is not None
            assert second.id == "b"
            assert await second.read() == b"b"
