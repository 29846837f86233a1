"""A stream larger than the destination's memory limit, read while it is being sent: the broker
pages chunks out and back in, and the consumer still gets every chunk once, in order."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from conftest import start_broker
from sluice.client import Client

from .conftest import JOURNAL_FILE_BYTES, Q, payload

KiB = 1024
MEMORY_LIMIT = 512 * KiB
CHUNK = 32 * KiB
CREDIT = 128 * KiB
STREAM_BYTES = 24 * 1024 * KiB


async def test_stream_read_while_sent_past_the_memory_limit_arrives_in_order(
    tmp_path: Path,
) -> None:
    broker = start_broker(
        store={
            "kind": "journal",
            "data_dir": str(tmp_path / "data"),
            "journal_file_bytes": JOURNAL_FILE_BYTES,
        },
        limits={"destination_memory_limit_bytes": MEMORY_LIMIT},
    )
    try:
        data = payload(STREAM_BYTES, seed=3)
        async with await Client.connect(broker.address) as consumer:
            async with consumer.stream_reader(Q, prefetch_bytes=CREDIT) as reader:

                async def produce() -> None:
                    async with await Client.connect(broker.address) as producer:
                        await producer.send_stream(
                            Q, data, chunk_size=CHUNK, window=16, stream_id="live"
                        )

                sending = asyncio.create_task(produce())
                stream = await reader.next_stream(timeout=10)
                assert stream is not None
                digest = hashlib.sha256()
                received = 0
                async for piece in stream:
                    digest.update(piece)
                    received += len(piece)
                await sending
        assert received == STREAM_BYTES
        assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
        assert stream.verified
    finally:
        broker.stop()
