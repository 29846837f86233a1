"""Our own client against the real broker: versions, ack modes, NACK, receipts, transactions,
errors, failover, reconnect with subscriptions restored, heart-beats."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Awaitable, Callable

import pytest

from conftest import RunningBroker, start_broker
from sluice.client import BlockingClient, BrokerErrorFrame, Client, ConnectionLost, Message


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), timeout=60))


def _queue() -> str:
    return f"/queue/client-{uuid.uuid4().hex[:10]}"


async def _get(sub: object, timeout: float = 10.0) -> Message:
    message = await sub.get(timeout=timeout)  # type: ignore[attr-defined]
    assert message is not None, "no message within the timeout"
    return message  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_each_version_send_receive_ack(broker: RunningBroker, version: str) -> None:
    async def main() -> None:
        queue = _queue()
        async with await Client.connect(broker.address, version=version) as client:
            assert client.version is not None
            assert client.version.value == version
            sub = await client.subscribe(queue, ack="client-individual")
            await client.send(queue, b"v" + version.encode(), persistent=True)
            message = await _get(sub)
            assert message.body == b"v" + version.encode()
            await client.ack(message, receipt=True)
        async with await Client.connect(broker.address) as again:
            sub = await again.subscribe(queue)
            assert await sub.get(timeout=0.3) is None

    run(main)


def test_ack_modes_and_nack(broker: RunningBroker) -> None:
    async def main() -> None:
        queue = _queue()
        async with await Client.connect(broker.address) as client:
            for i in range(4):
                await client.send(queue, b"%d" % i)
            cumulative = await client.subscribe(queue, ack="client", prefetch=4)
            messages = [await _get(cumulative) for _ in range(4)]
            await client.nack(messages[0], receipt=True)  # cumulative NACK of the first
            redelivered = await _get(cumulative)
            assert (redelivered.body, redelivered.redelivered) == (b"0", True)
            assert redelivered.delivery_count == 2
            await client.ack(messages[3], receipt=True)  # cumulative: 1, 2 and 3
            await client.ack(redelivered, receipt=True)
            await cumulative.unsubscribe()
        async with await Client.connect(broker.address) as client:
            sub = await client.subscribe(queue, ack="auto")
            assert await sub.get(timeout=0.3) is None
        assert broker.call(lambda: broker.server.broker.destinations[queue].depth) == 0

    run(main)


def test_callback_subscription_and_topic_fan_out(broker: RunningBroker) -> None:
    async def main() -> None:
        topic = f"/topic/client-{uuid.uuid4().hex[:8]}"
        got: list[bytes] = []
        done = asyncio.Event()

        def on_message(message: Message) -> None:
            got.append(message.body)
            if len(got) == 3:
                done.set()

        async with await Client.connect(broker.address) as client:
            await client.subscribe(topic, callback=on_message)
            iterating = await client.subscribe(topic)
            for i in range(3):
                await client.send(topic, b"%d" % i)
            await asyncio.wait_for(done.wait(), 10)
            assert got == [b"0", b"1", b"2"]
            seen = []
            async for message in iterating:
                seen.append(message.offset)
                if len(seen) == 3:
                    break
            assert seen == [1, 2, 3]

    run(main)


def test_transactions(broker: RunningBroker) -> None:
    async def main() -> None:
        queue = _queue()
        async with await Client.connect(broker.address) as client:
            sub = await client.subscribe(queue, ack="client-individual")
            tx = await client.begin()
            await client.send(queue, b"rolled back", transaction=tx)
            await client.abort(tx)
            async with client.transaction() as tx:
                await client.send(queue, b"a", transaction=tx)
                await client.send(queue, b"b", transaction=tx)
            first, second = await _get(sub), await _get(sub)
            assert (first.body, second.body) == (b"a", b"b")
            async with client.transaction() as tx:
                await client.ack(first, transaction=tx)
                await client.ack(second, transaction=tx)
            assert await sub.get(timeout=0.3) is None

    run(main)


def test_broker_error_fails_the_send(broker: RunningBroker) -> None:
    async def main() -> None:
        async with await Client.connect(broker.address, reconnect=False) as client:
            with pytest.raises(BrokerErrorFrame, match="must start with"):
                await client.send("no-such-kind", b"x")

    run(main)


def test_failover_to_the_second_broker(broker: RunningBroker) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]

    async def main() -> None:
        addresses = f"127.0.0.1:{dead_port},{broker.address}"
        async with await Client.connect(addresses) as client:
            assert client.broker == broker.address
            await client.send(_queue(), b"x")

    run(main)


def test_reconnect_restores_subscriptions_after_a_broker_restart() -> None:
    first = start_broker()
    port = first.port
    second: RunningBroker | None = None

    async def main() -> None:
        nonlocal second
        queue = _queue()
        client = await Client.connect(
            f"127.0.0.1:{port}", initial_reconnect_delay_s=0.05, max_reconnect_delay_s=0.2
        )
        try:
            sub = await client.subscribe(queue)
            epoch = client.epoch
            first.stop()
            second = start_broker(stomp={"port": port})
            # The client reconnects by itself and re-subscribes with the same id. A send made
            # before it noticed the drop fails as lost; one made after waits for the new link.
            for _attempt in range(3):
                try:
                    await client.send(queue, b"after restart")
                    break
                except ConnectionLost:
                    continue
            assert client.epoch > epoch
            message = await _get(sub)
            assert message.body == b"after restart"
        finally:
            await client.close()

    try:
        run(main)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_heartbeats_keep_an_idle_client_connected() -> None:
    running = start_broker(heartbeat={"send_ms": 100, "receive_ms": 100})
    try:

        async def main() -> None:
            async with await Client.connect(running.address, heartbeat_ms=(100, 100)) as client:
                sub = await client.subscribe(_queue())
                assert await sub.get(timeout=1.0) is None  # ten beat intervals of silence
                assert client.connected
            assert running.stats().get("heartbeat_timeouts", 0) == 0

        run(main)
    finally:
        running.stop()


def test_blocking_client_round_trip(broker: RunningBroker) -> None:
    queue = _queue()
    with BlockingClient(broker.address) as client:
        sub = client.subscribe(queue, ack="client-individual")
        client.send(queue, b"blocking", persistent=True)
        message = sub.receive(timeout=10)
        assert message is not None
        assert message.body == b"blocking"
        client.ack(message)
