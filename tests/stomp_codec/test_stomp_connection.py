"""Unit tests of the STOMP connection state machine: transitions, validation, negotiation, clock."""

from __future__ import annotations

import pytest

from sluice.errors import FrameLimitExceeded, LocalProtocolError, RemoteProtocolError
from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.connection import (
    TRANSITIONS,
    ConnState,
    Direction,
    InvalidFrameError,
    Negotiated,
    Role,
    StompConnection,
    UnsupportedVersionError,
)
from sluice.stomp.encoding import encode_frame
from sluice.stomp.frames import Command, Frame, HeartBeat, Version
from sluice.stomp.negotiation import negotiate_heartbeat, parse_heartbeat

from .stomp_helpers import TRAILER, Event, bytewise

V10, V11, V12 = Version.V1_0, Version.V1_1, Version.V1_2
CONNECT_12 = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:h\nheart-beat:0,0\n\n\0"


def receive(
    conn: StompConnection, data: bytes, mode: str = "whole", now: float = 0.0
) -> list[Event]:
    """Feed data as `mode` says and collect every event."""
    if mode == "bytewise":
        chunks = bytewise(data)
    elif mode == "trailing":
        chunks = [data + TRAILER]
    else:
        chunks = [data]
    events: list[Event] = []
    for chunk in chunks:
        conn.receive_data(chunk, now)
        while (event := conn.next_event()) is not None:
            events.append(event)
    return events


def parse_one(data: bytes, version: Version = V12) -> Frame:
    parser = FrameParser(StompLimits(), version)
    parser.feed(data)
    event = parser.next_event()
    assert isinstance(event, Frame)
    assert parser.next_event() is None
    return event


def server(
    version_header: str | None = "1.0,1.1,1.2",
    heartbeat: str | None = None,
    server_heartbeat: tuple[int, int] = (0, 0),
    now: float = 0.0,
) -> StompConnection:
    """A server connection that has accepted a CONNECT with the given headers."""
    conn = StompConnection(Role.SERVER)
    headers = {"host": "h"}
    if version_header is not None:
        headers["accept-version"] = version_header
    if heartbeat is not None:
        headers["heart-beat"] = heartbeat
    [connect] = receive(conn, encode_frame(Command.CONNECT, headers), now=now)
    assert isinstance(connect, Frame)
    conn.accept(connect, server_heartbeat=server_heartbeat, server_name="sluice/0", session="s1")
    return conn


def client(
    version: str = "1.2",
    heartbeat: str = "0,0",
    offer: tuple[int, int] = (0, 0),
    versions: tuple[Version, ...] = (V10, V11, V12),
    now: float = 0.0,
) -> StompConnection:
    """A client connection that has received CONNECTED."""
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h", heartbeat=offer, versions=versions)
    headers = {"version": version, "heart-beat": heartbeat}
    [connected] = receive(conn, encode_frame(Command.CONNECTED, headers), now=now)
    assert isinstance(connected, Frame)
    return conn


# The table.


def test_transition_table_shape() -> None:
    server_key = (Role.SERVER, ConnState.AWAITING_CONNECT, Direction.RECEIVE, Command.STOMP)
    assert TRANSITIONS[server_key] is ConnState.CONNECTING
    client_key = (Role.CLIENT, ConnState.CONNECTED, Direction.SEND, Command.DISCONNECT)
    assert TRANSITIONS[client_key] is ConnState.DISCONNECTING
    states = {key[1] for key in TRANSITIONS}
    assert ConnState.CLOSED not in states
    assert ConnState.ERROR not in states
    server_commands = {Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR}
    for role, _state, direction, command in TRANSITIONS:
        sent_by_client = (role is Role.CLIENT) == (direction is Direction.SEND)
        assert (command in server_commands) != sent_by_client


# Server side.


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
@pytest.mark.parametrize("command", [Command.CONNECT, Command.STOMP])
def test_server_accepts_connect(mode: str, command: Command) -> None:
    conn = StompConnection(Role.SERVER)
    assert conn.state is ConnState.AWAITING_CONNECT
    assert conn.version is V10
    assert conn.negotiated is None
    data = encode_frame(command, {"accept-version": "1.1,1.2", "host": "h", "heart-beat": "500,0"})
    [connect] = receive(conn, data, mode)
    assert isinstance(connect, Frame)
    assert connect.command is command
    assert conn.state is ConnState.CONNECTING
    out = conn.accept(connect, server_heartbeat=(1000, 2000), server_name="sluice/1", session="42")
    assert conn.state is ConnState.CONNECTED
    assert conn.version is V12
    assert conn.negotiated == Negotiated(V12, send_heartbeat_ms=0, receive_heartbeat_ms=2000)
    connected = parse_one(out)
    assert connected.command is Command.CONNECTED
    assert connected.headers == {
        "version": "1.2",
        "heart-beat": "0,2000",
        "session": "42",
        "server": "sluice/1",
    }


def test_connected_for_v10_says_version_10_and_has_no_heartbeat() -> None:
    # Clients and conformance suites look for `version` whatever was negotiated (ActiveMQ and
    # RabbitMQ send `version:1.0`).
    conn = StompConnection(Role.SERVER)
    [connect] = receive(conn, b"CONNECT\nlogin:a\nheart-beat:100,100\n\n\0")
    assert isinstance(connect, Frame)
    out = conn.accept(connect, server_heartbeat=(100, 100), server_name="s", session="1")
    assert parse_one(out).headers == {"version": "1.0", "session": "1", "server": "s"}
    assert conn.negotiated == Negotiated(V10, 0, 0)


def test_connect_values_are_never_unescaped_by_the_server() -> None:
    conn = StompConnection(Role.SERVER)
    [connect] = receive(conn, b"CONNECT\naccept-version:1.2\nlogin:u\npasscode:a\\cb\\\\\n\n\0")
    assert isinstance(connect, Frame)
    assert connect.headers["passcode"] == "a\\cb\\\\"


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_frame_before_connect_is_an_error(mode: str) -> None:
    conn = StompConnection(Role.SERVER)
    with pytest.raises(InvalidFrameError, match="SEND frame before CONNECT") as info:
        receive(conn, b"SEND\ndestination:/q\nreceipt:r9\n\n\0", mode)
    assert info.value.receipt_id == "r9"
    assert conn.state is ConnState.ERROR
    with pytest.raises(RemoteProtocolError, match="before CONNECT"):
        conn.next_event()
    conn.receive_data(CONNECT_12, 1.0)  # ignored once failed
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


def test_heartbeats_before_connect_are_fine() -> None:
    conn = StompConnection(Role.SERVER)
    assert receive(conn, b"\n\r\n" + CONNECT_12)[0] == HeartBeat()
    assert conn.state is ConnState.CONNECTING


def test_second_connect_is_an_error() -> None:
    conn = server()
    with pytest.raises(InvalidFrameError, match="already connected"):
        receive(conn, CONNECT_12)
    assert conn.state is ConnState.ERROR


@pytest.mark.parametrize(
    "command", [Command.MESSAGE, Command.RECEIPT, Command.ERROR, Command.CONNECTED]
)
def test_server_rejects_server_commands(command: Command) -> None:
    conn = server()
    with pytest.raises(InvalidFrameError, match=f"a client may not send {command}"):
        receive(conn, f"{command}\n\n".encode() + b"\0")


def test_frames_pipelined_after_connect_wait_for_accept() -> None:
    conn = StompConnection(Role.SERVER)
    send = encode_frame(Command.SEND, {"destination": "/q"}, b"x")
    conn.receive_data(CONNECT_12 + send, 0.0)
    connect = conn.next_event()
    assert isinstance(connect, Frame)
    assert conn.next_event() is None
    assert conn.buffered_bytes == len(send)
    conn.accept(connect, server_heartbeat=(0, 0), server_name="s", session="1")
    event = conn.next_event()
    assert isinstance(event, Frame)
    assert event.command is Command.SEND


def test_accept_misuse_is_a_local_error() -> None:
    conn = StompConnection(Role.SERVER)
    connect = Frame(Command.CONNECT, {})
    with pytest.raises(LocalProtocolError, match="no CONNECT to accept"):
        conn.accept(connect, server_heartbeat=(0, 0), server_name="s", session="1")
    receive(conn, CONNECT_12)
    with pytest.raises(LocalProtocolError, match="takes the CONNECT frame"):
        conn.accept(Frame(Command.SEND, {}), server_heartbeat=(0, 0), server_name="s", session="1")
    with pytest.raises(LocalProtocolError, match="only a server"):
        StompConnection(Role.CLIENT).accept(
            connect, server_heartbeat=(0, 0), server_name="s", session="1"
        )


def test_server_disconnect_flow() -> None:
    conn = server()
    [disconnect] = receive(conn, b"DISCONNECT\nreceipt:77\n\n\0")
    assert isinstance(disconnect, Frame)
    assert conn.state is ConnState.DISCONNECTING
    with pytest.raises(LocalProtocolError, match="cannot send MESSAGE in state disconnecting"):
        conn.send(
            Frame(Command.MESSAGE, {"destination": "/q", "message-id": "1", "subscription": "s"})
        )
    out = conn.send(Frame(Command.RECEIPT, {"receipt-id": "77"}))
    assert parse_one(out) == Frame(Command.RECEIPT, {"receipt-id": "77"})
    assert receive(conn, b"") == []
    assert conn.state is ConnState.CLOSED
    assert conn.next_event() is None


def test_frame_after_disconnect_is_an_error() -> None:
    conn = server()
    with pytest.raises(InvalidFrameError, match="after DISCONNECT"):
        receive(conn, b"DISCONNECT\n\n\0SEND\ndestination:/q\n\n\0")


def test_eof_mid_frame_is_an_error() -> None:
    conn = server()
    conn.receive_data(b"SEND\ndestination:/q\n", 1.0)
    assert conn.next_event() is None
    conn.receive_data(b"", 2.0)
    with pytest.raises(RemoteProtocolError, match="closed in the middle of a frame"):
        conn.next_event()
    assert conn.state is ConnState.ERROR


def test_eof_without_disconnect_closes() -> None:
    conn = server()
    conn.receive_data(b"", 1.0)
    assert conn.next_event() is None
    assert conn.state is ConnState.CLOSED
    with pytest.raises(LocalProtocolError, match="closed"):
        conn.send(Frame(Command.RECEIPT, {"receipt-id": "1"}))


def test_data_after_eof_is_a_local_error() -> None:
    conn = StompConnection(Role.SERVER)
    conn.receive_data(b"", 0.0)
    with pytest.raises(LocalProtocolError, match="after EOF"):
        conn.receive_data(b"x", 0.0)


def test_close() -> None:
    conn = server()
    conn.close()
    assert conn.state is ConnState.CLOSED
    failed = StompConnection(Role.SERVER)
    with pytest.raises(RemoteProtocolError):
        receive(failed, b"NOPE\n\n\0")
    failed.close()
    assert failed.state is ConnState.ERROR


def test_parser_errors_move_to_error() -> None:
    conn = server()
    with pytest.raises(RemoteProtocolError, match="escape"):
        receive(conn, b"SEND\ndestination:\\x\n\n\0")
    assert conn.state is ConnState.ERROR


def test_limits_apply() -> None:
    conn = StompConnection(Role.SERVER, StompLimits(max_frame_bytes=64))
    with pytest.raises(FrameLimitExceeded, match="max_frame_bytes"):
        receive(conn, b"CONNECT\nx:" + b"y" * 80 + b"\n\n\0")


def test_server_send_rules() -> None:
    message = Frame(
        Command.MESSAGE, {"destination": "/q", "message-id": "1", "subscription": "s"}, b"b"
    )
    conn = StompConnection(Role.SERVER)
    with pytest.raises(LocalProtocolError, match="cannot send MESSAGE in state awaiting_connect"):
        conn.send(message)
    conn = server()
    with pytest.raises(LocalProtocolError, match="a server may not send SEND"):
        conn.send(Frame(Command.SEND, {"destination": "/q"}))
    with pytest.raises(LocalProtocolError, match="accept"):
        conn.send(Frame(Command.CONNECTED, {}))
    with pytest.raises(LocalProtocolError, match="'subscription'"):
        conn.send(Frame(Command.MESSAGE, {"destination": "/q", "message-id": "1"}))
    assert parse_one(conn.send(message)).body == b"b"
    assert conn.state is ConnState.CONNECTED


def test_send_uses_the_negotiated_escaping() -> None:
    headers = {"destination": "/q", "message-id": "a:b", "subscription": "s"}
    assert b"message-id:a\\cb\n" in server().send(Frame(Command.MESSAGE, headers))
    assert b"message-id:a:b\n" in server(version_header=None).send(Frame(Command.MESSAGE, headers))


def test_sending_error_moves_to_error() -> None:
    conn = server()
    out = conn.send(Frame(Command.ERROR, {"message": "bye"}, b"details"))
    assert parse_one(out).headers["message"] == "bye"
    assert conn.state is ConnState.ERROR
    with pytest.raises(LocalProtocolError):
        conn.send(Frame(Command.RECEIPT, {"receipt-id": "1"}))
    with pytest.raises(LocalProtocolError, match="after sending ERROR"):
        conn.next_event()


def test_error_frame_before_connect() -> None:
    conn = StompConnection(Role.SERVER)
    out = conn.error_frame("bad\nthing\\here", receipt_id="r1", body=b"more")
    assert conn.state is ConnState.ERROR
    frame = parse_one(out, V12)
    assert frame.command is Command.ERROR
    assert frame.headers["message"] == "bad thing/here"
    assert frame.headers["receipt-id"] == "r1"
    assert frame.headers["content-type"] == "text/plain"
    assert frame.body == b"more"


def test_error_frame_after_negotiation_escapes() -> None:
    conn = server()
    frame = parse_one(conn.error_frame("a:b\\c", headers={"x:y": "1"}))
    assert frame.headers["message"] == "a:b\\c"
    assert frame.headers["x:y"] == "1"
    assert "content-type" not in frame.headers


def test_error_frame_never_raises() -> None:
    conn = StompConnection(Role.SERVER)
    conn.close()
    out = conn.error_frame("\udcff\0\r\n", receipt_id="a:\nb", body=b"\0", headers={"k:\n": "v\r"})
    assert conn.state is ConnState.CLOSED
    frame = parse_one(out, V12)
    assert frame.body == b"\0"
    assert frame.headers["receipt-id"] == "a: b"


def test_version_mismatch_error_frame() -> None:
    conn = StompConnection(Role.SERVER)
    [connect] = receive(conn, b"CONNECT\naccept-version:2.0\n\n\0")
    assert isinstance(connect, Frame)
    with pytest.raises(UnsupportedVersionError, match=r"supported versions are 1\.1,1\.2") as info:
        conn.accept(
            connect, server_heartbeat=(0, 0), server_name="s", session="1", supported=(V11, V12)
        )
    assert info.value.supported == (V11, V12)
    assert conn.state is ConnState.ERROR
    out = conn.error_frame(str(info.value), headers={"version": "1.1,1.2"})
    assert parse_one(out).headers["version"] == "1.1,1.2"


@pytest.mark.parametrize(
    ("accept_version", "supported", "expected"),
    [
        (None, (V10, V11, V12), V10),
        ("1.0", (V10, V11, V12), V10),
        ("1.0,1.1,1.2", (V10, V11, V12), V12),
        ("1.2,1.0", (V10, V11, V12), V12),
        ("1.1", (V10, V11, V12), V11),
        ("1.1,2.0", (V10, V11, V12), V11),
        ("1.0, 1.1", (V10, V11, V12), V11),
        ("1.0,1.1,1.2", (V10, V11), V11),
        ("1.1,1.2", (V12,), V12),
        ("2.0", (V10, V11, V12), None),
        ("1.0,1.1", (V12,), None),
        (None, (V11, V12), None),
        ("", (V10, V11, V12), None),
    ],
)
def test_version_negotiation(
    accept_version: str | None, supported: tuple[Version, ...], expected: Version | None
) -> None:
    conn = StompConnection(Role.SERVER)
    headers = {} if accept_version is None else {"accept-version": accept_version}
    [connect] = receive(conn, encode_frame(Command.CONNECT, headers))
    assert isinstance(connect, Frame)
    if expected is None:
        with pytest.raises(UnsupportedVersionError, match="supported versions are"):
            conn.accept(
                connect, server_heartbeat=(0, 0), server_name="s", session="1", supported=supported
            )
        return
    conn.accept(connect, server_heartbeat=(0, 0), server_name="s", session="1", supported=supported)
    assert conn.version is expected


@pytest.mark.parametrize(
    ("client_hb", "server_hb", "expected"),
    [
        ((0, 0), (10, 10), (0, 0)),
        ((10, 10), (0, 0), (0, 0)),
        ((10, 20), (30, 40), (40, 30)),
        ((50, 0), (30, 40), (50, 0)),
        ((0, 50), (30, 40), (0, 50)),
        ((100, 100), (10, 10), (100, 100)),
    ],
)
def test_heartbeat_negotiation(
    client_hb: tuple[int, int], server_hb: tuple[int, int], expected: tuple[int, int]
) -> None:
    assert negotiate_heartbeat(client_hb, server_hb) == expected
    upstream, downstream = expected
    srv = server(heartbeat=f"{client_hb[0]},{client_hb[1]}", server_heartbeat=server_hb)
    assert srv.negotiated == Negotiated(V12, downstream, upstream)
    cli = StompConnection(Role.CLIENT)
    cli.connect(host="h", heartbeat=client_hb)
    # The client reaches the same result from the server's own values or from the agreed ones.
    for answer in (server_hb, (downstream, upstream)):
        cli = StompConnection(Role.CLIENT)
        cli.connect(host="h", heartbeat=client_hb)
        receive(
            cli,
            encode_frame(
                Command.CONNECTED, {"version": "1.2", "heart-beat": f"{answer[0]},{answer[1]}"}
            ),
        )
        assert cli.negotiated == Negotiated(V12, upstream, downstream)


def test_missing_heartbeat_header_is_zero() -> None:
    assert parse_heartbeat(None) == (0, 0)
    assert server(heartbeat=None, server_heartbeat=(10, 10)).negotiated == Negotiated(V12, 0, 0)
    assert client(heartbeat="0,0", offer=(10, 10)).negotiated == Negotiated(V12, 0, 0)


@pytest.mark.parametrize("value", ["", "1", "a,b", "1,2,3", "-1,0", "1,", ",1", "1;2", "1.5,2"])
def test_malformed_heartbeat(value: str) -> None:
    with pytest.raises(RemoteProtocolError, match="malformed heart-beat"):
        parse_heartbeat(value)
    conn = StompConnection(Role.SERVER)
    [connect] = receive(
        conn, encode_frame(Command.CONNECT, {"accept-version": "1.2", "heart-beat": value})
    )
    assert isinstance(connect, Frame)
    with pytest.raises(RemoteProtocolError, match="malformed heart-beat"):
        conn.accept(connect, server_heartbeat=(0, 0), server_name="s", session="1")
    assert conn.state is ConnState.ERROR
    cli = StompConnection(Role.CLIENT)
    cli.connect(host="h")
    with pytest.raises(RemoteProtocolError, match="malformed heart-beat"):
        receive(cli, encode_frame(Command.CONNECTED, {"version": "1.2", "heart-beat": value}))
    assert cli.state is ConnState.ERROR


def test_heartbeat_with_spaces_is_tolerated() -> None:
    assert parse_heartbeat("10, 20") == (10, 20)


# Required headers of client frames.

REQUIRED_CASES = [
    # (version, command, headers, missing header named in the error or None)
    (V12, Command.SEND, {}, "destination"),
    (V12, Command.SEND, {"destination": "/q"}, None),
    (V10, Command.SEND, {}, "destination"),
    (V12, Command.SUBSCRIBE, {"destination": "/q"}, "id"),
    (V11, Command.SUBSCRIBE, {"destination": "/q"}, "id"),
    (V10, Command.SUBSCRIBE, {"destination": "/q"}, None),
    (V12, Command.SUBSCRIBE, {"id": "1"}, "destination"),
    (V12, Command.SUBSCRIBE, {"id": "1", "destination": "/q"}, None),
    (V12, Command.UNSUBSCRIBE, {"destination": "/q"}, "id"),
    (V12, Command.UNSUBSCRIBE, {"id": "1"}, None),
    (V11, Command.UNSUBSCRIBE, {"destination": "/q"}, "id"),
    (V10, Command.UNSUBSCRIBE, {"destination": "/q"}, None),
    (V10, Command.UNSUBSCRIBE, {"id": "1"}, None),
    (V10, Command.UNSUBSCRIBE, {}, "destination"),
    (V12, Command.ACK, {"message-id": "1"}, "id"),
    (V12, Command.ACK, {"id": "1"}, None),
    (V12, Command.NACK, {"id": "1"}, None),
    (V12, Command.NACK, {}, "id"),
    (V11, Command.ACK, {"message-id": "1", "subscription": "s"}, None),
    (V11, Command.ACK, {"message-id": "1"}, "subscription"),
    (V11, Command.NACK, {"id": "1", "subscription": "s"}, "message-id"),
    (V10, Command.ACK, {"message-id": "1"}, None),
    (V10, Command.ACK, {"id": "1"}, "message-id"),
    (V10, Command.NACK, {"message-id": "1"}, "NACK is not part of STOMP 1.0"),
    (V12, Command.BEGIN, {}, "transaction"),
    (V12, Command.COMMIT, {}, "transaction"),
    (V10, Command.ABORT, {}, "transaction"),
    (V12, Command.ABORT, {"transaction": "t"}, None),
    (V12, Command.DISCONNECT, {}, None),
]


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
@pytest.mark.parametrize(("version", "command", "headers", "missing"), REQUIRED_CASES)
def test_required_headers_from_client(
    mode: str, version: Version, command: Command, headers: dict[str, str], missing: str | None
) -> None:
    conn = server(version_header=version.value)
    assert conn.version is version
    data = encode_frame(command, headers, version=version)
    if missing is None:
        [event] = receive(conn, data, mode)
        assert isinstance(event, Frame)
        assert event.command is command
        return
    with pytest.raises(InvalidFrameError, match=missing) as info:
        receive(conn, data, mode)
    assert str(command) in str(info.value)
    assert conn.state is ConnState.ERROR


@pytest.mark.parametrize(("version", "command", "headers", "missing"), REQUIRED_CASES)
def test_required_headers_on_our_own_sends(
    version: Version, command: Command, headers: dict[str, str], missing: str | None
) -> None:
    conn = client(version=version.value)
    frame = Frame(command, headers)
    if missing is None:
        assert parse_one(conn.send(frame), version).command is command
    else:
        with pytest.raises(LocalProtocolError, match=missing):
            conn.send(frame)


# Client side.


def test_client_connect_frame() -> None:
    conn = StompConnection(Role.CLIENT)
    out = conn.connect(
        host="broker",
        login="u",
        passcode="p\\c:x",
        heartbeat=(100, 200),
        extra_headers={"client-id": "c1", "host": "other"},
    )
    assert conn.state is ConnState.CONNECTING
    assert b"passcode:p\\c:x\n" in out
    frame = parse_one(out, V12)
    assert frame.command is Command.CONNECT
    assert frame.headers == {
        "accept-version": "1.0,1.1,1.2",
        "host": "broker",
        "login": "u",
        "passcode": "p\\c:x",
        "heart-beat": "100,200",
        "client-id": "c1",
    }
    # The server reads the passcode literally.
    srv = StompConnection(Role.SERVER)
    [connect] = receive(srv, out)
    assert isinstance(connect, Frame)
    assert connect.headers["passcode"] == "p\\c:x"


def test_client_connect_variants() -> None:
    conn = StompConnection(Role.CLIENT)
    frame = parse_one(conn.connect(host="h", versions=(V10,), command=Command.STOMP))
    assert frame.command is Command.STOMP
    assert frame.headers == {"accept-version": "1.0", "host": "h"}
    with pytest.raises(LocalProtocolError, match="cannot send CONNECT in state connecting"):
        conn.connect(host="h")
    with pytest.raises(LocalProtocolError, match="only a client"):
        StompConnection(Role.SERVER).connect(host="h")
    with pytest.raises(LocalProtocolError, match="CONNECT or STOMP"):
        StompConnection(Role.CLIENT).connect(host="h", command=Command.SEND)
    with pytest.raises(LocalProtocolError, match="at least one version"):
        StompConnection(Role.CLIENT).connect(host="h", versions=())
    with pytest.raises(LocalProtocolError, match="negative"):
        StompConnection(Role.CLIENT).connect(host="h", heartbeat=(-1, 0))
    with pytest.raises(LocalProtocolError, match="use connect"):
        StompConnection(Role.CLIENT).send(Frame(Command.CONNECT, {}))


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_client_receives_connected(mode: str) -> None:
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h", heartbeat=(1000, 3000))
    data = encode_frame(
        Command.CONNECTED, {"version": "1.1", "heart-beat": "2000,500", "session": "x"}
    )
    [event] = receive(conn, data, mode)
    assert isinstance(event, Frame)
    assert event.headers["session"] == "x"
    assert conn.state is ConnState.CONNECTED
    assert conn.negotiated == Negotiated(V11, send_heartbeat_ms=1000, receive_heartbeat_ms=3000)
    assert conn.version is V11


def test_connected_without_version_means_10_if_offered() -> None:
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h", heartbeat=(10, 10))
    receive(conn, b"CONNECTED\nheart-beat:10,10\n\n\0")
    assert conn.negotiated == Negotiated(V10, 0, 0)
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h", versions=(V11, V12))
    with pytest.raises(InvalidFrameError, match="lacks the version header"):
        receive(conn, b"CONNECTED\n\n\0")
    assert conn.state is ConnState.ERROR


@pytest.mark.parametrize("version", ["1.0", "1.3", "x"])
def test_connected_with_a_version_not_offered(version: str) -> None:
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h", versions=(V11, V12))
    with pytest.raises(InvalidFrameError, match="did not offer"):
        receive(conn, f"CONNECTED\nversion:{version}\n\n".encode() + b"\0")


def test_client_rejects_frames_before_connected() -> None:
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h")
    with pytest.raises(InvalidFrameError, match="MESSAGE frame in state connecting"):
        receive(conn, b"MESSAGE\ndestination:/q\nmessage-id:1\nsubscription:s\n\n\0")


@pytest.mark.parametrize("command", [Command.SEND, Command.SUBSCRIBE, Command.CONNECT, Command.ACK])
def test_client_rejects_client_commands(command: Command) -> None:
    conn = client()
    with pytest.raises(InvalidFrameError, match=f"a server may not send {command}"):
        receive(conn, f"{command}\n\n".encode() + b"\0")


def test_second_connected_is_an_error() -> None:
    conn = client()
    with pytest.raises(InvalidFrameError, match="CONNECTED frame in state connected"):
        receive(conn, b"CONNECTED\nversion:1.2\n\n\0")


@pytest.mark.parametrize(
    ("version", "data", "missing"),
    [
        (V12, b"MESSAGE\ndestination:/q\nmessage-id:1\n\n\0", "subscription"),
        (V11, b"MESSAGE\ndestination:/q\nsubscription:1\n\n\0", "message-id"),
        (V12, b"MESSAGE\nmessage-id:1\nsubscription:1\n\n\0", "destination"),
        (V10, b"MESSAGE\ndestination:/q\nmessage-id:1\n\n\0", None),
        (V12, b"RECEIPT\n\n\0", "receipt-id"),
        (V12, b"RECEIPT\nreceipt-id:9\n\n\0", None),
        (V12, b"ERROR\n\n\0", None),
    ],
)
def test_required_headers_from_server(version: Version, data: bytes, missing: str | None) -> None:
    conn = client(version=version.value)
    if missing is None:
        [event] = receive(conn, data)
        assert isinstance(event, Frame)
    else:
        with pytest.raises(InvalidFrameError, match=missing):
            receive(conn, data)


def test_client_unescapes_after_negotiation() -> None:
    data = b"MESSAGE\ndestination:/q\\c1\nmessage-id:1\nsubscription:s\n\n\0"
    [v12] = receive(client(version="1.2"), data)
    [v10] = receive(client(version="1.0"), data)
    assert isinstance(v12, Frame)
    assert isinstance(v10, Frame)
    assert v12.headers["destination"] == "/q:1"
    assert v10.headers["destination"] == "/q\\c1"


def test_client_receives_error() -> None:
    conn = client()
    [event] = receive(conn, b"ERROR\nmessage:go away\n\n\0")
    assert isinstance(event, Frame)
    assert event.headers["message"] == "go away"
    assert conn.state is ConnState.ERROR
    # The peer's last word: whatever follows is ignored.
    conn.receive_data(b"MESSAGE\n\n\0", 1.0)
    assert conn.next_event() is None
    with pytest.raises(LocalProtocolError):
        conn.send(Frame(Command.SEND, {"destination": "/q"}))


def test_client_receives_error_instead_of_connected() -> None:
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h")
    [event] = receive(conn, b"ERROR\nmessage:bad login\n\n\0")
    assert isinstance(event, Frame)
    assert conn.state is ConnState.ERROR
    assert conn.negotiated is None


def test_client_send_rules_and_disconnect() -> None:
    conn = StompConnection(Role.CLIENT)
    with pytest.raises(LocalProtocolError, match="cannot send SEND in state awaiting_connect"):
        conn.send(Frame(Command.SEND, {"destination": "/q"}))
    conn = client()
    with pytest.raises(LocalProtocolError, match="a client may not send MESSAGE"):
        conn.send(Frame(Command.MESSAGE, {}))
    out = conn.send(Frame(Command.SEND, {"destination": "/q"}, b"\0x"))
    assert parse_one(out).body == b"\0x"
    conn.send(Frame(Command.DISCONNECT, {"receipt": "bye"}))
    assert conn.state is ConnState.DISCONNECTING
    with pytest.raises(LocalProtocolError, match="disconnecting"):
        conn.send(Frame(Command.SEND, {"destination": "/q"}))
    events = receive(
        conn,
        b"MESSAGE\ndestination:/q\nmessage-id:1\nsubscription:s\n\n\0RECEIPT\nreceipt-id:bye\n\n\0",
    )
    assert [e.command for e in events if isinstance(e, Frame)] == [Command.MESSAGE, Command.RECEIPT]
    assert conn.state is ConnState.DISCONNECTING
    receive(conn, b"")
    assert conn.state is ConnState.CLOSED


def test_client_and_server_talk() -> None:
    cli = StompConnection(Role.CLIENT)
    srv = StompConnection(Role.SERVER)
    [connect] = receive(srv, cli.connect(host="h", heartbeat=(100, 100)))
    assert isinstance(connect, Frame)
    receive(cli, srv.accept(connect, server_heartbeat=(200, 50), server_name="s", session="1"))
    assert cli.negotiated == Negotiated(V12, 100, 200)
    assert srv.negotiated == Negotiated(V12, 200, 100)
    headers = {"destination": "/queue/a:b", "x-user": "line\nbreak\\"}
    [send] = receive(srv, cli.send(Frame(Command.SEND, headers, b"payload\0")))
    assert isinstance(send, Frame)
    assert send.headers == {**headers, "content-length": "8"}
    message = Frame(
        Command.MESSAGE, {**send.headers, "message-id": "m:1", "subscription": "0"}, send.body
    )
    [delivered] = receive(cli, srv.send(message))
    assert delivered == message
    [disconnect] = receive(srv, cli.send(Frame(Command.DISCONNECT, {"receipt": "r"})))
    assert isinstance(disconnect, Frame)
    [receipt] = receive(cli, srv.send(Frame(Command.RECEIPT, {"receipt-id": "r"})))
    assert receipt == Frame(Command.RECEIPT, {"receipt-id": "r"})


# Heart-beat clock.


def test_heartbeat_clock() -> None:
    # CONNECT arrives at t=100; we send every 1 s, expect the client every 2 s, grace 1.5.
    conn = StompConnection(Role.SERVER, grace_factor=1.5)
    [connect] = receive(
        conn,
        encode_frame(Command.CONNECT, {"accept-version": "1.2", "heart-beat": "2000,1000"}),
        now=100.0,
    )
    assert isinstance(connect, Frame)
    conn.accept(connect, server_heartbeat=(1000, 2000), server_name="s", session="1")
    assert conn.negotiated == Negotiated(V12, 1000, 2000)
    assert not conn.heartbeat_due(100.5)
    assert conn.next_deadline(100.5) == pytest.approx(101.0)
    conn.data_sent(100.2)
    assert not conn.heartbeat_due(101.1)
    assert conn.heartbeat_due(101.2)
    assert conn.next_deadline(100.3) == pytest.approx(101.2)
    assert conn.heartbeat() == b"\n"
    conn.data_sent(101.2)
    # The peer is allowed 2 s * 1.5 = 3 s of silence.
    assert not conn.peer_timed_out(102.9)
    assert conn.peer_timed_out(103.0)
    conn.data_sent(103.0)
    assert conn.next_deadline(103.0) == pytest.approx(103.0)
    conn.receive_data(b"\n", 103.5)
    assert conn.next_event() == HeartBeat()
    assert not conn.peer_timed_out(106.4)
    assert conn.peer_timed_out(106.5)
    assert conn.next_deadline(103.6) == pytest.approx(104.0)
    # Past every deadline, the deadline is now.
    assert conn.next_deadline(200.0) == 200.0


def test_client_heartbeat_clock() -> None:
    conn = StompConnection(Role.CLIENT)
    conn.connect(host="h", heartbeat=(1000, 1000))
    conn.data_sent(10.0)
    receive(conn, b"CONNECTED\nversion:1.2\nheart-beat:0,500\n\n\0", now=10.1)
    assert conn.negotiated == Negotiated(V12, 1000, 0)
    assert conn.next_deadline(10.2) == pytest.approx(11.0)
    assert conn.heartbeat_due(11.0)
    assert not conn.peer_timed_out(1000.0)


def test_no_heartbeats() -> None:
    conn = server()
    assert conn.next_deadline(0.0) is None
    assert not conn.heartbeat_due(1e9)
    assert not conn.peer_timed_out(1e9)


def test_no_heartbeat_clock_before_connected_or_after_close() -> None:
    conn = StompConnection(Role.SERVER)
    assert conn.next_deadline(0.0) is None
    with pytest.raises(LocalProtocolError, match="no heart-beats"):
        conn.heartbeat()
    conn = server(heartbeat="10,10", server_heartbeat=(10, 10))
    assert conn.next_deadline(0.0) is not None
    conn.close()
    assert conn.next_deadline(0.0) is None
    assert not conn.heartbeat_due(1e9)
    assert not conn.peer_timed_out(1e9)


def test_grace_factor_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="grace_factor"):
        StompConnection(Role.SERVER, grace_factor=0.5)
