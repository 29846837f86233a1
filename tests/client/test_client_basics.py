"""The asyncio client against the fake broker: handshake, send, subscribe, ack, transactions."""

from __future__ import annotations

import asyncio

import pytest

from sluice.client import (
    AckMode,
    BrokerErrorFrame,
    Client,
    ClientError,
    ClientState,
    ConnectionLost,
    Message,
    ReceiptTimeout,
)
from sluice.client.address import BrokerAddress, backoff_delay_s, parse_brokers
from sluice.client.message import message_from_frame
from sluice.client.slots import Slots
from sluice.stomp.frames import Command, Frame, Version


def _without_receipt(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != "receipt"}


# Pure parts.


def test_parse_brokers_forms() -> None:
    assert parse_brokers("h1:1,h2:2") == (BrokerAddress("h1", 1), BrokerAddress("h2", 2))
    assert parse_brokers(["stomp://a:5", " b "]) == (
        BrokerAddress("a", 5),
        BrokerAddress("b", 61613),
    )
    assert parse_brokers("[::1]:7") == (BrokerAddress("::1", 7),)
    assert str(BrokerAddress("::1", 7)) == "[::1]:7"
    for bad in ("", "h:x", "h:70000", "[::1"):
        with pytest.raises(ClientError):
            parse_brokers(bad)


def test_backoff_doubles_up_to_the_bound_with_jitter() -> None:
    assert backoff_delay_s(0, 0.1, 5.0) == 0.0
    for round_number, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (10, 5.0), (500, 5.0)):
        delay = backoff_delay_s(round_number, 0.1, 5.0)
        assert ceiling / 2 <= delay <= ceiling


def test_message_from_frame_per_version() -> None:
    headers = {
        "destination": "/queue/a",
        "message-id": "m-1",
        "subscription": "s1",
        "ack": "a-1",
        "redelivered": "true",
        "x-delivery-count": "3",
        "x-offset": "42",
    }
    frame = Frame(Command.MESSAGE, headers, "héllo".encode())
    message = message_from_frame(frame, Version.V1_2, 7)
    assert (message.ack_id, message.message_id, message.subscription) == ("a-1", "m-1", "s1")
    assert message.redelivered
    assert message.delivery_count == 3
    assert message.offset == 42
    assert message.text == "héllo"
    assert message.connection_epoch == 7
    old = message_from_frame(frame, Version.V1_1, 1)
    assert old.ack_id == "m-1"
    bare = message_from_frame(
        Frame(Command.MESSAGE, {"destination": "/queue/a", "message-id": "m-2"}),
        Version.V1_0,
        1,
        "s9",
    )
    assert bare.subscription == "s9"
    assert bare.delivery_count == 1
    assert bare.offset is None


# Connecting.


async def test_connect_negotiates_and_sends_connect_headers(fake_broker) -> None:
    async with fake_broker(heartbeat_ms=(4000, 6000)) as broker:
        client = await Client.connect(
            broker.address,
            login="user",
            passcode="secret",
            client_id="c-1",
            heartbeat_ms=(5000, 3000),
        )
        async with client:
            assert client.state is ClientState.CONNECTED
            assert client.connected
            assert client.version is Version.V1_2
            assert client.broker == broker.address
            connect = broker.last.received[0]
            assert connect.command is Command.CONNECT
            assert connect.headers["accept-version"] == "1.0,1.1,1.2"
            assert connect.headers["host"] == "127.0.0.1"
            assert connect.headers["login"] == "user"
            assert connect.headers["passcode"] == "secret"
            assert connect.headers["client-id"] == "c-1"
            assert connect.headers["heart-beat"] == "5000,3000"
            negotiated = client._connector.link.negotiated  # type: ignore[union-attr]
            assert negotiated is not None
            assert (negotiated.send_heartbeat_ms, negotiated.receive_heartbeat_ms) == (6000, 4000)


@pytest.mark.parametrize(
    ("offered", "supported", "expected"),
    [
        ("1.1", (Version.V1_0, Version.V1_1, Version.V1_2), Version.V1_1),
        ("1.2", (Version.V1_0,), Version.V1_0),
    ],
)
async def test_version_offer_and_choice(fake_broker, offered, supported, expected) -> None:
    async with fake_broker(versions=supported) as broker:
        async with await Client.connect(broker.address, version=offered) as client:
            assert client.version is expected
            accept = broker.last.received[0].headers["accept-version"]
            assert accept == ("1.0,1.1" if offered == "1.1" else "1.0,1.1,1.2")


async def test_refused_connect_raises_broker_error(fake_broker) -> None:
    async with fake_broker(refuse_connect="bad credentials") as broker:
        with pytest.raises(BrokerErrorFrame) as info:
            await Client.connect(broker.address, login="x", passcode="y")
        assert info.value.message == "bad credentials"


async def test_no_broker_reachable(refused_address) -> None:
    with pytest.raises(ClientError, match="no broker reachable"):
        await Client.connect([refused_address, refused_address], connect_timeout_s=2)


# Sending.


async def test_send_with_receipt_carries_headers_and_body(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        await client.send(
            "/queue/a",
            "hello",
            headers={"priority": "7", "x-dedup-id": "d1"},
            persistent=True,
            content_type="text/plain",
        )
        await client.send("/queue/a", b"\x00binary\x00", receipt=True)
        first, second = broker.frames(Command.SEND)
        assert first.body == b"hello"
        assert first.headers["destination"] == "/queue/a"
        assert first.headers["persistent"] == "true"
        assert first.headers["content-type"] == "text/plain"
        assert first.headers["priority"] == "7"
        assert first.headers["x-dedup-id"] == "d1"
        assert "receipt" in first.headers
        assert second.body == b"\x00binary\x00"
        assert "persistent" not in second.headers


async def test_pipelined_sends_match_receipts_by_id(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        link = client._connector.link
        assert link is not None
        flushes = 0
        flush = link._flush

        def counting_flush() -> None:
            nonlocal flushes
            flushes += 1
            flush()

        link._flush = counting_flush  # type: ignore[method-assign]
        for i in range(300):
            await client.send("/queue/p", f"fast-{i}", receipt=False)
        # Sent in one loop turn, the 300 frames go out in one write at its end.
        assert flushes == 0
        await asyncio.gather(*(client.send("/queue/p", f"r-{i}") for i in range(200)))
        assert flushes <= 3
        bodies = [f.body.decode() for f in broker.frames(Command.SEND)]
        assert bodies == [f"fast-{i}" for i in range(300)] + [f"r-{i}" for i in range(200)]
        assert link.pending_receipts == 0


async def test_receipt_slots_are_fifo_and_bounded() -> None:
    slots = Slots(2)
    order: list[int] = []
    arrived = [asyncio.Event() for _ in range(5)]
    holding = [asyncio.Event() for _ in range(5)]
    releases = [asyncio.Event() for _ in range(5)]

    async def hold(i: int) -> None:
        arrived[i].set()  # the acquire below queues this task before it next yields
        async with slots:
            order.append(i)
            holding[i].set()
            await releases[i].wait()

    tasks = [asyncio.ensure_future(hold(i)) for i in range(5)]
    async with asyncio.timeout(5):
        for event in arrived:
            await event.wait()
    assert order == [0, 1]
    assert slots.waiting == 3
    tasks[2].cancel()  # a cancelled waiter is skipped, never given a slot
    releases[0].set()
    await tasks[0]
    async with asyncio.timeout(5):
        await holding[3].wait()
    assert order == [0, 1, 3]
    for i in (1, 3, 4):
        releases[i].set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1, 3, 4]
    assert tasks[2].cancelled()
    assert slots.waiting == 0


async def test_error_with_receipt_id_fails_that_send_only(fake_broker) -> None:
    async with fake_broker() as broker:
        broker.fail_destinations.add("/queue/bad")
        async with await Client.connect(broker.address, initial_reconnect_delay_s=0.01) as client:
            results = await asyncio.gather(
                client.send("/queue/good", "1"),
                client.send("/queue/bad", "2"),
                client.send("/queue/good", "3"),
                return_exceptions=True,
            )
            assert results[0] is None
            assert isinstance(results[1], BrokerErrorFrame)
            assert results[1].message == "refused /queue/bad"
            assert results[1].headers.get("receipt-id") is not None
            # Written before the ERROR came back, on a connection the broker then closed.
            assert isinstance(results[2], ConnectionLost)
            # The client reconnects and carries on.
            await client.send("/queue/good", "4")
            assert len(broker.connections) == 2
            assert broker.last.received[-1].body == b"4"


async def test_error_without_receipt_id_fails_every_waiter(fake_broker) -> None:
    async with fake_broker() as broker:
        broker.hold_destinations.add("/queue/hold")
        broker.fail_destinations.add("/queue/bad")
        async with await Client.connect(broker.address, reconnect=False) as client:
            held = [asyncio.ensure_future(client.send("/queue/hold", str(i))) for i in range(2)]
            await broker.wait_for(lambda: len(broker.frames(Command.SEND)) == 2)
            await client.send("/queue/bad", "boom", receipt=False)
            for task in held:
                with pytest.raises(BrokerErrorFrame, match="refused /queue/bad"):
                    await task
            assert client.state is ClientState.FAILED
            with pytest.raises(ClientError):
                await client.send("/queue/a", "after")


async def test_receipt_timeout(fake_broker) -> None:
    async with fake_broker() as broker:
        broker.hold_destinations.add("/queue/hold")
        async with await Client.connect(broker.address, receipt_timeout_s=0.2) as client:
            with pytest.raises(ReceiptTimeout, match="SEND to /queue/hold"):
                await client.send("/queue/hold", "x")
            assert client._connector.link.pending_receipts == 0  # type: ignore[union-attr]
            await client.send("/queue/other", "y")


# Subscribing.


async def test_message_before_receipt_of_its_send(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        sub = await client.subscribe("/queue/loop")
        await client.send("/queue/loop", "ping")
        commands = [f.command for f in broker.last.sent]
        assert commands[-2:] == [Command.MESSAGE, Command.RECEIPT]
        message = await sub.get(timeout=5)
        assert message is not None
        assert message.text == "ping"
        assert message.destination == "/queue/loop"
        assert message.subscription == sub.id


async def test_subscribe_headers_and_async_iteration(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        sub = await client.subscribe(
            "/topic/t",
            ack="client",
            headers={"activemq.exclusive": "true"},
            prefetch=10,
            prefetch_bytes=4096,
            selector="kind = 'a'",
            id="mine",
        )
        subscribe = broker.frames(Command.SUBSCRIBE)[0]
        assert _without_receipt(subscribe.headers) == {
            "activemq.exclusive": "true",
            "destination": "/topic/t",
            "id": "mine",
            "ack": "client",
            "activemq.prefetchSize": "10",
            "x-prefetch-bytes": "4096",
            "selector": "kind = 'a'",
        }
        assert sub.id == "mine"
        assert sub.ack is AckMode.CLIENT
        for i in range(3):
            broker.last.deliver("mine", "/topic/t", f"m{i}".encode(), {"x-offset": str(i)})
        received: list[Message] = []
        async for message in sub:
            received.append(message)
            if len(received) == 3:
                break
        assert [m.text for m in received] == ["m0", "m1", "m2"]
        assert [m.offset for m in received] == [0, 1, 2]
        assert await sub.get(timeout=0.01) is None
        with pytest.raises(ClientError, match="in use"):
            await client.subscribe("/topic/t", id="mine")


async def test_callbacks_plain_and_async(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        seen: list[str] = []
        done = asyncio.Event()

        def plain(message: Message) -> None:
            seen.append("plain:" + message.text)
            if message.text == "boom":
                raise ValueError("a callback failure is logged, not fatal")

        async def awaited(message: Message) -> None:
            await asyncio.sleep(0)
            seen.append("async:" + message.text)
            if len(seen) == 4:
                done.set()

        await client.subscribe("/queue/p", callback=plain)
        sub = await client.subscribe("/queue/q", callback=awaited)
        with pytest.raises(ClientError, match="callback"):
            await sub.get()
        for destination, body in (("/queue/p", "boom"), ("/queue/p", "x"), ("/queue/q", "y")):
            await client.send(destination, body)
        await client.send("/queue/q", "z")
        await asyncio.wait_for(done.wait(), 5)
        assert sorted(seen) == ["async:y", "async:z", "plain:boom", "plain:x"]


async def test_unsubscribe_sends_frame_and_ends_iteration(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        sub = await client.subscribe("/queue/u")
        await client.send("/queue/u", "kept")
        # The MESSAGE came before the SEND's RECEIPT, so it is buffered by now.
        assert sub.queued == 1
        await sub.unsubscribe(headers={"activemq.subscriptionName": "d"})
        unsubscribe = broker.frames(Command.UNSUBSCRIBE)[0]
        assert unsubscribe.headers["id"] == sub.id
        assert unsubscribe.headers["activemq.subscriptionName"] == "d"
        assert sub.closed
        assert sub.id not in client.subscriptions
        # What was buffered can still be read; then iteration ends.
        assert [m.text async for m in sub] == ["kept"]
        with pytest.raises(ClientError, match="closed"):
            await sub.get()


# Acknowledging.


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
async def test_ack_and_nack_headers_per_version(fake_broker, version) -> None:
    async with fake_broker() as broker:
        async with await Client.connect(broker.address, version=version) as client:
            sub = await client.subscribe("/queue/a", ack="client-individual")
            for body in (b"one", b"two"):
                broker.last.deliver(sub.id, "/queue/a", body)
            first = await sub.get(timeout=5)
            second = await sub.get(timeout=5)
            assert first is not None
            assert second is not None
            await client.ack(first, receipt=True)
            ack = broker.frames(Command.ACK)[0]
            if version == "1.2":
                assert _without_receipt(ack.headers) == {"id": f"ack:{first.message_id}"}
            else:
                assert _without_receipt(ack.headers) == {
                    "message-id": first.message_id,
                    "subscription": sub.id,
                }
            if version == "1.0":
                with pytest.raises(ClientError, match="NACK"):
                    await client.nack(second)
                return
            await client.nack(second, receipt=True)
            nack = broker.frames(Command.NACK)[0]
            key = "id" if version == "1.2" else "message-id"
            assert nack.headers[key] == second.ack_id


async def test_ack_on_auto_subscription_is_refused(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        sub = await client.subscribe("/queue/a")
        await client.send("/queue/a", "x")
        message = await sub.get(timeout=5)
        assert message is not None
        with pytest.raises(ClientError, match="ack=auto"):
            await client.ack(message)
        assert broker.frames(Command.ACK) == []


# Transactions.


async def test_transaction_commit_and_abort(fake_broker) -> None:
    async with fake_broker() as broker, await Client.connect(broker.address) as client:
        tx = await client.begin()
        await client.send("/queue/t", "a", transaction=tx)
        await client.send("/queue/t", "b", transaction=tx, receipt=False)
        assert broker.routed == []
        await client.commit(tx)
        assert [f.body for f in broker.routed] == [b"a", b"b"]
        commit = broker.frames(Command.COMMIT)[0]
        assert commit.headers["transaction"] == tx
        assert "receipt" in commit.headers
        with pytest.raises(ClientError, match="not open"):
            await client.send("/queue/t", "late", transaction=tx)

        async def fail_inside() -> str:
            async with client.transaction() as tx2:
                await client.send("/queue/t", "c", transaction=tx2)
                raise RuntimeError(tx2)

        with pytest.raises(RuntimeError) as info:
            await fail_inside()
        tx2 = str(info.value)
        assert broker.frames(Command.ABORT)[0].headers["transaction"] == tx2
        async with client.transaction() as tx3:
            await client.send("/queue/t", "d", transaction=tx3)
        assert [f.body for f in broker.routed] == [b"a", b"b", b"d"]
        with pytest.raises(ClientError, match="not open"):
            await client.commit("never-begun")


# Closing.


async def test_close_is_clean_and_final(fake_broker) -> None:
    async with fake_broker() as broker:
        client = await Client.connect(broker.address)
        sub = await client.subscribe("/queue/c")

        async def slow(message: Message) -> None:
            await asyncio.Event().wait()  # never returns: close must cancel it

        await client.subscribe("/queue/slow", callback=slow)
        await client.send("/queue/slow", "stuck")
        await broker.wait_for(lambda: any(f.command is Command.MESSAGE for f in broker.last.sent))
        iterated: list[Message] = []

        async def consume() -> None:
            async for message in sub:
                iterated.append(message)

        consumer = asyncio.ensure_future(consume())
        await client.close()
        await asyncio.wait_for(consumer, 5)
        assert iterated == []
        disconnect = broker.frames(Command.DISCONNECT)[0]
        assert "receipt" in disconnect.headers
        assert broker.last.sent[-1].command is Command.RECEIPT
        await asyncio.wait_for(broker.last.closed, 5)
        assert client.state is ClientState.CLOSED
        with pytest.raises(ClientError, match="closed"):
            await client.send("/queue/c", "x")
        await client.close()  # twice is fine
