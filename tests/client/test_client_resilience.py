"""Failover, reconnection, heart-beats and flow control of the asyncio client."""

from __future__ import annotations

import asyncio

import pytest

from sluice.client import Client, ClientError, ClientState, ConnectionLost, Message
from sluice.client.link import FLUSH_BYTES, WRITE_BUFFER_HIGH_BYTES, ClientLink
from sluice.stomp.frames import Command


def _link(client: Client) -> ClientLink:
    link = client._connector.link
    assert link is not None
    return link


def _without_receipt(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != "receipt"}


async def test_failover_to_the_second_broker(fake_broker, refused_address) -> None:
    async with fake_broker() as broker:
        async with await Client.connect(f"{refused_address},{broker.address}") as client:
            assert client.broker == broker.address
            await client.send("/queue/a", "x")
            assert broker.frames(Command.SEND)[0].body == b"x"


async def test_reconnect_restores_subscriptions_and_fails_in_flight(fake_broker) -> None:
    async with fake_broker() as broker:
        broker.hold_destinations.add("/queue/hold")
        client = await Client.connect(broker.address, initial_reconnect_delay_s=0.01)
        async with client:
            queue_sub = await client.subscribe("/queue/a", id="s1", prefetch=5, selector="x > 1")
            topic_sub = await client.subscribe("/topic/b", ack="client")
            first = broker.last
            tx = await client.begin()
            held = asyncio.ensure_future(client.send("/queue/hold", "maybe"))
            await broker.wait_for(lambda: len(broker.frames(Command.SEND)) == 1)

            first.drop()

            # Written, never receipted: the outcome is unknown, so the caller hears of it.
            with pytest.raises(ConnectionLost):
                await held
            await broker.wait_for(lambda: len(broker.connections) == 2)
            second = broker.last
            await broker.wait_for(lambda: len(second.subscriptions) == 2)
            before = [_without_receipt(f.headers) for f in broker.frames(Command.SUBSCRIBE, first)]
            after = [_without_receipt(f.headers) for f in broker.frames(Command.SUBSCRIBE, second)]
            assert after == before
            assert second.received[0].command is Command.CONNECT

            # The transaction died with the connection.
            with pytest.raises(ClientError, match="not open"):
                await client.send("/queue/a", "in tx", transaction=tx)
            with pytest.raises(ClientError, match="not open"):
                await client.commit(tx)

            # Subscriptions work on the new connection.
            await client.send("/queue/a", "again")
            message = await queue_sub.get(timeout=5)
            assert message is not None
            assert message.text == "again"
            assert message.connection_epoch == client.epoch == 2
            await client.send("/topic/b", "news")
            news = await topic_sub.get(timeout=5)
            assert news is not None
            assert news.text == "news"


async def test_unacked_messages_of_a_lost_connection(fake_broker) -> None:
    async with fake_broker() as broker:
        client = await Client.connect(broker.address, initial_reconnect_delay_s=0.01)
        async with client:
            sub = await client.subscribe("/queue/c", ack="client")
            auto = await client.subscribe("/queue/auto")
            for body in (b"taken", b"buffered"):
                broker.last.deliver(sub.id, "/queue/c", body)
            broker.last.deliver(auto.id, "/queue/auto", b"auto")
            taken = await sub.get(timeout=5)
            assert taken is not None
            # A receipt comes after every frame the broker wrote before it.
            await client.send("/queue/sync", "")
            assert sub.queued == 1
            assert auto.queued == 1

            broker.last.drop()
            await broker.wait_for(
                lambda: len(broker.connections) == 2 and len(broker.last.subscriptions) == 2
            )
            assert client.state is ClientState.CONNECTED
            assert client.epoch == 2

            # The broker redelivers client-ack messages: the stale copy is gone, its ack refused.
            assert sub.queued == 0
            with pytest.raises(ConnectionLost, match="redelivers"):
                await client.ack(taken)
            # An auto-ack message was consumed on delivery: it stays.
            kept = await auto.get(timeout=5)
            assert kept is not None
            assert kept.text == "auto"
            assert broker.frames(Command.ACK) == []


async def test_reconnect_fails_over_when_a_broker_goes_away(fake_broker) -> None:
    async with fake_broker() as first, fake_broker() as second:
        client = await Client.connect(
            [first.address, second.address], initial_reconnect_delay_s=0.01
        )
        async with client:
            sub = await client.subscribe("/queue/f")
            await first.close()
            await second.wait_for(lambda: len(second.connections) == 1)
            await client.send("/queue/f", "via second")
            message = await sub.get(timeout=5)
            assert message is not None
            assert message.text == "via second"
            assert client.broker == second.address


async def test_lost_connection_without_reconnect_fails_everything(fake_broker) -> None:
    async with fake_broker() as broker:
        client = await Client.connect(broker.address, reconnect=False)
        sub = await client.subscribe("/queue/a")
        broker.last.drop()
        with pytest.raises(ConnectionLost, match="reconnect is off"):
            async for _ in sub:
                pass
        assert client.state is ClientState.FAILED
        with pytest.raises(ConnectionLost):
            await client.send("/queue/a", "x")
        await client.close()
        assert client.state is ClientState.CLOSED


async def test_heartbeats_sent_and_silent_broker_dropped(fake_broker) -> None:
    async with fake_broker(heartbeat_ms=(50, 50), send_heartbeats=False) as broker:
        client = await Client.connect(
            broker.address, heartbeat_ms=(50, 50), initial_reconnect_delay_s=0.01
        )
        async with client:
            first = broker.last
            # We keep beating while idle...
            await broker.wait_for(lambda: first.heartbeats >= 1)
            # ...and give up on a broker silent for 50 ms x 2, then reconnect.
            await asyncio.wait_for(first.closed, 5)
            await broker.wait_for(lambda: len(broker.connections) >= 2)
            assert first.heartbeats >= 1


async def test_heartbeats_keep_a_live_connection(fake_broker) -> None:
    async with fake_broker(heartbeat_ms=(40, 40)) as broker:
        client = await Client.connect(
            broker.address, heartbeat_ms=(40, 40), heartbeat_grace_factor=4.0
        )
        async with client:
            conn = broker.last
            # Many intervals pass (each side beating) without the client dropping anything.
            await broker.wait_for(lambda: conn.heartbeats >= 6)
            assert len(broker.connections) == 1
            assert client.connected


async def test_full_auto_ack_buffer_pauses_reading(fake_broker) -> None:
    max_queued = 10
    body = b"x" * 16_384
    async with fake_broker() as broker:
        async with await Client.connect(broker.address) as client:
            sub = await client.subscribe("/queue/bp", max_queued=max_queued)
            peak = 0
            deliver = sub.deliver

            def spy(message: Message) -> bool:
                nonlocal peak
                accepted = deliver(message)
                peak = max(peak, sub.queued)
                return accepted

            sub.deliver = spy  # type: ignore[method-assign]
            conn = broker.last
            pushed = 0
            # Push in batches, yielding to the loop between them so the client can read. Without
            # backpressure it would read everything and the broker would never see a full socket.
            while not conn.write_paused and pushed < 4096:
                for _ in range(32):
                    conn.deliver(sub.id, "/queue/bp", body, {"seq": str(pushed)})
                    pushed += 1
                await asyncio.sleep(0)
            assert conn.write_paused, "the broker's writes never backed up"
            assert _link(client).reading_paused
            assert sub.queued == max_queued
            assert peak == max_queued

            received = 0
            while received < pushed:
                message = await sub.get(timeout=5)
                assert message is not None
                assert message.headers["seq"] == str(received)
                received += 1
            assert peak == max_queued
            await broker.wait_for(lambda: not conn.write_paused)
            assert not _link(client).reading_paused


async def test_full_buffer_by_bytes(fake_broker) -> None:
    async with fake_broker() as broker:
        async with await Client.connect(broker.address) as client:
            sub = await client.subscribe("/queue/b", max_queued_bytes=1000)
            full = asyncio.Event()
            deliver = sub.deliver

            def spy(message: Message) -> bool:
                accepted = deliver(message)
                if sub.full:
                    full.set()
                return accepted

            sub.deliver = spy  # type: ignore[method-assign]
            for _ in range(5):
                broker.last.deliver(sub.id, "/queue/b", b"y" * 400)
            await asyncio.wait_for(full.wait(), 5)
            assert sub.queued == 3
            assert _link(client).reading_paused
            texts = [await sub.get(timeout=5) for _ in range(5)]
            assert all(m is not None for m in texts)
            assert not sub.full


async def test_close_with_a_full_buffer_does_not_stall(fake_broker) -> None:
    async with fake_broker() as broker:
        client = await Client.connect(broker.address)
        sub = await client.subscribe("/queue/full", max_queued=2)
        full = asyncio.Event()
        deliver = sub.deliver

        def spy(message: Message) -> bool:
            accepted = deliver(message)
            if sub.full:
                full.set()
            return accepted

        sub.deliver = spy  # type: ignore[method-assign]
        for i in range(10):
            broker.last.deliver(sub.id, "/queue/full", str(i).encode())
        await asyncio.wait_for(full.wait(), 5)
        # The DISCONNECT receipt waits behind MESSAGEs: closing reads on (dropping what does
        # not fit), so it comes well before the 5 s bound on that wait.
        await asyncio.wait_for(client.close(), 2)
        assert broker.last.sent[-1].command is Command.RECEIPT
        assert [m.text async for m in sub] == ["0", "1"]


async def test_send_waits_while_the_broker_does_not_read(fake_broker) -> None:
    body = b"z" * 100_000
    count = 300
    async with fake_broker() as broker:
        async with await Client.connect(broker.address) as client:
            link = _link(client)
            paused = asyncio.Event()
            pause_writing = link.pause_writing

            def spy() -> None:
                pause_writing()
                paused.set()

            link.pause_writing = spy  # type: ignore[method-assign]
            conn = broker.last
            assert conn.transport is not None
            conn.transport.pause_reading()
            sent = 0
            peak_buffer = 0

            async def produce() -> None:
                nonlocal sent, peak_buffer
                for _ in range(count):
                    await client.send("/queue/w", body, receipt=False)
                    sent += 1
                    peak_buffer = max(peak_buffer, link.write_buffer_bytes)

            producer = asyncio.ensure_future(produce())
            await asyncio.wait_for(paused.wait(), 5)
            assert not producer.done()
            assert sent < count
            assert link.write_buffer_bytes <= WRITE_BUFFER_HIGH_BYTES + FLUSH_BYTES + len(body)
            conn.transport.resume_reading()
            await asyncio.wait_for(producer, 10)
            await broker.wait_for(lambda: len(broker.frames(Command.SEND)) == count, timeout=10)
            assert peak_buffer <= WRITE_BUFFER_HIGH_BYTES + FLUSH_BYTES + len(body)
