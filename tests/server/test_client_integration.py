"""Our own client against the real broker: versions, ack modes, NACK, receipts, transactions,
errors, failover, reconnect with subscriptions restored, heart-beats."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

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


MiB = 1024 * 1024


def _journal_broker(tmp_path: Path, limit_bytes: int) -> RunningBroker:
    return start_broker(
        store={"kind": "journal", "data_dir": str(tmp_path / "data")},
        limits={
            "memory_limit_bytes": limit_bytes,
            "destination_memory_limit_bytes": limit_bytes,
        },
    )


def _chunk(i: int) -> bytes:
    return b"%08d" % i + bytes([i % 251]) * (MiB - 8)


@pytest.mark.parametrize(
    ("kind", "persistent", "count"),
    [("queue", False, 40), ("topic", False, 12), ("topic", True, 12)],
)
def test_a_transaction_larger_than_memory_is_written_not_held(
    tmp_path: Path, kind: str, persistent: bool, count: int
) -> None:
    """With a 4 MiB memory limit, a transaction of 12-40 MiB: its messages go to the store (or
    the temp store) as they arrive, the broker holds only their stubs, and the COMMIT is read
    and answered; then every message arrives whole and in order."""
    running = _journal_broker(tmp_path, 4 * MiB)

    async def main() -> None:
        dest = f"/{kind}/big-{uuid.uuid4().hex[:8]}"
        async with (
            await Client.connect(running.address) as producer,
            await Client.connect(running.address) as consumer,
        ):
            sub = await consumer.subscribe(dest, ack="client-individual", prefetch=2)
            tx = await producer.begin()
            for i in range(count):
                await producer.send(
                    dest, _chunk(i), persistent=persistent, transaction=tx, receipt=False
                )
            await producer.send("/queue/fence", b"", receipt=True)  # every SEND was read
            held = running.stats()["memory_used_bytes"]
            assert held < MiB, held
            await asyncio.wait_for(producer.commit(tx), 15)
            for i in range(count):
                message = await _get(sub, 15)
                assert message.body == _chunk(i)
                await consumer.ack(message)
            assert await sub.get(timeout=0.2) is None
        stats = running.stats()
        assert stats.get("flow_paused_memory", 0) == 0
        assert stats["pending_writes"] == 0

    try:
        run(main)
    finally:
        running.stop()


def test_an_aborted_non_persistent_transaction_leaves_nothing(tmp_path: Path) -> None:
    running = _journal_broker(tmp_path, 4 * MiB)

    async def main() -> None:
        queue = _queue()
        async with await Client.connect(running.address) as client:
            sub = await client.subscribe(queue)
            tx = await client.begin()
            for i in range(8):
                await client.send(queue, _chunk(i), transaction=tx, receipt=False)
            await client.abort(tx)
            await client.send(queue, b"after", receipt=True)
            assert (await _get(sub)).body == b"after"
            assert await sub.get(timeout=0.2) is None
        assert running.stats()["memory_used_bytes"] == 0

    try:
        run(main)
    finally:
        running.stop()


def test_transacted_ack_is_undone_by_abort_and_final_at_commit(broker: RunningBroker) -> None:
    async def main() -> None:
        queue = _queue()
        async with await Client.connect(broker.address) as client:
            await client.send(queue, b"work", persistent=True)
            sub = await client.subscribe(queue, ack="client-individual")
            first = await _get(sub)
            tx = await client.begin()
            await client.ack(first, transaction=tx)
            await client.abort(tx)
            again = await _get(sub)  # the aborted ACK did not count
            assert (again.body, again.redelivered) == (b"work", True)
            async with client.transaction() as tx:
                await client.ack(again, transaction=tx)
        async with await Client.connect(broker.address) as client:
            sub = await client.subscribe(queue, ack="client-individual")
            assert await sub.get(timeout=0.3) is None  # the committed ACK did
        assert broker.call(lambda: broker.server.broker.destinations[queue].depth) == 0

    run(main)


def test_disconnect_aborts_a_transaction_with_sends_and_acks(broker: RunningBroker) -> None:
    async def main() -> None:
        queue, out = _queue(), _queue()
        async with await Client.connect(broker.address) as client:
            await client.send(queue, b"taken in the transaction", persistent=True)
        dying = await Client.connect(broker.address, reconnect=False)
        sub = await dying.subscribe(queue, ack="client-individual")
        message = await _get(sub)
        tx = await dying.begin()
        await dying.ack(message, transaction=tx)
        await dying.send(out, b"never committed", transaction=tx)
        await dying.close()  # DISCONNECT with the transaction open
        async with await Client.connect(broker.address) as client:
            back = await client.subscribe(queue, ack="client-individual")
            returned = await _get(back)
            assert (returned.body, returned.redelivered) == (b"taken in the transaction", True)
            await client.ack(returned)
            nothing = await client.subscribe(out)
            assert await nothing.get(timeout=0.3) is None

    run(main)


def test_jms_headers_pass_through_our_client(broker: RunningBroker) -> None:
    async def main() -> None:
        queue = _queue()
        headers = {
            "reply-to": "/queue/replies",
            "correlation-id": "order-42",
            "type": "invoice",
            "region": "eu:west",
        }
        async with await Client.connect(broker.address) as client:
            sub = await client.subscribe(queue)
            await client.send(queue, b"x", headers=headers)
            message = await _get(sub)
            for name, value in headers.items():
                assert message.headers[name] == value

    run(main)


def test_x_offset_latest_and_timestamp_through_our_client() -> None:
    # A clock a millisecond later at every reading: every message has its own timestamp.
    clock = itertools.count(int(time.time() * 1000))
    running = start_broker(now_ms=lambda: next(clock), policy={"retention_s": 3600.0})

    async def main() -> None:
        topic = f"/topic/replay-{uuid.uuid4().hex[:8]}"
        async with await Client.connect(running.address) as client:
            for i in range(3):
                await client.send(topic, b"old-%d" % i)
            probe = await client.subscribe(topic, headers={"x-offset": "earliest"})
            stamps = [int((await _get(probe)).headers["timestamp"]) for _ in range(3)]
            assert stamps[0] < stamps[1] < stamps[2]
            by_time = await client.subscribe(topic, headers={"x-offset": f"timestamp={stamps[1]}"})
            assert [(await _get(by_time)).body for _ in range(2)] == [b"old-1", b"old-2"]
            latest = await client.subscribe(topic, headers={"x-offset": "latest"})
            await client.send(topic, b"new")
            assert (await _get(latest)).body == b"new"
            assert (await _get(by_time)).body == b"new"
            assert await latest.get(timeout=0.2) is None

    try:
        run(main)
    finally:
        running.stop()
