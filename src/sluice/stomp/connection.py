"""The STOMP connection state machine, for either end of a connection.

`StompConnection` wraps a `FrameParser` and knows what each side may send and receive in each
state, the headers each frame needs, version and heart-beat negotiation, and the heart-beat clock.
It reads bytes given to `receive_data` and hands out `Frame` and `HeartBeat` events; it turns our
frames into bytes in `send`. It never touches a socket or a clock: the caller passes `now`
(seconds, any monotonic origin) and writes the bytes it is given.

Errors come in two kinds: `RemoteProtocolError` when the peer broke the protocol (the connection
then enters `ConnState.ERROR` and stays there) and `LocalProtocolError` when our own caller asked
for something the protocol forbids (the state is left unchanged).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from sluice.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.encoding import HEARTBEAT_BYTES, encode_frame
from sluice.stomp.frames import Command, Frame, HeartBeat, Version
from sluice.stomp.negotiation import (
    ALL_VERSIONS,
    VERSIONS_BY_NAME,
    Negotiated,
    UnsupportedVersionError,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
)
from sluice.stomp.validation import (
    FROM_CLIENT,
    FROM_SERVER,
    NOT_IN_VERSION,
    InvalidFrameError,
    missing_header_message,
)

__all__ = [
    "TRANSITIONS",
    "ConnState",
    "Direction",
    "InvalidFrameError",
    "Negotiated",
    "Role",
    "StompConnection",
    "UnsupportedVersionError",
]

_DEFAULT_LIMITS = StompLimits()


class Role(enum.Enum):
    """Which end of the connection we are."""

    CLIENT = "client"
    SERVER = "server"


class ConnState(enum.Enum):
    """Where a connection stands, seen from our end."""

    # No CONNECT yet: the client has not sent it, or the server has not received it.
    AWAITING_CONNECT = "awaiting_connect"
    # CONNECT sent (client) or received (server), not yet answered with CONNECTED.
    CONNECTING = "connecting"
    CONNECTED = "connected"
    # The client sent DISCONNECT; only the RECEIPT (and in-flight MESSAGEs) may follow.
    DISCONNECTING = "disconnecting"
    # The transport ended cleanly (EOF or `close()`).
    CLOSED = "closed"
    # A protocol error, or an ERROR frame sent or received. Terminal: the transport must close.
    ERROR = "error"


class Direction(enum.Enum):
    """Whether a transition is taken by a frame we send or one we receive."""

    SEND = "send"
    RECEIVE = "receive"


_S = ConnState
# Members read for every frame, as module names: on Python 3.11 reading an enum member through
# its class costs several times a global read.
_ERROR, _CLOSED, _CONNECTING = ConnState.ERROR, ConnState.CLOSED, ConnState.CONNECTING
_SERVER = Role.SERVER
_CONNECTED_FRAME, _ERROR_FRAME = Command.CONNECTED, Command.ERROR
_CONNECTS = (Command.CONNECT, Command.STOMP)
_CLIENT_OPERATIONS = (
    Command.SEND,
    Command.SUBSCRIBE,
    Command.UNSUBSCRIBE,
    Command.ACK,
    Command.NACK,
    Command.BEGIN,
    Command.COMMIT,
    Command.ABORT,
)
_DELIVERIES = (Command.MESSAGE, Command.RECEIPT)
_LIVE = (_S.AWAITING_CONNECT, _S.CONNECTING, _S.CONNECTED, _S.DISCONNECTING)

# Every legal frame transition: (role, states, direction, commands, next state). A frame not listed
# for the current state is a RemoteProtocolError when received and a LocalProtocolError when sent.
# Outside this table: EOF or `close()` move any state but ERROR to CLOSED; a RemoteProtocolError
# or `error_frame()` moves any state but CLOSED to ERROR; heart-beats never change the state.
_RULES: tuple[
    tuple[Role, tuple[ConnState, ...], Direction, tuple[Command, ...], ConnState], ...
] = (
    # Server.
    (Role.SERVER, (_S.AWAITING_CONNECT,), Direction.RECEIVE, _CONNECTS, _S.CONNECTING),
    (Role.SERVER, (_S.CONNECTING,), Direction.SEND, (Command.CONNECTED,), _S.CONNECTED),
    (Role.SERVER, (_S.CONNECTED,), Direction.RECEIVE, _CLIENT_OPERATIONS, _S.CONNECTED),
    (Role.SERVER, (_S.CONNECTED,), Direction.RECEIVE, (Command.DISCONNECT,), _S.DISCONNECTING),
    (Role.SERVER, (_S.CONNECTED,), Direction.SEND, _DELIVERIES, _S.CONNECTED),
    (Role.SERVER, (_S.DISCONNECTING,), Direction.SEND, (Command.RECEIPT,), _S.DISCONNECTING),
    (Role.SERVER, _LIVE, Direction.SEND, (Command.ERROR,), _S.ERROR),
    # Client.
    (Role.CLIENT, (_S.AWAITING_CONNECT,), Direction.SEND, _CONNECTS, _S.CONNECTING),
    (Role.CLIENT, (_S.CONNECTING,), Direction.RECEIVE, (Command.CONNECTED,), _S.CONNECTED),
    (Role.CLIENT, (_S.CONNECTED,), Direction.SEND, _CLIENT_OPERATIONS, _S.CONNECTED),
    (Role.CLIENT, (_S.CONNECTED,), Direction.SEND, (Command.DISCONNECT,), _S.DISCONNECTING),
    (Role.CLIENT, (_S.CONNECTED,), Direction.RECEIVE, _DELIVERIES, _S.CONNECTED),
    (Role.CLIENT, (_S.DISCONNECTING,), Direction.RECEIVE, _DELIVERIES, _S.DISCONNECTING),
    (Role.CLIENT, _LIVE, Direction.RECEIVE, (Command.ERROR,), _S.ERROR),
)

TRANSITIONS: dict[tuple[Role, ConnState, Direction, Command], ConnState] = {
    (role, state, direction, command): target
    for role, states, direction, commands, target in _RULES
    for state in states
    for command in commands
}

# The same table sliced per (role, state, direction), so the hot path does one dict lookup.
_BY_STATE: dict[tuple[Role, ConnState, Direction], dict[Command, ConnState]] = {
    (role, state, direction): {} for role in Role for state in ConnState for direction in Direction
}
for (_role, _state, _direction, _command), _target in TRANSITIONS.items():
    _BY_STATE[_role, _state, _direction][_command] = _target


def _sanitize(text: str, escaped: bool) -> str:
    """Make text safe to send in a header whatever version the reader assumes."""
    # Lone surrogates (from bytes decoded with surrogateescape) cannot be encoded as UTF-8.
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = text.replace("\r", " ").replace("\n", " ").replace("\0", " ")
    if not escaped:
        # An unescaped backslash would read as an escape to a 1.1/1.2 parser.
        text = text.replace("\\", "/")
    return text


class StompConnection:
    """One STOMP connection, client or server side, without I/O.

    Feed received bytes to `receive_data`, then call `next_event` until it returns None. Write
    what `connect`, `accept`, `send`, `error_frame` and `heartbeat` return. Tell the connection when
    you wrote anything (`data_sent`), and ask `next_deadline` when to look at the heart-beat clock
    (`heartbeat_due`, `peer_timed_out`).

    A server that has received CONNECT gets no further event until it answers with `accept` or
    `error_frame`: frames a client pipelines behind CONNECT stay buffered meanwhile, so the server
    should not read more from the transport until then.
    """

    def __init__(
        self,
        role: Role,
        limits: StompLimits = _DEFAULT_LIMITS,
        *,
        grace_factor: float = 2.0,
        limits_before_connected: StompLimits | None = None,
    ) -> None:
        """`limits_before_connected`, if given, bounds the frames read until the connection is
        CONNECTED (a server gives a much smaller frame budget to a peer not yet accepted);
        `limits` applies from then on."""
        if grace_factor < 1.0:
            raise ValueError(f"grace_factor must be at least 1.0 (got {grace_factor})")
        self.role = role
        self.grace_factor = grace_factor
        self._limits = limits
        # Until a version is agreed nothing is unescaped: CONNECT/CONNECTED never are, and an early
        # ERROR from a peer is better read literally than rejected for an escape.
        self._parser = FrameParser(limits_before_connected or limits, Version.V1_0)
        self._state = ConnState.AWAITING_CONNECT
        self._negotiated: Negotiated | None = None
        self._version = Version.V1_0
        self._error: ProtocolError | None = None
        self._peer_sent_error = False
        self._eof = False
        self._last_received: float | None = None
        self._last_sent: float | None = None
        self._clock_origin = 0.0
        self._offered_versions: tuple[Version, ...] = ()
        self._offered_heartbeat = (0, 0)
        self._set_version(Version.V1_0)
        self._set_state(ConnState.AWAITING_CONNECT)

    # State.

    @property
    def state(self) -> ConnState:
        """The current state."""
        return self._state

    @property
    def version(self) -> Version:
        """The negotiated version; 1.0 until negotiation."""
        return self._version

    @property
    def negotiated(self) -> Negotiated | None:
        """Version and heart-beats agreed at connection time, or None before CONNECTED."""
        return self._negotiated

    @property
    def buffered_bytes(self) -> int:
        """Received bytes not yet returned as events."""
        return self._parser.buffered_bytes

    def _set_state(self, state: ConnState) -> None:
        self._state = state
        if state is ConnState.CONNECTED:
            self._parser.limits = self._limits
        key = (self.role, state)
        self._may_receive = _BY_STATE[(*key, Direction.RECEIVE)]
        self._may_send = _BY_STATE[(*key, Direction.SEND)]

    def _set_version(self, version: Version) -> None:
        self._version = version
        self._parser.version = version
        incoming, outgoing = (
            (FROM_CLIENT, FROM_SERVER) if self.role is Role.SERVER else (FROM_SERVER, FROM_CLIENT)
        )
        self._required_in = incoming[version]
        self._required_out = outgoing[version]
        self._not_in_version = NOT_IN_VERSION[version]

    def _fail(self, error: RemoteProtocolError) -> RemoteProtocolError:
        if self._state is not ConnState.ERROR:
            self._set_state(ConnState.ERROR)
            self._error = error
        return error

    def release(self) -> None:
        """Drop every received byte still held (the transport is gone)."""
        self._parser.release()

    def close(self) -> None:
        """Record that the transport is closed. ERROR stays ERROR; anything else becomes CLOSED."""
        if self._state is not ConnState.ERROR:
            self._set_state(ConnState.CLOSED)

    # Receiving.

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Hand over bytes read from the transport at time `now`; empty data means EOF."""
        if self._state is ConnState.ERROR or self._state is ConnState.CLOSED:
            return
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("data received after EOF")
        self._last_received = now
        self._parser.feed(data)

    def next_event(self) -> Frame | HeartBeat | None:
        """Return the next frame or heart-beat, or None until more data arrives.

        Raises `RemoteProtocolError` (often `InvalidFrameError`) when the peer broke the protocol;
        from then on the connection is in ERROR and every call raises again. An ERROR frame from the
        peer is returned like any frame; it is the peer's last word, so the connection enters
        ERROR and later calls return None (anything after it is ignored).
        """
        state = self._state
        if state is _ERROR:
            if self._peer_sent_error:
                return None
            raise self._failed_error()
        if state is _CLOSED or (state is _CONNECTING and self.role is _SERVER):
            return None
        try:
            event = self._parser.next_event()
        except RemoteProtocolError as exc:
            raise self._fail(exc) from None
        if event is None:
            if self._eof:
                if self._parser.buffered_bytes:
                    raise self._fail(
                        RemoteProtocolError("connection closed in the middle of a frame")
                    )
                self._set_state(_CLOSED)
            return None
        if type(event) is HeartBeat:
            return event
        assert isinstance(event, Frame)
        command = event.command
        target = self._may_receive.get(command)
        if target is None:
            raise self._fail(self._unexpected(event))
        required = self._required_in.get(command)
        if required is not None:
            headers = event.headers
            for alternatives in required:
                if alternatives[0] not in headers and not any(h in headers for h in alternatives):
                    raise self._fail(
                        InvalidFrameError(missing_header_message(command, alternatives), event)
                    )
        if command is _CONNECTED_FRAME:
            self._client_negotiate(event)
        elif command is _ERROR_FRAME:
            self._peer_sent_error = True
        elif command in self._not_in_version:
            raise self._fail(InvalidFrameError(f"{command} is not part of STOMP 1.0", event))
        if target is not state:
            self._set_state(target)
        return event

    def _failed_error(self) -> ProtocolError:
        error = self._error
        if error is None:
            return LocalProtocolError("the connection is in ERROR after sending ERROR; close it")
        if isinstance(error, RemoteProtocolError):
            return RemoteProtocolError(f"the connection has failed: {error}")
        return LocalProtocolError(f"the connection has failed: {error}")

    def _unexpected(self, frame: Frame) -> InvalidFrameError:
        command = frame.command
        if self.role is Role.SERVER:
            if command in _DELIVERIES or command in (Command.CONNECTED, Command.ERROR):
                return InvalidFrameError(f"a client may not send {command}", frame)
            if self._state is ConnState.AWAITING_CONNECT:
                return InvalidFrameError(f"{command} frame before CONNECT", frame)
            if command in _CONNECTS:
                return InvalidFrameError(
                    f"{command} on a connection that is already connected", frame
                )
            return InvalidFrameError(f"{command} frame after DISCONNECT", frame)
        if command not in _DELIVERIES and command not in (Command.CONNECTED, Command.ERROR):
            return InvalidFrameError(f"a server may not send {command}", frame)
        return InvalidFrameError(f"{command} frame in state {self._state.value}", frame)

    # Negotiation.

    def connect(
        self,
        *,
        host: str,
        login: str | None = None,
        passcode: str | None = None,
        heartbeat: tuple[int, int] = (0, 0),
        versions: Sequence[Version] = ALL_VERSIONS,
        extra_headers: Mapping[str, str] | None = None,
        command: Command = Command.CONNECT,
    ) -> bytes:
        """Client: return the CONNECT (or STOMP) frame that opens the connection.

        `heartbeat` is (how often we can send, how often we want to hear from the server) in ms.
        `extra_headers` are added after ours and cannot replace them.
        """
        if self.role is not Role.CLIENT:
            raise LocalProtocolError("only a client sends CONNECT")
        if command not in _CONNECTS:
            raise LocalProtocolError(f"connect() sends CONNECT or STOMP, not {command}")
        if self._state is not ConnState.AWAITING_CONNECT:
            raise LocalProtocolError(f"cannot send {command} in state {self._state.value}")
        offered = tuple(v for v in ALL_VERSIONS if v in versions)
        if not offered:
            raise LocalProtocolError("connect() needs at least one version")
        if heartbeat[0] < 0 or heartbeat[1] < 0:
            raise LocalProtocolError(f"heart-beat values must not be negative: {heartbeat}")
        headers = {"accept-version": ",".join(v.value for v in offered), "host": host}
        if login is not None:
            headers["login"] = login
        if passcode is not None:
            headers["passcode"] = passcode
        if offered != (Version.V1_0,):
            headers["heart-beat"] = f"{heartbeat[0]},{heartbeat[1]}"
        for key, value in (extra_headers or {}).items():
            headers.setdefault(key, value)
        data = encode_frame(command, headers, b"", Version.V1_0)
        self._offered_versions = offered
        self._offered_heartbeat = heartbeat
        self._set_state(ConnState.CONNECTING)
        return data

    def _client_negotiate(self, connected: Frame) -> None:
        headers = connected.headers
        name = headers.get("version")
        if name is None:
            if Version.V1_0 not in self._offered_versions:
                raise self._fail(
                    InvalidFrameError("CONNECTED frame lacks the version header", connected)
                )
            version = Version.V1_0
        else:
            found = VERSIONS_BY_NAME.get(name)
            if found is None or found not in self._offered_versions:
                raise self._fail(
                    InvalidFrameError(
                        f"server chose version {name[:20]!r}, which we did not offer", connected
                    )
                )
            version = found
        if version is Version.V1_0:
            send_ms, receive_ms = 0, 0
        else:
            try:
                server = parse_heartbeat(headers.get("heart-beat"))
            except RemoteProtocolError as exc:
                raise self._fail(exc) from None
            send_ms, receive_ms = negotiate_heartbeat(self._offered_heartbeat, server)
        self._negotiated = Negotiated(version, send_ms, receive_ms)
        self._set_version(version)
        self._start_clock()

    def accept(
        self,
        connect: Frame,
        *,
        server_heartbeat: tuple[int, int],
        server_name: str,
        session: str,
        supported: Sequence[Version] = ALL_VERSIONS,
    ) -> bytes:
        """Server: answer the CONNECT just received and return the CONNECTED frame.

        `server_heartbeat` is (how often we can send, how often we want to hear from the client) in
        ms. Raises `UnsupportedVersionError` if no version is common (send `error_frame` with a
        `version` header listing ours, then close) and `RemoteProtocolError` for a malformed
        heart-beat; either leaves the connection in ERROR.
        """
        if self.role is not Role.SERVER:
            raise LocalProtocolError("only a server accepts CONNECT")
        if self._state is not ConnState.CONNECTING:
            raise LocalProtocolError(f"no CONNECT to accept in state {self._state.value}")
        if connect.command not in _CONNECTS:
            raise LocalProtocolError(f"accept() takes the CONNECT frame, not {connect.command}")
        try:
            version = negotiate_version(connect.headers.get("accept-version"), supported, connect)
            if version is Version.V1_0:
                upstream, downstream = 0, 0
            else:
                client = parse_heartbeat(connect.headers.get("heart-beat"))
                upstream, downstream = negotiate_heartbeat(client, server_heartbeat)
        except RemoteProtocolError as exc:
            raise self._fail(exc) from None
        # `version` always, 1.0 too: clients and test suites of 1.1 and 1.2 look for it.
        headers: dict[str, str] = {"version": version.value}
        if version is not Version.V1_0:
            # The agreed values, so a client that negotiates either way reaches the same result.
            headers["heart-beat"] = f"{downstream},{upstream}"
        headers["session"] = session
        headers["server"] = server_name
        data = encode_frame(Command.CONNECTED, headers, b"", version)
        self._negotiated = Negotiated(version, downstream, upstream)
        self._set_version(version)
        self._set_state(ConnState.CONNECTED)
        self._start_clock()
        return data

    # Sending.

    def send(self, frame: Frame) -> bytes:
        """Encode one of our frames with the negotiated version, after checking we may send it.

        Raises `LocalProtocolError` if our role or the state forbids the frame or it lacks a
        required header. Sending ERROR moves to ERROR; a client's DISCONNECT to DISCONNECTING.
        """
        command = frame.command
        state = self._state
        target = self._may_send.get(command)
        if target is None or command in _CONNECTS or command is Command.CONNECTED:
            raise LocalProtocolError(self._cannot_send(command))
        if command in self._not_in_version:
            raise LocalProtocolError(f"{command} is not part of STOMP {self._version.value}")
        required = self._required_out.get(command)
        if required is not None:
            headers = frame.headers
            for alternatives in required:
                if not any(h in headers for h in alternatives):
                    raise LocalProtocolError(missing_header_message(command, alternatives))
        data = encode_frame(command, frame.headers, frame.body, self._version)
        if target is not state:
            self._set_state(target)
        return data

    def _cannot_send(self, command: Command) -> str:
        if command in _CONNECTS:
            return f"use connect() to send {command}"
        if command is Command.CONNECTED:
            return "use accept() to send CONNECTED"
        if (self.role is Role.SERVER) != (command in _DELIVERIES or command is Command.ERROR):
            return f"a {self.role.value} may not send {command}"
        return f"cannot send {command} in state {self._state.value}"

    def error_frame(
        self,
        message: str,
        *,
        receipt_id: str | None = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """Server: return an ERROR frame and move to ERROR (CLOSED stays CLOSED). Never raises.

        Usable in any state, before CONNECT too. Text that a version cannot carry is replaced
        rather than refused. `headers` adds headers such as `version` for a version mismatch.
        """
        version = self._version
        escaped = version is not Version.V1_0
        fields = {"message": _sanitize(message, escaped)}
        if receipt_id is not None:
            fields["receipt-id"] = _sanitize(receipt_id, escaped)
        for raw_key, value in (headers or {}).items():
            key = _sanitize(raw_key, escaped)
            if not escaped:
                key = key.replace(":", "_")
            fields.setdefault(key, _sanitize(value, escaped))
        fields.pop("content-length", None)
        if body:
            fields.setdefault("content-type", "text/plain")
        data = encode_frame(Command.ERROR, fields, bytes(body), version)
        if self._state is not ConnState.CLOSED and self._state is not ConnState.ERROR:
            self._set_state(ConnState.ERROR)
        return data

    def heartbeat(self) -> bytes:
        """Return a heart-beat (a bare EOL) to send. Only once connected."""
        if self._state is not ConnState.CONNECTED and self._state is not ConnState.DISCONNECTING:
            raise LocalProtocolError(f"no heart-beats in state {self._state.value}")
        return HEARTBEAT_BYTES

    # Heart-beat clock.

    def _start_clock(self) -> None:
        # The CONNECT/CONNECTED exchange is the first traffic both ways.
        self._clock_origin = self._last_received if self._last_received is not None else 0.0

    def peer_held(self, now: float) -> None:
        """We are not reading the peer on purpose (flow control): count it as heard from at
        `now`, so its heart-beats waiting unread in our socket do not make it look dead."""
        self._last_received = now

    def data_sent(self, now: float) -> None:
        """Record that we wrote something to the peer at `now`."""
        self._last_sent = now

    def _send_deadline(self) -> float | None:
        negotiated = self._negotiated
        if negotiated is None or not negotiated.send_heartbeat_ms:
            return None
        if self._state is not ConnState.CONNECTED and self._state is not ConnState.DISCONNECTING:
            return None
        last = self._last_sent if self._last_sent is not None else self._clock_origin
        return last + negotiated.send_heartbeat_ms / 1000.0

    def _receive_deadline(self) -> float | None:
        negotiated = self._negotiated
        if negotiated is None or not negotiated.receive_heartbeat_ms:
            return None
        if self._state is not ConnState.CONNECTED and self._state is not ConnState.DISCONNECTING:
            return None
        last = self._last_received if self._last_received is not None else self._clock_origin
        return last + negotiated.receive_heartbeat_ms / 1000.0 * self.grace_factor

    def heartbeat_due(self, now: float) -> bool:
        """Whether we owe the peer a heart-beat: nothing sent for the send interval."""
        deadline = self._send_deadline()
        return deadline is not None and now >= deadline

    def peer_timed_out(self, now: float) -> bool:
        """Whether the peer has been silent for `grace_factor` times its heart-beat interval."""
        deadline = self._receive_deadline()
        return deadline is not None and now >= deadline

    def next_deadline(self, now: float) -> float | None:
        """The earliest time at which `heartbeat_due` or `peer_timed_out` turns true.

        None if heart-beats are off both ways. Never earlier than `now`, so it is always a time
        to arm a timer for.
        """
        send = self._send_deadline()
        receive = self._receive_deadline()
        if send is None:
            if receive is None:
                return None
            deadline = receive
        elif receive is None or send < receive:
            deadline = send
        else:
            deadline = receive
        return deadline if deadline > now else now
