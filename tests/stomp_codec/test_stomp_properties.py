"""Property tests of the STOMP codec and connection (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import LocalProtocolError, RemoteProtocolError
from sluice.stomp.codec import LARGE_BODY_BYTES, FrameParser, StompLimits
from sluice.stomp.connection import Role, StompConnection
from sluice.stomp.encoding import encode_frame
from sluice.stomp.frames import BODY_COMMANDS, Command, Frame, HeartBeat, Version

from .stomp_helpers import drain

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RAW_COMMANDS = {Command.CONNECT, Command.STOMP, Command.CONNECTED}

commands = st.sampled_from(list(Command))
versions = st.sampled_from(list(Version))
# Any unicode, with the characters that escaping and line parsing care about made common.
special = st.sampled_from([":", "\\", "\r", "\n", "\0", "\\c", "\\r", "\\n", "\r\n", "\\\\"])
any_text = st.lists(st.one_of(special, st.text(max_size=4)), max_size=5).map("".join)


def representable(version: Version, command: Command, key: str, value: str) -> bool:
    """Whether a header survives encoding under these rules (escaping or not)."""
    if key == "content-length":
        return False
    if version is Version.V1_2 and command not in RAW_COMMANDS:
        return True
    if value.endswith("\r"):
        return False
    if version is Version.V1_1 and command not in RAW_COMMANDS:
        return True
    return ":" not in key and "\n" not in key and "\n" not in value


@st.composite
def frames(
    draw: st.DrawFn, version: Version | None = None
) -> tuple[Version, Frame, list[tuple[str, str]]]:
    """A version, a frame and the header pairs it is encoded from (repeats allowed)."""
    version = version or draw(versions)
    command = draw(commands)
    pairs = draw(st.lists(st.tuples(any_text, any_text), max_size=6))
    pairs = [(k, v) for k, v in pairs if representable(version, command, k, v)]
    body = draw(st.binary(max_size=64)) if command in BODY_COMMANDS else b""
    headers: dict[str, str] = {}
    for key, value in pairs:
        headers.setdefault(key, value)
    return version, Frame(command, headers, body), pairs


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames())
def test_encode_then_parse_round_trips(case: tuple[Version, Frame, list[tuple[str, str]]]) -> None:
    version, frame, pairs = case
    data = encode_frame(frame.command, pairs, frame.body, version)
    parser = FrameParser(StompLimits(), version)
    parser.feed(data)
    event = parser.next_event()
    assert isinstance(event, Frame)
    assert parser.next_event() is None
    assert parser.buffered_bytes == 0
    expected = dict(frame.headers)
    if frame.body or frame.command in (Command.SEND, Command.MESSAGE, Command.ERROR):
        expected["content-length"] = str(len(frame.body))
    assert event.command is frame.command
    assert event.headers == expected
    assert event.body == frame.body


eols = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[Version, bytes]:
    """Several encoded frames of one version, with runs of EOLs between them."""
    version = draw(versions)
    parts: list[bytes] = []
    for _ in range(draw(st.integers(1, 5))):
        parts.extend(draw(st.lists(eols, max_size=2)))
        _, frame, pairs = draw(frames(version))
        parts.append(encode_frame(frame.command, pairs, frame.body, version))
    parts.extend(draw(st.lists(eols, max_size=2)))
    return version, b"".join(parts)


@SETTINGS
@given(streams(), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_every_split_gives_the_same_events(stream: tuple[Version, bytes], cuts: list[int]) -> None:
    version, data = stream
    whole = drain(FrameParser(StompLimits(), version), [data])
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    # The second parser gathers every body that has not all arrived in pieces.
    for large_body_bytes in (LARGE_BODY_BYTES, 1):
        parser = FrameParser(StompLimits(), version, large_body_bytes=large_body_bytes)
        assert drain(parser, chunks) == whole
        assert parser.buffered_bytes == 0
    assert any(isinstance(e, Frame) for e in whole)


SMALL = StompLimits(max_frame_bytes=160, max_header_bytes=100, max_headers=4)


def valid_prefixes() -> st.SearchStrategy[bytes]:
    """Encoded frames, so random mutations reach past the command line."""
    return frames().map(lambda case: encode_frame(case[1].command, case[2], case[1].body, case[0]))


# Header blocks around SMALL.max_header_bytes and header counts around SMALL.max_headers.
near_limits = st.one_of(
    st.integers(min_value=80, max_value=110).map(lambda n: b"SEND\nh:" + b"v" * n + b"\n\n\0"),
    st.integers(min_value=2, max_value=7).map(
        lambda n: b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(n)) + b"\n\0"
    ),
)

junk = st.one_of(
    st.binary(max_size=400),
    st.lists(
        st.one_of(
            valid_prefixes(),
            near_limits,
            st.sampled_from(
                [
                    b"\n",
                    b"\r",
                    b"\0",
                    b":",
                    b"\\",
                    b"SEND\n",
                    b"content-length:",
                    b"9" * 3,
                    b"x" * 90,
                ]
            ),
            st.binary(max_size=20),
        ),
        max_size=10,
    ).map(b"".join),
)


def assert_within_limits(frame: Frame, limits: StompLimits) -> None:
    """A frame the parser let through respects every limit. Its header block on the wire was at
    least as long as the decoded lines (unescaping only shortens; repeats were dropped)."""
    assert len(frame.headers) <= limits.max_headers
    header_bytes = len(frame.command.value) + 1
    header_bytes += sum(len(k.encode()) + len(v.encode()) + 2 for k, v in frame.headers.items())
    assert header_bytes <= limits.max_header_bytes
    assert header_bytes + len(frame.body) + 1 <= limits.max_frame_bytes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk, st.integers(min_value=1, max_value=64), versions, st.sampled_from([1, 8, 1 << 16]))
def test_random_bytes_only_raise_protocol_errors(
    data: bytes, chunk: int, version: Version, large_body_bytes: int
) -> None:
    parser = FrameParser(SMALL, version, large_body_bytes=large_body_bytes)
    try:
        for offset in range(0, len(data), chunk):
            piece = data[offset : offset + chunk]
            parser.feed(piece)
            assert parser.buffered_bytes <= SMALL.max_frame_bytes + len(piece)
            while (event := parser.next_event()) is not None:
                assert isinstance(event, Frame | HeartBeat)
                if isinstance(event, Frame):
                    assert_within_limits(event, SMALL)
            # Drained: only a partial frame is left, and it is within the limit.
            assert parser.buffered_bytes <= SMALL.max_frame_bytes
    except RemoteProtocolError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk, st.integers(min_value=1, max_value=64), st.sampled_from(list(Role)))
def test_random_bytes_into_a_connection_only_raise_protocol_errors(
    data: bytes, chunk: int, role: Role
) -> None:
    conn = StompConnection(role, SMALL)
    if role is Role.CLIENT:
        conn.connect(host="h")
    else:
        data = b"CONNECT\naccept-version:1.2\n\n\0" + data
    try:
        for offset in range(0, len(data) + 1, chunk):
            conn.receive_data(data[offset : offset + chunk], float(offset))
            while (event := conn.next_event()) is not None:
                if isinstance(event, Frame):
                    assert_within_limits(event, SMALL)
                if isinstance(event, Frame) and event.command is Command.CONNECT:
                    conn.accept(event, server_heartbeat=(0, 0), server_name="s", session="1")
            assert conn.buffered_bytes <= SMALL.max_frame_bytes
    except RemoteProtocolError:
        pass
    # Whatever happened, an ERROR frame can still be produced.
    assert conn.error_frame("bye").startswith(b"ERROR\n")


@SETTINGS
@given(frames(), st.sampled_from(list(Role)))
def test_send_never_produces_unparseable_bytes(
    case: tuple[Version, Frame, list[tuple[str, str]]], role: Role
) -> None:
    version, frame, _ = case
    conn = StompConnection(role)
    if role is Role.CLIENT:
        conn.connect(host="h")
        conn.receive_data(f"CONNECTED\nversion:{version.value}\n\n".encode() + b"\0", 0.0)
    else:
        conn.receive_data(f"CONNECT\naccept-version:{version.value}\n\n".encode() + b"\0", 0.0)
    connect_or_connected = conn.next_event()
    if role is Role.SERVER:
        assert isinstance(connect_or_connected, Frame)
        conn.accept(connect_or_connected, server_heartbeat=(0, 0), server_name="s", session="1")
    try:
        data = conn.send(frame)
    except LocalProtocolError:
        return
    parser = FrameParser(StompLimits(), version)
    parser.feed(data)
    event = parser.next_event()
    assert isinstance(event, Frame)
    assert event.command is frame.command
    assert event.body == frame.body
