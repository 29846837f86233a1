"""A seeded mutation fuzzer of the frame parser and the server's connection state machine.

Valid frames (every client command, escapes, content-length with NULs in the body, CONNECT with
heart-beats) are mutated the way an attacker would (bytes flipped, inserted, deleted, doubled,
cut; content-length made negative, huge or wrong; header lines multiplied and lengthened) and fed
in random splits. Only `Frame` and `HeartBeat` events or a `RemoteProtocolError` may come out,
never another exception, and the bytes held never pass the limits. A failure prints its seed.

The default run tries a few thousand inputs; `--run-slow` runs the long one.
"""

from __future__ import annotations

import random

import pytest

from sluice.errors import FrameLimitExceeded, RemoteProtocolError
from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.connection import Role, StompConnection
from sluice.stomp.frames import Frame, HeartBeat, Version

LIMITS = StompLimits(max_frame_bytes=4096, max_header_bytes=512, max_headers=12)
BEFORE_CONNECTED = StompLimits(
    max_frame_bytes=1024,
    max_header_bytes=512,
    max_headers=12,
    frame_limit_name="max_frame_bytes_unauthenticated",
)
DEFAULT_CASES = 3000
SLOW_CASES = 200_000

CONNECT = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:h\nheart-beat:0,0\nlogin:u\npasscode:p\n\n\0"
SEEDS = [
    b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhello\0",
    b"SEND\ndestination:/queue/a\ncontent-length:5\n\nh\0l\0o\0",
    b"SEND\ndestination:/topic/x\\cy\nx-key:a\\nb\\\\c\ncontent-type:text/plain\n\nbody\0",
    b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:client-individual\nreceipt:s\n\n\0",
    b"SUBSCRIBE\nid:2\ndestination:/topic/a.>\nx-offset:earliest\n\n\0",
    b"UNSUBSCRIBE\nid:1\n\n\0",
    b"ACK\nid:7\n\n\0",
    b"NACK\nid:7\ntransaction:t\n\n\0",
    b"BEGIN\ntransaction:t\n\n\0",
    b"COMMIT\ntransaction:t\nreceipt:c\n\n\0",
    b"ABORT\ntransaction:t\n\n\0",
    b"\n\r\n\n",
    b"SEND\r\ndestination:/queue/crlf\r\n\r\nbody\0",
    b"DISCONNECT\nreceipt:bye\n\n\0",
]
INSERTS = [
    b"\0",
    b"\n",
    b"\r",
    b":",
    b"\\",
    b"\\x",
    b"\xff",
    b"\xc3",
    b"content-length:-1\n",
    b"content-length:99999999999999999999\n",
    b"content-length:4097\n",
    b"content-length:0\n",
    b"content-length:abc\n",
    b"content-length: 5\n",
    b"receipt:fz\n",
    b"x-pad:" + b"p" * 600 + b"\n",
    b"h:v\n" * 20,
    b"\n\n",
    b"SEND\n",
    b"CONNECT\n",
]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(8)
        at = rng.randint(0, len(out))
        if choice == 0 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif choice == 1:
            out[at:at] = rng.choice(INSERTS)
        elif choice == 2 and out:
            del out[at : at + rng.randint(1, 8)]
        elif choice == 3:
            out[at:at] = out[at : at + rng.randint(1, 64)] * rng.randint(2, 30)
        elif choice == 4:
            del out[rng.randint(0, len(out)) :]
        elif choice == 5:
            out += rng.choice(SEEDS)
        elif choice == 6:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            out = bytearray(data.replace(b"\n", b"\n" + rng.choice(INSERTS), 1))
    return bytes(out)


def _case(rng: random.Random) -> bytes:
    frames = [rng.choice(SEEDS) for _ in range(rng.randint(1, 4))]
    frames[rng.randrange(len(frames))] = _mutate(rng, frames[rng.randrange(len(frames))])
    return b"".join(frames)


def _splits(rng: random.Random, data: bytes) -> list[bytes]:
    mode = rng.randrange(3)
    if mode == 0:
        return [data]
    if mode == 1:
        return [data[i : i + 1] for i in range(len(data))]
    pieces, at = [], 0
    while at < len(data):
        step = rng.randint(1, 64)
        pieces.append(data[at : at + step])
        at += step
    return pieces


def _within_limits(frame: Frame, limits: StompLimits) -> None:
    assert len(frame.body) < limits.max_frame_bytes
    assert len(frame.headers) <= limits.max_headers


def fuzz_parser(rng: random.Random, data: bytes) -> None:
    """Feed `data` to a parser in random pieces: events or a clean protocol error only."""
    parser = FrameParser(LIMITS, rng.choice(list(Version)))
    try:
        for piece in _splits(rng, data):
            parser.feed(piece)
            assert parser.buffered_bytes <= LIMITS.max_frame_bytes + len(piece)
            while (event := parser.next_event()) is not None:
                assert isinstance(event, Frame | HeartBeat)
                if isinstance(event, Frame):
                    _within_limits(event, LIMITS)
            assert parser.buffered_bytes <= LIMITS.max_frame_bytes
    except RemoteProtocolError as exc:
        limit = exc.limit if isinstance(exc, FrameLimitExceeded) else "max_frame_bytes"
        if limit not in ("max_frame_bytes", "max_header_bytes", "max_headers"):
            raise AssertionError(f"unexpected limit {limit}") from exc
    parser.release()
    assert parser.buffered_bytes == 0


def fuzz_server(rng: random.Random, data: bytes, *, mutate_connect: bool) -> None:
    """A server connection fed CONNECT (itself mutated, sometimes) and then `data`."""
    conn = StompConnection(Role.SERVER, LIMITS, limits_before_connected=BEFORE_CONNECTED)
    connect = _mutate(rng, CONNECT) if mutate_connect else CONNECT
    stream = connect + data
    limits = BEFORE_CONNECTED
    try:
        for n, piece in enumerate(_splits(rng, stream)):
            conn.receive_data(piece, float(n))
            while (event := conn.next_event()) is not None:
                assert isinstance(event, Frame | HeartBeat)
                if isinstance(event, Frame):
                    _within_limits(event, limits)
                    if event.command.value in ("CONNECT", "STOMP"):
                        conn.accept(event, server_heartbeat=(0, 0), server_name="s", session="1")
                        limits = LIMITS
            assert conn.buffered_bytes <= limits.max_frame_bytes
    except RemoteProtocolError:
        pass
    assert conn.error_frame("bye").startswith(b"ERROR\n")
    conn.release()
    assert conn.buffered_bytes == 0


def _run(seed: int, cases: int) -> None:
    rng = random.Random(seed)
    for case in range(cases):
        data = _case(rng)
        try:
            fuzz_parser(rng, data)
            fuzz_server(rng, data, mutate_connect=case % 5 == 0)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, case {case}, input {data[:200]!r}: {exc}") from exc


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_frames_give_only_events_or_protocol_errors(seed: int) -> None:
    _run(seed, DEFAULT_CASES // 3)


@pytest.mark.slow
def test_mutated_frames_long_run() -> None:
    _run(20_260_101, SLOW_CASES)


def test_a_negative_or_huge_content_length_is_refused_before_any_body_is_buffered() -> None:
    for declared, kind in ((b"-1", RemoteProtocolError), (b"9" * 30, FrameLimitExceeded)):
        parser = FrameParser(LIMITS)
        parser.feed(b"SEND\ndestination:/queue/a\ncontent-length:%b\n\n" % declared)
        with pytest.raises(kind):
            parser.next_event()


def test_a_header_line_or_count_past_the_limit_is_refused_before_the_block_ends() -> None:
    parser = FrameParser(LIMITS)
    parser.feed(b"SEND\nx:" + b"y" * 1024)
    with pytest.raises(FrameLimitExceeded) as info:
        parser.next_event()
    assert info.value.limit == "max_header_bytes"
    assert parser.buffered_bytes <= 1024 + 16
    many = FrameParser(LIMITS)
    many.feed(b"SEND\n" + b"a:b\n" * 13 + b"\n\0")
    with pytest.raises(FrameLimitExceeded) as info:
        many.next_event()
    assert info.value.limit == "max_headers"


def test_a_body_trickled_in_tiny_pieces_costs_no_more_than_its_bytes() -> None:
    parser = FrameParser(StompLimits(max_frame_bytes=8 * 1024 * 1024))
    parser.feed(b"SEND\ndestination:/queue/a\ncontent-length:4000000\n\n")
    assert parser.next_event() is None
    for _ in range(200_000):
        parser.feed(b"x")
    assert parser.next_event() is None
    # Gathered into a few arrays, not one object per piece.
    parts = parser._parts
    assert parts is not None
    assert len(parts) < 20
    parser.feed(b"x" * 3_800_000 + b"\0")
    frame = parser.next_event()
    assert isinstance(frame, Frame)
    assert type(frame.body) is bytes
    assert len(frame.body) == 4_000_000
