"""Unit tests of the STOMP frame parser and encoder."""

from __future__ import annotations

import pytest

from sluice.errors import FrameLimitExceeded, LocalProtocolError, RemoteProtocolError
from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.encoding import (
    HEARTBEAT_BYTES,
    assemble_frame,
    encode_frame,
    encode_headers,
    escape_value,
)
from sluice.stomp.frames import Command, Frame, HeartBeat, Version

from .stomp_helpers import Parse, bytewise, drain

HB = HeartBeat()


def frame(command: Command, body: bytes = b"", **headers: str) -> Frame:
    return Frame(command, {k.replace("_", "-"): v for k, v in headers.items()}, body)


# Parsing: structure.


def test_send_with_content_length(parse: Parse) -> None:
    data = b"SEND\ndestination:/queue/a\ncontent-length:5\n\nhello\0"
    assert parse(data) == [
        Frame(Command.SEND, {"destination": "/queue/a", "content-length": "5"}, b"hello")
    ]


def test_send_without_content_length_ends_at_first_nul(parse: Parse) -> None:
    data = b"SEND\ndestination:/queue/a\n\nhello\0"
    assert parse(data) == [Frame(Command.SEND, {"destination": "/queue/a"}, b"hello")]


def test_content_length_body_keeps_nuls(parse: Parse) -> None:
    body = b"\0a\0\0b\0"
    data = b"SEND\ndestination:/q\ncontent-length:6\n\n" + body + b"\0"
    [event] = parse(data)
    assert isinstance(event, Frame)
    assert event.body == body


def test_empty_body_and_no_headers(parse: Parse) -> None:
    assert parse(b"DISCONNECT\n\n\0") == [Frame(Command.DISCONNECT, {}, b"")]


def test_crlf_line_ends(parse: Parse) -> None:
    data = b"SEND\r\ndestination:/q\r\ncontent-length:2\r\n\r\nhi\0"
    assert parse(data) == [Frame(Command.SEND, {"destination": "/q", "content-length": "2"}, b"hi")]


def test_mixed_line_ends(parse: Parse) -> None:
    data = b"SUBSCRIBE\r\nid:1\ndestination:/q\r\n\n\0"
    assert parse(data) == [Frame(Command.SUBSCRIBE, {"id": "1", "destination": "/q"})]


def test_crlf_blank_line_followed_by_body_starting_with_lf(parse: Parse) -> None:
    data = b"SEND\ndestination:/q\r\n\r\n\nx\0"
    assert parse(data) == [Frame(Command.SEND, {"destination": "/q"}, b"\nx")]


def test_only_the_trailing_cr_of_a_line_is_stripped(parse: Parse) -> None:
    data = b"SEND\ndestination:a\rb\r\n\n\0"
    [event] = parse(data, Version.V1_0)
    assert isinstance(event, Frame)
    assert event.headers == {"destination": "a\rb"}


def test_heartbeats_between_and_around_frames(parse: Parse) -> None:
    data = b"\n\r\nSEND\ndestination:/q\n\n\0\n\nSEND\ndestination:/r\n\n\0\r\n"
    assert parse(data) == [
        HB,
        Frame(Command.SEND, {"destination": "/q"}),
        HB,
        Frame(Command.SEND, {"destination": "/r"}),
        HB,
    ]


def test_consecutive_eols_in_one_feed_are_one_heartbeat() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"\n\n\r\n\n")
    assert parser.next_event() == HB
    assert parser.next_event() is None
    assert parser.buffered_bytes == 0


def test_lone_cr_waits_for_its_lf() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"\r")
    assert parser.next_event() is None
    assert parser.buffered_bytes == 1
    parser.feed(b"\n")
    assert parser.next_event() == HB


def test_cr_without_lf_between_frames_is_an_error(parse: Parse) -> None:
    with pytest.raises(RemoteProtocolError, match="CR not followed by LF"):
        parse(b"\rSEND\n\n\0")


@pytest.mark.parametrize("command", ["FOO", "send", " SEND", "SEND ", "MESSAGES"])
def test_unknown_command(parse: Parse, command: str) -> None:
    with pytest.raises(RemoteProtocolError, match="unknown command"):
        parse(command.encode() + b"\ndestination:/q\n\n\0")


def test_unknown_command_rejected_before_the_headers_end() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"GET / HTTP/1.1\r\nHost: example\r\n")
    with pytest.raises(RemoteProtocolError, match="unknown command"):
        parser.next_event()


def test_unknown_command_of_a_later_frame_rejected_early() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"SEND\n\n\0GET / HTTP/1.1\r\nHost: example\r\n")
    assert parser.next_event() == Frame(Command.SEND, {})
    with pytest.raises(RemoteProtocolError, match="unknown command"):
        parser.next_event()


def test_every_command_parses(parse: Parse) -> None:
    for command in Command:
        assert parse(f"{command}\n\n".encode() + b"\0") == [Frame(command, {}, b"")]


def test_header_without_colon(parse: Parse) -> None:
    with pytest.raises(RemoteProtocolError, match="without ':'"):
        parse(b"SEND\ndestination:/q\nbogus\n\n\0")


def test_repeated_header_first_wins(parse: Parse) -> None:
    data = b"MESSAGE\nfoo:first\ndestination:/q\nfoo:second\nfoo:third\n\n\0"
    [event] = parse(data)
    assert isinstance(event, Frame)
    assert event.headers == {"foo": "first", "destination": "/q"}


def test_repeated_escaped_header_first_wins(parse: Parse) -> None:
    data = b"MESSAGE\na\\cb:first\na\\cb:second\n\n\0"
    [event] = parse(data)
    assert isinstance(event, Frame)
    assert event.headers == {"a:b": "first"}


def test_header_values_are_never_trimmed(parse: Parse) -> None:
    data = b"SEND\ndestination: /q \n x :\t\n\n\0"
    [event] = parse(data)
    assert isinstance(event, Frame)
    assert event.headers == {"destination": " /q ", " x ": "\t"}


def test_value_keeps_colons_after_the_first(parse: Parse) -> None:
    [event] = parse(b"SEND\ndestination:a:b:c\n\n\0", Version.V1_0)
    assert isinstance(event, Frame)
    assert event.headers == {"destination": "a:b:c"}


def test_empty_key_and_value(parse: Parse) -> None:
    [event] = parse(b"SEND\n:\n\n\0")
    assert isinstance(event, Frame)
    assert event.headers == {"": ""}


def test_invalid_utf8_header(parse: Parse) -> None:
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        parse(b"SEND\ndestination:\xff\xfe\n\n\0")


def test_utf8_header(parse: Parse) -> None:
    [event] = parse("SEND\ndestination:/queue/été\n\n\0".encode())
    assert isinstance(event, Frame)
    assert event.headers == {"destination": "/queue/été"}


# Parsing: escapes.


def test_v12_escapes(parse: Parse) -> None:
    data = b"MESSAGE\nk\\c\\n:a\\rb\\nc\\cd\\\\e\n\n\0"
    [event] = parse(data, Version.V1_2)
    assert isinstance(event, Frame)
    assert event.headers == {"k:\n": "a\rb\nc:d\\e"}


def test_v11_escapes_without_cr(parse: Parse) -> None:
    [event] = parse(b"MESSAGE\nk:a\\nb\\cc\\\\d\n\n\0", Version.V1_1)
    assert isinstance(event, Frame)
    assert event.headers == {"k": "a\nb:c\\d"}


def test_v11_has_no_cr_escape(parse: Parse) -> None:
    with pytest.raises(RemoteProtocolError, match=r"undefined escape sequence \\r"):
        parse(b"MESSAGE\nk:a\\rb\n\n\0", Version.V1_1)


def test_v10_has_no_escapes(parse: Parse) -> None:
    [event] = parse(b"MESSAGE\nk:a\\cb\\t\\\n\n\0", Version.V1_0)
    assert isinstance(event, Frame)
    assert event.headers == {"k": "a\\cb\\t\\"}


@pytest.mark.parametrize("version", [Version.V1_1, Version.V1_2])
@pytest.mark.parametrize("raw", [b"a\\tb", b"a\\", b"\\x", b"a\\C"])
def test_undefined_escape_is_an_error(parse: Parse, version: Version, raw: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="escape sequence"):
        parse(b"SEND\ndestination:" + raw + b"\n\n\0", version)


def test_undefined_escape_in_key(parse: Parse) -> None:
    with pytest.raises(RemoteProtocolError, match="escape sequence"):
        parse(b"SEND\nde\\st:x\n\n\0")


@pytest.mark.parametrize("command", [Command.CONNECT, Command.STOMP, Command.CONNECTED])
@pytest.mark.parametrize("version", list(Version))
def test_connect_and_connected_are_never_unescaped(
    parse: Parse, command: Command, version: Version
) -> None:
    data = f"{command}\n".encode() + b"login:a\\cb\npasscode:x\\y:z\\\\\n\n\0"
    [event] = parse(data, version)
    assert isinstance(event, Frame)
    assert event.headers == {"login": "a\\cb", "passcode": "x\\y:z\\\\"}


def test_version_can_change_between_frames() -> None:
    parser = FrameParser(StompLimits(), Version.V1_0)
    parser.feed(b"SEND\nk:a\\cb\n\n\0SEND\nk:a\\cb\n\n\0")
    first = parser.next_event()
    parser.version = Version.V1_2
    second = parser.next_event()
    assert isinstance(first, Frame)
    assert isinstance(second, Frame)
    assert first.headers == {"k": "a\\cb"}
    assert second.headers == {"k": "a:b"}
    assert parser.version is Version.V1_2


# Parsing: content-length and bodies.


def test_content_length_needs_nul_right_after_the_body(parse: Parse) -> None:
    with pytest.raises(RemoteProtocolError, match="not terminated by NUL"):
        parse(b"SEND\ndestination:/q\ncontent-length:3\n\nhello\0")


@pytest.mark.parametrize(
    "value", [b"-1", b"abc", b" 5", b"5 ", b"+5", b"", b"0x5", "\u0665".encode()]
)
def test_invalid_content_length(parse: Parse, value: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="content-length"):
        parse(b"SEND\ndestination:/q\ncontent-length:" + value + b"\n\nhello\0")


def test_content_length_with_leading_zeros(parse: Parse) -> None:
    [event] = parse(b"SEND\ndestination:/q\ncontent-length:005\n\nhello\0")
    assert isinstance(event, Frame)
    assert event.body == b"hello"


def test_first_content_length_wins(parse: Parse) -> None:
    [event] = parse(b"SEND\ncontent-length:2\ncontent-length:5\n\nhi\0")
    assert isinstance(event, Frame)
    assert event.body == b"hi"


@pytest.mark.parametrize(
    "command", [c for c in Command if c.value not in ("SEND", "MESSAGE", "ERROR")]
)
def test_body_on_a_command_without_body(parse: Parse, command: Command) -> None:
    with pytest.raises(RemoteProtocolError, match=f"frame {command} must not have a body"):
        parse(f"{command}\nid:1\n\nxyz\0".encode())
    with pytest.raises(RemoteProtocolError, match=f"frame {command} must not have a body"):
        parse(f"{command}\nid:1\ncontent-length:3\n\nxyz\0".encode())


def test_content_length_zero_on_a_command_without_body(parse: Parse) -> None:
    assert parse(b"SUBSCRIBE\nid:1\ncontent-length:0\n\n\0") == [
        Frame(Command.SUBSCRIBE, {"id": "1", "content-length": "0"})
    ]


def test_body_on_subscribe_rejected_before_the_nul_arrives() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"SUBSCRIBE\nid:1\n\nx")
    with pytest.raises(RemoteProtocolError, match="must not have a body"):
        parser.next_event()


def test_errors_are_sticky() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"BOGUS\n\n\0")
    with pytest.raises(RemoteProtocolError):
        parser.next_event()
    parser.feed(b"SEND\n\n\0")
    with pytest.raises(RemoteProtocolError, match="unknown command"):
        parser.next_event()


def test_feed_accepts_bytearray_and_memoryview() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(bytearray(b"SEND\n"))
    parser.feed(memoryview(b"destination:/q\n\nab\0"))
    assert parser.next_event() == Frame(Command.SEND, {"destination": "/q"}, b"ab")


def test_buffered_bytes_and_trailing_partial_frame() -> None:
    parser = FrameParser(StompLimits())
    one = b"SEND\ndestination:/q\n\nab\0"
    parser.feed(one * 3 + b"SEND\ndest")
    assert parser.buffered_bytes == 3 * len(one) + 9
    assert len(drain(parser, [b""])) == 3
    assert parser.buffered_bytes == 9
    parser.feed(b"ination:/r\n\n\0")
    assert parser.next_event() == Frame(Command.SEND, {"destination": "/r"})
    assert parser.buffered_bytes == 0


def test_many_frames_across_many_feeds() -> None:
    one = encode_frame(Command.SEND, {"destination": "/q"}, b"x" * 100)
    stream = one * 500
    parser = FrameParser(StompLimits())
    events = drain(parser, [stream[i : i + 777] for i in range(0, len(stream), 777)])
    assert len(events) == 500
    assert all(
        e == Frame(Command.SEND, {"destination": "/q", "content-length": "100"}, b"x" * 100)
        for e in events
    )
    assert parser.buffered_bytes == 0


def test_bodies_are_bytes_of_their_own() -> None:
    # Bodies are copied out of a view of the parser's buffer; later feeds compact and grow that
    # buffer, which must neither fail nor change a body already handed out.
    parser = FrameParser(StompLimits())
    body = bytes(range(256)) * 300
    one = encode_frame(Command.SEND, {"destination": "/q"}, body)
    parser.feed(one + one[:1000])
    first = parser.next_event()
    assert isinstance(first, Frame)
    assert parser.next_event() is None
    for offset in range(1000, len(one), 4096):
        parser.feed(one[offset : offset + 4096])
    second = parser.next_event()
    parser.feed(one)
    third = parser.next_event()
    for event in (first, second, third):
        assert isinstance(event, Frame)
        assert type(event.body) is bytes
        assert event.body == body
    assert parser.buffered_bytes == 0


def test_a_large_body_arriving_in_pieces_is_gathered() -> None:
    body = bytes(range(256)) * 1024  # 256 KiB
    one = encode_frame(Command.SEND, {"destination": "/q"}, body)
    tail = b"SEND\ndestination:/next\n"
    parser = FrameParser(StompLimits())
    reused = bytearray(1000)
    stream = one + tail
    for offset in range(0, len(stream), len(reused)):
        piece = stream[offset : offset + len(reused)]
        # A caller that reuses its read buffer: the parser must have copied what it keeps.
        reused[: len(piece)] = piece
        parser.feed(memoryview(reused)[: len(piece)])
        reused[:] = b"\xff" * len(reused)
        if offset + len(piece) < len(one):
            assert parser.next_event() is None
            assert parser.buffered_bytes == offset + len(piece)
    event = parser.next_event()
    assert event == Frame(
        Command.SEND, {"destination": "/q", "content-length": str(len(body))}, body
    )
    assert parser.buffered_bytes == len(tail)
    assert parser.next_event() is None


def test_a_gathered_body_needs_its_nul() -> None:
    parser = FrameParser(StompLimits(), large_body_bytes=4)
    parser.feed(b"SEND\nreceipt:r7\ncontent-length:6\n\nab")
    assert parser.next_event() is None
    parser.feed(b"cd")
    parser.feed(b"efX")
    with pytest.raises(RemoteProtocolError, match="not terminated by NUL") as info:
        parser.next_event()
    assert info.value.receipt_id == "r7"


def test_content_length_with_many_leading_zeros(parse: Parse) -> None:
    [event] = parse(b"SEND\ncontent-length:" + b"0" * 30 + b"5\n\nhello\0")
    assert isinstance(event, Frame)
    assert event.body == b"hello"


# Parsing: limits.

LIMITS = StompLimits(max_frame_bytes=100, max_header_bytes=40, max_headers=3)


def sized_frame(total: int) -> bytes:
    """A SEND frame of exactly `total` bytes, NUL included, without content-length."""
    head = b"SEND\n\n"
    return head + b"x" * (total - len(head) - 1) + b"\0"


def test_frame_at_the_limit_passes(parse: Parse) -> None:
    data = sized_frame(100)
    assert len(data) == 100
    [event] = parse(data, limits=LIMITS)
    assert isinstance(event, Frame)


def test_frame_one_byte_over_the_limit_fails(parse: Parse) -> None:
    with pytest.raises(FrameLimitExceeded) as info:
        parse(sized_frame(101), limits=LIMITS)
    assert info.value.limit == "max_frame_bytes"
    assert info.value.value == 100


def test_frame_with_content_length_at_and_over_the_limit(parse: Parse) -> None:
    head = b"SEND\ncontent-length:"
    # 20 header bytes + 2 digits + 2 newlines, then the body and the NUL.
    body = b"y" * (100 - len(head) - 2 - 2 - 1)
    data = head + str(len(body)).encode() + b"\n\n" + body + b"\0"
    assert len(data) == 100
    [event] = parse(data, limits=LIMITS)
    assert isinstance(event, Frame)
    assert event.body == body
    body += b"y"
    data = head + str(len(body)).encode() + b"\n\n" + body + b"\0"
    with pytest.raises(FrameLimitExceeded, match="max_frame_bytes"):
        parse(data, limits=LIMITS)


def test_content_length_announcing_too_much_fails_before_the_body() -> None:
    parser = FrameParser(StompLimits(max_frame_bytes=1000))
    parser.feed(b"SEND\ndestination:/q\ncontent-length:1000\n\n")
    with pytest.raises(FrameLimitExceeded) as info:
        parser.next_event()
    assert info.value.limit == "max_frame_bytes"
    assert parser.buffered_bytes < 100


def test_huge_content_length_fails_on_the_limit() -> None:
    parser = FrameParser(StompLimits())
    parser.feed(b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n")
    with pytest.raises(FrameLimitExceeded, match="max_frame_bytes"):
        parser.next_event()


def test_unterminated_body_fails_as_soon_as_it_passes_the_limit() -> None:
    parser = FrameParser(LIMITS)
    parser.feed(b"SEND\n\n" + b"z" * 93)  # 99 bytes: the NUL could still come
    assert parser.next_event() is None
    parser.feed(b"z")
    with pytest.raises(FrameLimitExceeded, match="max_frame_bytes"):
        parser.next_event()


def header_block(total: int) -> bytes:
    """A command line and one header line of exactly `total` bytes together."""
    head = b"SEND\nk:"
    return head + b"v" * (total - len(head) - 1) + b"\n"


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_header_block_at_the_limit_passes(parse: Parse, eol: bytes) -> None:
    block = header_block(40)
    assert len(block) == 40
    [event] = parse(block + eol + b"\0", limits=LIMITS)
    assert isinstance(event, Frame)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_header_block_one_byte_over_fails(parse: Parse, eol: bytes) -> None:
    with pytest.raises(FrameLimitExceeded) as info:
        parse(header_block(41) + eol + b"\0", limits=LIMITS)
    assert info.value.limit == "max_header_bytes"


def test_header_block_without_end_fails_once_past_the_limit() -> None:
    parser = FrameParser(LIMITS)
    data = b"SEND\nk:" + b"v" * 100
    # 41 bytes could still be a 40-byte block followed by CR LF.
    for byte in bytewise(data[:41]):
        parser.feed(byte)
        assert parser.next_event() is None
    parser.feed(data[41:42])
    with pytest.raises(FrameLimitExceeded, match="max_header_bytes"):
        parser.next_event()


def test_max_headers(parse: Parse) -> None:
    ok = b"SEND\na:1\nb:2\nc:3\n\n\0"
    [event] = parse(ok, limits=LIMITS)
    assert isinstance(event, Frame)
    with pytest.raises(FrameLimitExceeded) as info:
        parse(b"SEND\na:1\nb:2\nc:3\na:4\n\n\0", limits=LIMITS)
    assert info.value.limit == "max_headers"


def test_limit_errors_are_remote_protocol_errors() -> None:
    assert issubclass(FrameLimitExceeded, RemoteProtocolError)


# Encoding.


def test_encode_send() -> None:
    data = encode_frame(Command.SEND, {"destination": "/queue/a"}, b"hi")
    assert data == b"SEND\ndestination:/queue/a\ncontent-length:2\n\nhi\0"


@pytest.mark.parametrize("command", [Command.SEND, Command.MESSAGE, Command.ERROR])
def test_content_length_on_empty_body_frames_that_may_have_one(command: Command) -> None:
    assert encode_frame(command, {}) == f"{command}\ncontent-length:0\n\n".encode() + b"\0"


def test_no_content_length_on_frames_without_body() -> None:
    assert encode_frame(Command.SUBSCRIBE, {"id": "1"}) == b"SUBSCRIBE\nid:1\n\n\0"
    assert encode_frame(Command.DISCONNECT, {}) == b"DISCONNECT\n\n\0"


def test_content_length_given_by_the_caller_is_kept() -> None:
    data = encode_frame(Command.SEND, [("content-length", "2"), ("a", "b")], b"hi")
    assert data == b"SEND\ncontent-length:2\na:b\n\nhi\0"


def test_content_length_given_wrong_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="content-length"):
        encode_frame(Command.SEND, {"content-length": "3"}, b"hi")
    with pytest.raises(LocalProtocolError, match="content-length"):
        encode_frame(Command.SEND, {"content-length": "x"}, b"hi")


def test_content_length_can_be_left_out() -> None:
    data = encode_frame(Command.SEND, {"destination": "/q"}, b"hi", content_length=False)
    assert data == b"SEND\ndestination:/q\n\nhi\0"
    with pytest.raises(LocalProtocolError, match="NUL"):
        encode_frame(Command.SEND, {"destination": "/q"}, b"h\0i", content_length=False)


def test_body_on_a_command_without_body_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="must not have a body"):
        encode_frame(Command.SUBSCRIBE, {"id": "1"}, b"x")


def test_encode_headers_as_pairs_keeps_order_and_repeats() -> None:
    data = encode_frame(Command.MESSAGE, [("b", "1"), ("a", "2"), ("b", "3")])
    assert data == b"MESSAGE\nb:1\na:2\nb:3\ncontent-length:0\n\n\0"
    [event] = drain(FrameParser(StompLimits()), [data])
    assert isinstance(event, Frame)
    assert event.headers == {"b": "1", "a": "2", "content-length": "0"}


def test_encode_escapes_per_version() -> None:
    headers = {"k:\n": "a\\b:c\nd\re"}
    assert encode_frame(Command.SEND, headers, version=Version.V1_2) == (
        b"SEND\nk\\c\\n:a\\\\b\\cc\\nd\\re\ncontent-length:0\n\n\0"
    )
    v11 = encode_frame(Command.SEND, {"k": "a\\b:c\nd\re"}, version=Version.V1_1)
    assert v11 == b"SEND\nk:a\\\\b\\cc\\nd\re\ncontent-length:0\n\n\0"
    v10 = encode_frame(Command.SEND, {"k": "a\\b:c\re"}, version=Version.V1_0)
    assert v10 == b"SEND\nk:a\\b:c\re\ncontent-length:0\n\n\0"


@pytest.mark.parametrize("command", [Command.CONNECT, Command.STOMP, Command.CONNECTED])
def test_encode_never_escapes_connect_and_connected(command: Command) -> None:
    data = encode_frame(command, {"passcode": "a\\cb:c"}, version=Version.V1_2)
    assert data == f"{command}\n".encode() + b"passcode:a\\cb:c\n\n\0"
    [event] = drain(FrameParser(StompLimits(), Version.V1_2), [data])
    assert isinstance(event, Frame)
    assert event.headers == {"passcode": "a\\cb:c"}


@pytest.mark.parametrize(
    ("version", "command", "headers"),
    [
        (Version.V1_0, Command.SEND, {"k": "a\nb"}),
        (Version.V1_0, Command.SEND, {"k:x": "v"}),
        (Version.V1_0, Command.SEND, {"k": "v\r"}),
        (Version.V1_1, Command.SEND, {"k": "v\r"}),
        (Version.V1_2, Command.CONNECT, {"login": "a\nb"}),
        (Version.V1_2, Command.CONNECTED, {"a:b": "c"}),
    ],
)
def test_unrepresentable_headers_are_local_errors(
    version: Version, command: Command, headers: dict[str, str]
) -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(command, headers, version=version)


def test_unencodable_text_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="UTF-8"):
        encode_frame(Command.SEND, {"destination": "/q\udcff"})
    with pytest.raises(LocalProtocolError, match="UTF-8"):
        encode_headers({"k": "\ud800"}, Version.V1_2)


def test_escape_value() -> None:
    assert escape_value("a\\b\r\n:c", Version.V1_2) == "a\\\\b\\r\\n\\cc"
    assert escape_value("a\\b\r\n:c", Version.V1_1) == "a\\\\b\r\\n\\cc"
    assert escape_value("a\\b:c", Version.V1_0) == "a\\b:c"
    assert escape_value("plain", Version.V1_2) == "plain"


def test_encode_headers_and_assemble_frame_match_encode_frame() -> None:
    headers = {"destination": "/q:1", "x": "y\n"}
    block = encode_headers(headers, Version.V1_2)
    assert block == b"destination:/q\\c1\nx:y\\n\n"
    body = b"\0body"
    assert assemble_frame(Command.MESSAGE, block, body) == encode_frame(
        Command.MESSAGE, headers, body
    )
    assert assemble_frame(Command.MESSAGE, block) == encode_frame(Command.MESSAGE, headers)
    assert encode_headers({}, Version.V1_2) == b""
    assert encode_headers([("a", "b:c")], Version.V1_0) == b"a:b:c\n"


def test_assemble_frame_keeps_a_content_length_in_the_block() -> None:
    block = encode_headers({"destination": "/q", "content-length": "2"}, Version.V1_2)
    assert assemble_frame(Command.SEND, block, b"hi") == (
        b"SEND\ndestination:/q\ncontent-length:2\n\nhi\0"
    )
    with pytest.raises(LocalProtocolError):
        assemble_frame(Command.SUBSCRIBE, b"id:1\n", b"x")
    with pytest.raises(LocalProtocolError, match="NUL"):
        assemble_frame(Command.SEND, b"", b"\0", content_length=False)


def test_heartbeat_bytes() -> None:
    assert HEARTBEAT_BYTES == b"\n"
    assert drain(FrameParser(StompLimits()), [HEARTBEAT_BYTES]) == [HB]


@pytest.mark.parametrize("version", list(Version))
def test_encode_then_parse(parse: Parse, version: Version) -> None:
    original = frame(Command.MESSAGE, b"a\0b", destination="/q", message_id="m:1", subscription="s")
    if version is Version.V1_0:
        original.headers["message-id"] = "m-1"
    data = encode_frame(original.command, original.headers, original.body, version)
    [event] = parse(data, version)
    assert isinstance(event, Frame)
    assert event.body == original.body
    assert event.headers == {**original.headers, "content-length": "3"}
