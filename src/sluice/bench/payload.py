"""Message bodies of the load generator: who sent it, its sequence and when.

A body is a fixed 32-byte head followed by filler up to the requested size:

    offset  size  field
    0       4     magic `sb1` and a flags byte: 0 for a message, 1 for an end marker
    4       4     producer id, unsigned, big-endian
    8       8     sequence number within the producer
    16      8     time the message was sent, `time.monotonic_ns()`
    24      8     time the message was meant to be sent (equal to the above unless the producer
                  follows a timetable, see the latency scenario)

`time.monotonic_ns()` reads CLOCK_MONOTONIC, which on Linux is one clock for every process on the
machine, so a consumer in another process can subtract a producer's timestamp. The filler is fixed,
so a consumer can check the whole body, not only its head.

An end marker (flags 1) has the same layout and size. A producer sends one after its last
message: on a FIFO queue (and on a topic, per producer) a consumer that receives it has been
given everything the broker held ahead of it. Its sequence field carries a token that tells one
marker from another (0 for a producer's end marker).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "CHECK_PRODUCER",
    "HEAD_BYTES",
    "HEAD_STRUCT",
    "MAGIC",
    "MARKER_MAGIC",
    "BodyError",
    "BodyHead",
    "decode_body",
    "encode_body",
    "encode_head",
    "encode_marker",
    "filler",
]

MAGIC = b"sb1\x00"
MARKER_MAGIC = b"sb1\x01"
# The producer id of the marker the emptiness check sends, beyond any real producer.
CHECK_PRODUCER = 0xFFFFFFFF
_HEAD = struct.Struct(">4sIQQQ")
# The head's layout, for callers that pack and unpack it on their hot path.
HEAD_STRUCT = _HEAD
HEAD_BYTES = _HEAD.size
_FILLER_PATTERN = b"sluice-bench-payload-"


class BodyError(ValueError):
    """A received body is not one the load generator sent (wrong size, magic or filler)."""


@dataclass(frozen=True, slots=True)
class BodyHead:
    """The decoded head of a body."""

    producer: int
    seq: int
    sent_ns: int
    intended_ns: int


def filler(size: int) -> bytes:
    """The bytes that follow the head in a body of `size` bytes."""
    if size < HEAD_BYTES:
        raise ValueError(f"a body needs at least {HEAD_BYTES} bytes, got {size}")
    length = size - HEAD_BYTES
    repeats = length // len(_FILLER_PATTERN) + 1
    return (_FILLER_PATTERN * repeats)[:length]


def encode_head(producer: int, seq: int, sent_ns: int, intended_ns: int | None = None) -> bytes:
    """The 32-byte head; `intended_ns` defaults to `sent_ns`."""
    return _HEAD.pack(
        MAGIC, producer, seq, sent_ns, sent_ns if intended_ns is None else intended_ns
    )


def encode_body(
    producer: int, seq: int, sent_ns: int, size: int, intended_ns: int | None = None
) -> bytes:
    """A whole body of `size` bytes."""
    return encode_head(producer, seq, sent_ns, intended_ns) + filler(size)


def encode_marker(producer: int, token: int, sent_ns: int, size: int) -> bytes:
    """An end marker of `size` bytes (at least `HEAD_BYTES`)."""
    return _HEAD.pack(MARKER_MAGIC, producer, token, sent_ns, sent_ns) + filler(size)


def decode_body(body: bytes, size: int, expected_filler: bytes | None = None) -> BodyHead:
    """Decode and check a body; raises `BodyError` if it is not exactly what was sent.

    `expected_filler` is `filler(size)`; pass it to avoid rebuilding it for every message.
    """
    if len(body) != size:
        raise BodyError(f"body of {len(body)} bytes, expected {size}")
    magic, producer, seq, sent_ns, intended_ns = _HEAD.unpack_from(body)
    if magic != MAGIC:
        raise BodyError(f"bad magic {magic!r}")
    tail = filler(size) if expected_filler is None else expected_filler
    if body[HEAD_BYTES:] != tail:
        raise BodyError("filler does not match")
    return BodyHead(producer, seq, sent_ns, intended_ns)
