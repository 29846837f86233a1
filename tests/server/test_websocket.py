"""STOMP over WebSocket at the management server's `/stomp`, with aiohttp's client: subprotocol
negotiation, frames per message both ways, text and binary, heart-beats, logins and rules, the
message size bound, the origin check, and the connection limits and listing shared with TCP."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from management.conftest import Managed, start_managed
from rawstomp import RawStomp
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password, save_users
from wsstomp import WsStomp

T = TypeVar("T")

FAST = ScryptParams(ln=10, r=8, p=1)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def url(managed: Managed) -> str:
    return f"http://127.0.0.1:{managed.server.port}/stomp"


@pytest.fixture
def managed() -> Iterator[Managed]:
    running = start_managed()
    try:
        yield running
    finally:
        running.stop()


def session_with(managed: Managed, body: Callable[[WsStomp], Awaitable[T]], **kw: Any) -> T:
    """Open a WebSocket, run `body` with it, close it."""

    async def go() -> T:
        ws = await WsStomp.open(url(managed), **kw)
        try:
            return await body(ws)
        finally:
            await ws.close()

    return run(go())


# -- subprotocols -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "echoed"),
    [
        (("v10.stomp", "v11.stomp", "v12.stomp"), "v12.stomp"),
        (("v12.stomp", "v11.stomp", "v10.stomp"), "v12.stomp"),
        (("v10.stomp", "v11.stomp"), "v11.stomp"),
        (("mqtt", "v10.stomp"), "v10.stomp"),
        ((), None),
    ],
)
def test_the_highest_stomp_subprotocol_offered_is_echoed(
    managed: Managed, offered: tuple[str, ...], echoed: str | None
) -> None:
    async def body(ws: WsStomp) -> tuple[str | None, str]:
        connected = await ws.connect()
        return ws.protocol, connected.command.value

    assert session_with(managed, body, protocols=offered) == (echoed, "CONNECTED")


def test_a_client_offering_only_other_subprotocols_is_refused(managed: Managed) -> None:
    async def go() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                url(managed),
                headers={
                    "Connection": "Upgrade",
                    "Upgrade": "websocket",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Protocol": "mqtt, wamp",
                },
            ) as reply,
        ):
            return reply.status, await reply.text()

    status, text = run(go())
    assert status == 400
    assert "v12.stomp, v11.stomp, v10.stomp" in text


def test_a_plain_get_is_told_to_upgrade(managed: Managed) -> None:
    reply = managed.http.get("/stomp")
    assert reply.status == 400
    assert "WebSocket upgrade" in reply.json["error"]["message"]


# -- frames and messages ----------------------------------------------------------------------


def test_several_frames_in_one_message_and_one_frame_over_several(managed: Managed) -> None:
    body = "é" * 300  # multi-byte characters, cut in the middle of one below

    async def go(ws: WsStomp) -> list[Any]:
        await ws.connect()
        await ws.send_text(
            "SUBSCRIBE\nid:s\ndestination:/queue/ws.frames\nreceipt:r-sub\n\n\0"
            "SEND\ndestination:/queue/ws.frames\nreceipt:r1\n\nfirst\0\n\n"
            "SEND\ndestination:/queue/ws.frames\nreceipt:r2\n\nsecond\0"
        )
        frame = f"SEND\ndestination:/queue/ws.frames\nreceipt:r3\n\n{body}\0".encode()
        # Split in the command, in a header, and in the middle of a two-byte character.
        cuts = [0, 3, 20, 51, len(frame)]
        for start, end in itertools.pairwise(cuts):
            await ws.send_bytes(frame[start:end])
        return [await ws.frame() for _ in range(7)]

    frames = session_with(managed, go)
    receipts = [f.headers["receipt-id"] for f in frames if f.command.value == "RECEIPT"]
    bodies = [f.body for f in frames if f.command.value == "MESSAGE"]
    assert receipts == ["r-sub", "r1", "r2", "r3"]
    assert bodies == [b"first", b"second", body.encode()]


def test_a_frame_sent_one_byte_per_message(managed: Managed) -> None:
    async def go(ws: WsStomp) -> tuple[str, bytes]:
        await ws.connect()
        await ws.send_text("SUBSCRIBE\nid:s\ndestination:/queue/ws.bytes\n\n\0")
        frame = b"SEND\ndestination:/queue/ws.bytes\nreceipt:r\n\nbyte by byte\0\n"
        for n in range(len(frame)):
            await ws.send_bytes(frame[n : n + 1])
        # The MESSAGE may come before the RECEIPT.
        frames = {f.command.value: f for f in [await ws.frame(), await ws.frame()]}
        return frames["RECEIPT"].headers["receipt-id"], frames["MESSAGE"].body

    assert session_with(managed, go) == ("r", b"byte by byte")


def test_the_broker_answers_in_the_type_the_client_writes(managed: Managed) -> None:
    async def go(ws: WsStomp) -> list[tuple[str, str]]:
        seen = []
        await ws.connect()  # text
        await ws.send_bytes(b"SUBSCRIBE\nid:s\ndestination:/queue/ws.kind\nreceipt:bin\n\n\0")
        await ws.frame()
        seen.append(("binary client", ws.kinds[-1]))
        await ws.send_text("SEND\ndestination:/queue/ws.kind\n\ntext body\0")
        await ws.frame()
        seen.append(("text client, UTF-8 body", ws.kinds[-1]))
        await ws.send_bytes(b"SEND\ndestination:/queue/ws.kind\ncontent-length:3\n\n\xff\x00\xfe\0")
        message = await ws.frame()
        assert message.body == b"\xff\x00\xfe"
        # The client wrote binary last; a text client gets binary for a body not UTF-8 too.
        seen.append(("binary client, binary body", ws.kinds[-1]))
        await ws.send_text("SEND\ndestination:/queue/ws.kind\nreceipt:t\n\nok\0")
        await ws.frame()
        await ws.frame()
        seen.append(("text client again", ws.kinds[-1]))
        return seen

    assert session_with(managed, go) == [
        ("binary client", "binary"),
        ("text client, UTF-8 body", "text"),
        ("binary client, binary body", "binary"),
        ("text client again", "text"),
    ]


def test_a_body_not_utf8_goes_to_a_text_client_as_binary(managed: Managed) -> None:
    async def go(ws: WsStomp) -> tuple[bytes, str]:
        await ws.connect()
        await ws.send_text("SUBSCRIBE\nid:s\ndestination:/queue/ws.raw\nreceipt:r\n\n\0")
        await ws.frame()
        # A TCP producer sends what a WebSocket text message could not carry.
        raw = RawStomp(managed.broker.port)
        try:
            raw.connect()
            raw.send(b"SEND\ndestination:/queue/ws.raw\ncontent-length:2\n\n\xc3\x28\0")
            message = await ws.frame()
        finally:
            raw.close()
        return message.body, ws.kinds[-1]

    assert session_with(managed, go) == (b"\xc3\x28", "binary")


# -- heart-beats ------------------------------------------------------------------------------


def test_heart_beats_both_ways_and_a_silent_client_is_closed() -> None:
    running = start_managed(heartbeat={"send_ms": 100, "receive_ms": 100, "grace_factor": 2.0})
    try:

        async def go(ws: WsStomp) -> tuple[str, int, int | None, str]:
            connected = await ws.connect(heart_beat="100,100")
            # Beat for a while: the broker keeps the connection and beats too.
            loop = asyncio.get_running_loop()
            until = loop.time() + 0.6
            while loop.time() < until:
                await ws.send_text("\n")
                await ws.heartbeat(timeout=2)
            await ws.send_text("SEND\ndestination:/queue/ws.hb\nreceipt:alive\n\nx\0")
            receipt = await ws.frame()
            assert receipt.headers["receipt-id"] == "alive"
            # Then fall silent: closed within the grace.
            closed = await ws.closed(timeout=5)
            return connected.headers["heart-beat"], ws.heartbeats, closed.code, closed.reason

        beat, beats, code, reason = session_with(running, go)
        assert beat == "100,100"
        assert beats >= 3
        assert (code, reason) == (1008, "heartbeat_timeout")
        assert running.broker.stats()["heartbeat_timeouts"] == 1
    finally:
        running.stop()


# -- logins, rules, limits --------------------------------------------------------------------


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Managed]:
    users = tmp_path / "users.toml"
    save_users(
        users,
        UsersFile(
            [
                User("alice", ("ops",), hash_password("alice-Pw-1", FAST)),
                User("bob", ("shop",), hash_password("bob-Pw-2", FAST)),
            ]
        ),
    )
    running = start_managed(
        auth={"users_file": str(users)},
        acl=[
            {"destination": "/queue/orders.>", "read": ["ops"], "write": ["shop"]},
            {"destination": "/queue/open.>", "read": ["*"], "write": ["*"], "admin": ["*"]},
        ],
        limits={"login_failure_delay_s": 0},
    )
    try:
        yield running
    finally:
        running.stop()


def test_a_wrong_password_is_refused_as_over_tcp(secured: Managed) -> None:
    async def go(ws: WsStomp) -> tuple[str, str, int | None]:
        error = await ws.connect(login="alice", passcode="wrong")
        closed = await ws.closed()
        return error.command.value, error.headers["message"], closed.code

    command, message, code = session_with(secured, go)
    assert command == "ERROR"
    assert "login" in message.lower() or "password" in message.lower(), message
    assert code == 1008
    assert secured.broker.stats()["closed_auth_failed"] == 1


def test_the_rules_refuse_a_send_as_over_tcp(secured: Managed) -> None:
    async def go(ws: WsStomp) -> tuple[str, str, str, int | None]:
        connected = await ws.connect(login="alice", passcode="alice-Pw-1")
        await ws.send_text("SEND\ndestination:/queue/open.a\nreceipt:ok\n\nfine\0")
        receipt = await ws.frame()
        await ws.send_text("SEND\ndestination:/queue/orders.new\nreceipt:no\n\nrefused\0")
        error = await ws.frame()
        closed = await ws.closed()
        assert connected.command.value == "CONNECTED"
        return (
            receipt.headers["receipt-id"],
            error.command.value,
            error.headers["message"],
            (closed.code),
        )

    receipt, command, message, code = session_with(secured, go)
    assert receipt == "ok"
    assert command == "ERROR"
    assert "write" in message
    assert "/queue/orders.new" in message
    assert code == 1008
    assert secured.broker.stats()["access_denied_write"] == 1


def test_an_over_size_message_gets_an_error_naming_the_limit_and_1009() -> None:
    running = start_managed(http={"ws_max_message_bytes": 4096})
    try:

        async def go(ws: WsStomp) -> tuple[str, str, int | None, str]:
            await ws.connect()
            head = "SEND\ndestination:/queue/ws.fits\nreceipt:fits\n\n"
            # A message of exactly the limit is taken; one byte more is not.
            await ws.send_text(head + "x" * (4096 - len(head) - 1) + "\0")
            assert (await ws.frame()).headers["receipt-id"] == "fits"
            big = "SEND\ndestination:/queue/ws.big\n\n" + "x" * 4064 + "\0"
            assert len(big) == 4097
            await ws.send_text(big)
            error = await ws.frame()
            closed = await ws.closed()
            return error.command.value, error.headers["message"], closed.code, closed.reason

        command, message, code, reason = session_with(running, go)
        assert command == "ERROR"
        assert message.startswith("limit ws_max_message_bytes=4096 exceeded"), message
        assert (code, reason) == (1009, "limit")
        stats = running.broker.stats()
        assert stats["limit_ws_max_message_bytes"] == 1
        # Nothing of the refused message was taken.
        listing = running.http.get("/api/destinations").json["items"]
        assert "/queue/ws.big" not in [item["name"] for item in listing]
    finally:
        running.stop()


def test_max_connections_counts_tcp_and_websocket_alike() -> None:
    running = start_managed(limits={"max_connections": 1})
    tcp = RawStomp(running.broker.port)
    try:
        tcp.connect()

        async def go(ws: WsStomp) -> tuple[str, str]:
            error = await ws.frame()
            await ws.closed()
            return error.command.value, error.headers["message"]

        assert session_with(running, go) == ("ERROR", "limit max_connections=1 reached")
        assert running.broker.stats()["limit_max_connections"] == 1
    finally:
        tcp.close()
        running.stop()


def test_a_page_of_another_origin_is_refused_unless_allowed() -> None:
    running = start_managed(http={"ws_allowed_origins": ["http://app.example:8080"]})
    try:
        own = f"http://127.0.0.1:{running.server.port}"
        for origin in (own, "http://app.example:8080"):
            assert session_with(
                running, lambda ws: ws.connect(), headers={"Origin": origin}
            ).command.value == ("CONNECTED")
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            session_with(running, lambda ws: ws.connect(), headers={"Origin": "http://evil.test"})
        assert info.value.status == 403
        assert running.broker.stats()["websocket_origins_refused"] == 1
        assert "sluice_websocket_origins_refused_total 1.0" in running.http.get("/metrics").text
    finally:
        running.stop()


def test_websocket_connections_are_listed_and_counted_with_tcp(managed: Managed) -> None:
    tcp = RawStomp(managed.broker.port)
    try:
        tcp.connect()

        async def go(ws: WsStomp) -> tuple[list[str], str]:
            await ws.connect()
            listing = await asyncio.to_thread(managed.http.get, "/api/connections")
            metrics = await asyncio.to_thread(managed.http.get, "/metrics")
            return sorted(item["protocol"] for item in listing.json["items"]), metrics.text

        protocols, metrics = session_with(managed, go)
        assert protocols == ["stomp-tcp", "stomp-ws"]
        assert "sluice_connections 2.0" in metrics
        assert 'sluice_connections_by_protocol{protocol="stomp-ws"} 1.0' in metrics
        assert 'sluice_connections_by_protocol{protocol="stomp-tcp"} 1.0' in metrics
        assert "sluice_connections_opened_total 2.0" in metrics
    finally:
        tcp.close()
