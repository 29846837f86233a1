"""A WebSocket client and a stomp.py client on TCP exchange messages both ways through one
broker, with client-individual acks and transactions; a WebSocket consumer that stops reading
is held to the write buffer's bounds, as a TCP one is, and closed as slow past its deadline; a
WebSocket producer that does not read its replies is no longer read; stopping the management
server closes WebSockets going away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import stomp

from management.conftest import Managed, start_managed
from rawstomp import RawStomp
from server.test_interop_stomppy import Collector
from sluice.server.flow import ReadPause
from waiting import wait_until_async
from wsstomp import WsStomp

from .conftest import sessions


@pytest.fixture
def managed() -> Iterator[Managed]:
    running = start_managed()
    try:
        yield running
    finally:
        running.stop()


def _tcp_client(port: int) -> tuple[Any, Collector]:
    conn = stomp.Connection12([("127.0.0.1", port)])
    collector = Collector()
    conn.set_listener("collector", collector)
    conn.connect(wait=True)
    return conn, collector


async def _receipt(ws: WsStomp, receipt: str) -> None:
    frame = await ws.frame()
    assert (frame.command.value, frame.headers.get("receipt-id")) == ("RECEIPT", receipt), frame


async def _message(ws: WsStomp) -> Any:
    frame = await ws.frame()
    assert frame.command.value == "MESSAGE", frame
    return frame


def test_websocket_and_tcp_clients_exchange_with_acks_and_transactions(managed: Managed) -> None:
    conn, tcp = _tcp_client(managed.broker.port)

    def tcp_send(destination: str, body: str, receipt: str) -> None:
        conn.send(destination, body, receipt=receipt)
        tcp.receipt(receipt)

    def tcp_message() -> Any:
        frame = tcp.message()
        conn.ack(frame.headers["ack"])
        return frame

    async def go() -> None:
        ws = await WsStomp.open(f"http://127.0.0.1:{managed.server.port}/stomp")
        try:
            await ws.connect()
            await ws.send_text(
                "SUBSCRIBE\nid:w\ndestination:/queue/to.ws\nack:client-individual\n"
                "receipt:sub\n\n\0"
            )
            await _receipt(ws, "sub")
            conn.subscribe("/queue/to.tcp", id="t", ack="client-individual", receipt="tsub")
            await asyncio.to_thread(tcp.receipt, "tsub")

            # TCP to WebSocket, acknowledged one by one, the middle one left for later.
            for n in (1, 2, 3):
                await asyncio.to_thread(tcp_send, "/queue/to.ws", f"m{n}", f"s{n}")
            got = [await _message(ws) for _ in range(3)]
            assert [m.body for m in got] == [b"m1", b"m2", b"m3"]
            for m in (got[0], got[2]):
                await ws.send_text(f"ACK\nid:{m.headers['ack']}\nreceipt:a-{m.body.decode()}\n\n\0")
                await _receipt(ws, f"a-{m.body.decode()}")

            # WebSocket to TCP in a transaction that also acknowledges m2: nothing shows before
            # COMMIT (a message sent after it, outside, arrives first).
            await ws.send_text(
                "BEGIN\ntransaction:tx1\n\n\0"
                "SEND\ndestination:/queue/to.tcp\ntransaction:tx1\n\nin tx1\0"
                f"ACK\nid:{got[1].headers['ack']}\ntransaction:tx1\n\n\0"
                "SEND\ndestination:/queue/to.tcp\nreceipt:plain\n\noutside\0"
            )
            await _receipt(ws, "plain")
            assert (await asyncio.to_thread(tcp_message)).body == "outside"
            await ws.send_text("COMMIT\ntransaction:tx1\nreceipt:c1\n\n\0")
            await _receipt(ws, "c1")
            assert (await asyncio.to_thread(tcp_message)).body == "in tx1"

            # An ABORT drops the transaction's SEND and redelivers what it acknowledged.
            await asyncio.to_thread(tcp_send, "/queue/to.ws", "m4", "s4")
            m4 = await _message(ws)
            assert (m4.body, m4.headers.get("redelivered", "false")) == (b"m4", "false")
            await ws.send_text(
                "BEGIN\ntransaction:tx2\n\n\0"
                f"ACK\nid:{m4.headers['ack']}\ntransaction:tx2\n\n\0"
                "SEND\ndestination:/queue/to.tcp\ntransaction:tx2\n\ndropped\0"
                "ABORT\ntransaction:tx2\nreceipt:ab\n\n\0"
            )
            # The redelivery may come before the RECEIPT.
            frames = {f.command.value: f for f in [await ws.frame(), await ws.frame()]}
            assert frames["RECEIPT"].headers["receipt-id"] == "ab"
            again = frames["MESSAGE"]
            assert (again.body, again.headers["redelivered"]) == (b"m4", "true")
            await ws.send_text(f"ACK\nid:{again.headers['ack']}\nreceipt:a4\n\n\0")
            await _receipt(ws, "a4")
            await ws.send_text("SEND\ndestination:/queue/to.tcp\nreceipt:after\n\nafter abort\0")
            await _receipt(ws, "after")
            assert (await asyncio.to_thread(tcp_message)).body == "after abort"
            await ws.send_text("DISCONNECT\nreceipt:bye\n\n\0")
            await _receipt(ws, "bye")
        finally:
            await ws.close()

    try:
        asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        conn.disconnect()
    # Every message was acknowledged: nothing is left, nothing is held.
    listing = managed.http.get("/api/destinations").json["items"]
    left = {item["name"]: (item["messages_ready"], item["messages_in_flight"]) for item in listing}
    assert left["/queue/to.ws"] == (0, 0)
    assert left["/queue/to.tcp"] == (0, 0)
    assert "/queue/DLQ.to.ws" not in left


HIGH = 64 * 1024
LOW = 16 * 1024
BODY = 16 * 1024
COUNT = 2000  # 32 MiB: past what the kernel's socket buffers take on loopback


def test_a_websocket_consumer_that_does_not_read_stays_bounded() -> None:
    running = start_managed(limits={"write_buffer_high_bytes": HIGH, "write_buffer_low_bytes": LOW})
    producer = RawStomp(running.broker.port)

    def ws_session() -> Any:
        views = [s for s in sessions(running.broker) if s.subscriptions]
        return views[0] if views else None

    async def go() -> None:
        ws = await WsStomp.open(f"http://127.0.0.1:{running.server.port}/stomp")
        try:
            await ws.connect()
            await ws.send_text(
                "SUBSCRIBE\nid:s\ndestination:/queue/flood\nack:auto\nreceipt:sub\n\n\0"
            )
            await _receipt(ws, "sub")
            producer.connect()
            frame = b"SEND\ndestination:/queue/flood\n\n" + b"x" * BODY + b"\0"
            await asyncio.to_thread(producer.send, frame * COUNT)
            # The client reads nothing: once the socket buffers are full, the broker stops
            # writing to it, and reading it (until then it may pause and resume).
            held: list[bool] = []

            def held_back() -> bool:
                view = ws_session()
                held.append(view is not None and not view.writable)
                return len(held) >= 10 and all(held[-10:])

            await wait_until_async(held_back, what="the WebSocket consumer held back")
            for _ in range(20):
                view = await asyncio.to_thread(ws_session)
                assert not view.writable
                assert ReadPause.OUTBOUND in view.reasons
                # What the broker holds for it: at most about the mark, a batch and a frame.
                assert view.outbound_bytes <= 2 * HIGH + 2 * BODY, view.outbound_bytes
            # The rest waits in the queue, not in the connection; reading again, all arrive.
            bodies = 0
            while bodies < COUNT:
                message = await ws.frame(timeout=30)
                assert message.body == b"x" * BODY
                bodies += 1
        finally:
            await ws.close()

    try:
        asyncio.run(asyncio.wait_for(go(), 120))
        stats = running.broker.stats()
        assert stats["write_paused"] >= 1
        assert stats.get("slow_consumers_closed", 0) == 0
    finally:
        producer.close()
        running.stop()


def test_a_websocket_consumer_stuck_past_the_deadline_is_closed_as_slow() -> None:
    running = start_managed(
        limits={
            "write_buffer_high_bytes": HIGH,
            "write_buffer_low_bytes": LOW,
            "slow_consumer_timeout_s": 0.5,
        }
    )
    producer = RawStomp(running.broker.port)

    async def go() -> None:
        ws = await WsStomp.open(f"http://127.0.0.1:{running.server.port}/stomp")
        try:
            await ws.connect()
            await ws.send_text("SUBSCRIBE\nid:s\ndestination:/queue/stuck\nreceipt:sub\n\n\0")
            await _receipt(ws, "sub")
            producer.connect()
            frame = b"SEND\ndestination:/queue/stuck\n\n" + b"x" * BODY + b"\0"
            await asyncio.to_thread(producer.send, frame * COUNT)
            await wait_until_async(
                lambda: running.broker.stats().get("slow_consumers_closed", 0) == 1,
                what="the slow WebSocket consumer closed",
            )
            await wait_until_async(
                lambda: len(sessions(running.broker)) == 1, what="only the producer left"
            )
        finally:
            await ws.close()

    try:
        asyncio.run(asyncio.wait_for(go(), 60))
        stats = running.broker.stats()
        assert stats["closed_slow_consumer"] == 1
        # What was not delivered waits in the queue (auto-acked ones excepted).
        listing = running.http.get("/api/destinations").json["items"]
        queue = next(item for item in listing if item["name"] == "/queue/stuck")
        assert queue["messages_ready"] > 0
    finally:
        producer.close()
        running.stop()


def test_stopping_the_management_server_closes_websockets_going_away() -> None:
    running = start_managed()
    stopped = False

    async def go() -> tuple[int | None, str]:
        ws = await WsStomp.open(f"http://127.0.0.1:{running.server.port}/stomp")
        try:
            await ws.connect()
            await asyncio.to_thread(
                lambda: asyncio.run_coroutine_threadsafe(
                    running.server.stop(), running.broker.loop
                ).result(30)
            )
            closed = await ws.closed()
            return closed.code, closed.reason
        finally:
            await ws.close()

    try:
        assert asyncio.run(asyncio.wait_for(go(), 60)) == (1001, "shutdown")
        stopped = True
        assert running.broker.stats()["closed_shutdown"] == 1
    finally:
        if stopped:
            running.broker.stop()
        else:
            running.stop()


def _pairs(first: int, pairs: int) -> bytes:
    """Receipted BEGIN/ABORT pairs: each frame asks for a reply (a 200-byte receipt id) and
    costs nothing else."""
    out = []
    for n in range(first, first + 2 * pairs, 2):
        out.append(b"BEGIN\ntransaction:t\nreceipt:%08d%s\n\n\0" % (n, b"." * 192))
        out.append(b"ABORT\ntransaction:t\nreceipt:%08d%s\n\n\0" % (n + 1, b"." * 192))
    return b"".join(out)


def test_a_websocket_producer_that_does_not_read_is_not_read() -> None:
    running = start_managed(limits={"write_buffer_high_bytes": HIGH, "write_buffer_low_bytes": LOW})

    async def go() -> None:
        ws = await WsStomp.open(f"http://127.0.0.1:{running.server.port}/stomp")
        sent = 0

        async def flood() -> None:
            nonlocal sent
            while True:
                await ws.send_bytes(_pairs(sent, 64))
                sent += 128

        try:
            await ws.connect()
            flooding = asyncio.get_running_loop().create_task(flood())
            # Its replies pile up unread: the broker stops reading it (its sends then wait in
            # the sockets), and what it holds for it stays about the mark.
            await wait_until_async(
                lambda: any(ReadPause.OUTBOUND in s.reasons for s in sessions(running.broker)),
                what="the WebSocket producer no longer read",
            )
            view = (await asyncio.to_thread(sessions, running.broker))[0]
            assert view.outbound_bytes <= 2 * HIGH + 1024, view.outbound_bytes
            flooding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flooding
            # Reading again, every frame sent is answered, in order.
            for n in range(sent):
                receipt = await ws.frame(timeout=30)
                assert receipt.headers["receipt-id"].startswith(f"{n:08d}"), receipt
        finally:
            await ws.close()

    try:
        asyncio.run(asyncio.wait_for(go(), 120))
        assert running.broker.stats()["write_paused"] >= 1
    finally:
        running.stop()
