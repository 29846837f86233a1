"""Broker-side behaviour of streams found while building the client."""

from __future__ import annotations

import asyncio
import contextlib

from conftest import start_broker
from sluice.client import Client, ConnectionLost
from waiting import wait_until

from .conftest import Q, payload


async def test_stream_of_a_producer_paused_by_flow_control_is_not_aborted_as_idle() -> None:
    # Memory store: persistent messages stay in memory, so a full destination pauses producers.
    broker = start_broker(
        policy={"stream_idle_timeout_s": 0.3},
        limits={"destination_memory_limit_bytes": 256 * 1024},
    )
    try:
        data = payload(2 * 1024 * 1024)
        producer = await Client.connect(broker.address, reconnect=False)
        sending = asyncio.create_task(producer.send_stream(Q, data, chunk_size=64 * 1024, window=4))
        try:
            await asyncio.to_thread(
                wait_until, lambda: broker.stats().get("flow_paused_memory", 0) > 0
            )
            # The producer is alive and willing; only the broker holds it back. Run the sweep
            # as if ten idle timeouts had passed.
            core = broker.server.broker
            broker.call(lambda: core.abort_idle_streams(core.now_ms() + 3_000))
            aborted = broker.stats().get("streams_aborted", 0)
            async with await Client.connect(broker.address) as consumer:
                async with consumer.stream_reader(Q) as reader:
                    stream = await reader.next_stream(timeout=5)
                    assert stream is not None
                    out = bytearray()
                    async for piece in stream:
                        out += piece
                    assert bytes(out) == data
            await sending
        finally:
            sending.cancel()
            with contextlib.suppress(BaseException):
                await sending
            # Its connection may still be paused: drop it rather than wait for DISCONNECT.
            link = producer._connector.link
            if link is not None:
                link.abort(ConnectionLost("test over"))
            await producer.close()
        assert aborted == 0
    finally:
        broker.stop()
