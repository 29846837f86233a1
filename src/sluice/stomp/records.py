"""The body of a range block: many messages of one topic in one MESSAGE frame, by column.

A reader of a topic's log (the Spark source) asks for a range of offsets with a SUBSCRIBE that
carries `x-range-end` (see `docs/spark.md`, "How offsets are read"); the broker answers with one
MESSAGE whose body is a block of the messages it keeps in that range, laid out so that the reader
turns it into Arrow arrays without a Python step per message: every variable-length column is an
Arrow binary layout (int32 offsets, then the bytes).

Layout, little endian:

```
magic       4 bytes  b"SLR1"
count       u32      messages in the block (n)
entries     u32      header entries of all messages together (e)
offset      n x i64  the messages' offsets (sequences), ascending
timestamp   n x i64  milliseconds since the epoch
message_id  (n+1) x i32 offsets, then the UTF-8 bytes
headers     (n+1) x i32 offsets into the entries (message i has entries [o[i], o[i+1]))
keys        (e+1) x i32 offsets, then the UTF-8 bytes
values      (e+1) x i32 offsets, then the UTF-8 bytes
body        (n+1) x i32 offsets, then the bytes
```

The header entries of a message are those a MESSAGE frame would carry beyond its own columns:
`expires` and `priority` when not the defaults, `persistent:true`, then the user's headers;
unescaped. A decoder checks every length against the block's size before it slices (see
`sluice.spark.blocks`). This module has no dependency beyond the standard library.

The same layout carries many messages the other way, from a writer (the Spark sink) to the
broker: a SEND inside a transaction with `x-records-block` whose body is a block; `offset`,
`timestamp` and `message_id` are then ignored (zeros and empty), and `decode_records` gives the
broker each message's headers and body.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Any, Protocol

__all__ = [
    "BLOCK_FEATURES",
    "BLOCK_MAGIC",
    "HEADER_BYTES",
    "RANGE_READS_FEATURE",
    "RECORDS_BLOCKS_FEATURE",
    "BlockFormatError",
    "BlockRecord",
    "decode_records",
    "encode_block",
]

BLOCK_MAGIC = b"SLR1"
# A broker that has range reads and records blocks says so in CONNECTED's `server` header, as a
# comment after its name and version (STOMP's `name/version (comment)`): a writer must not send
# a records block to a broker that would store it as one message.
RANGE_READS_FEATURE = "range-reads"
RECORDS_BLOCKS_FEATURE = "records-blocks"
BLOCK_FEATURES = f"({RANGE_READS_FEATURE} {RECORDS_BLOCKS_FEATURE})"
HEADER_BYTES = 12
_DEFAULT_PRIORITY = 4
_SWAP = sys.byteorder != "little"


class BlockRecord(Protocol):
    """What a block needs of a message (the core's `Message` has it)."""

    seq: int
    timestamp_ms: int
    message_id: str
    headers: dict[str, str]
    body: bytes
    expires_ms: int
    priority: int
    persistent: bool


def _little(values: array[int]) -> bytes:
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def encode_block(messages: Sequence[BlockRecord]) -> list[bytes]:
    """The block of `messages` as a list of byte strings to write one after the other."""
    count = len(messages)
    seqs = array("q", bytes(8 * count))
    stamps = array("q", bytes(8 * count))
    id_parts: list[bytes] = []
    entry_offsets = array("i", [0])
    entries = 0
    keys: list[bytes] = []
    values: list[bytes] = []
    bodies: list[bytes] = []
    # Bound once: this loop runs per message on the broker's event loop.
    add_key, add_value, add_id, add_body = (
        keys.append,
        values.append,
        id_parts.append,
        bodies.append,
    )
    for i, message in enumerate(messages):
        seqs[i] = message.seq
        stamps[i] = message.timestamp_ms
        add_id(message.message_id.encode())
        if message.expires_ms:
            add_key(b"expires")
            add_value(b"%d" % message.expires_ms)
        if message.priority != _DEFAULT_PRIORITY:
            add_key(b"priority")
            add_value(b"%d" % message.priority)
        if message.persistent:
            add_key(b"persistent")
            add_value(b"true")
        for key, value in message.headers.items():
            add_key(key.encode())
            add_value(value.encode())
        entries = len(keys)
        entry_offsets.append(entries)
        add_body(message.body)
    head = BLOCK_MAGIC + count.to_bytes(4, "little") + entries.to_bytes(4, "little")
    return [
        head,
        _little(seqs),
        _little(stamps),
        _little(_running_total(id_parts)),
        *id_parts,
        _little(entry_offsets),
        _little(_running_total(keys)),
        *keys,
        _little(_running_total(values)),
        *values,
        _little(_running_total(bodies)),
        *bodies,
    ]


def _running_total(parts: list[bytes]) -> array[int]:
    """`len(parts) + 1` int32 offsets: 0, then the running total of the parts' lengths."""
    return array("i", [0, *accumulate(map(len, parts))])


class BlockFormatError(ValueError):
    """A block whose lengths or offsets do not fit its size (the peer sent bad bytes)."""


def _offsets(view: memoryview, at: int, count: int, typecode: str, what: str) -> tuple[int, Any]:
    width = 8 if typecode == "q" else 4
    end = at + width * count
    if end > len(view):
        raise BlockFormatError(f"block cut short in its {what}")
    values = array(typecode)
    values.frombytes(view[at:end])
    if _SWAP:
        values.byteswap()
    return end, values


def _column(view: memoryview, at: int, count: int, what: str) -> tuple[int, Any, memoryview]:
    """(next position, `count + 1` offsets checked ascending from 0, the bytes they index)."""
    at, offsets = _offsets(view, at, count + 1, "i", what)
    if offsets[0] != 0 or any(a > b for a, b in pairwise(offsets)):
        raise BlockFormatError(f"block's {what} offsets do not ascend from 0")
    end = at + offsets[-1]
    if end > len(view):
        raise BlockFormatError(f"block cut short in its {what}")
    return end, offsets, view[at:end]


def decode_records(body: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The (headers, body) of each message of a block (offsets, timestamps and message ids are
    ignored: what a writer sends). Raises `BlockFormatError` for anything that does not fit."""
    view = memoryview(body)
    if len(view) < HEADER_BYTES or bytes(view[:4]) != BLOCK_MAGIC:
        raise BlockFormatError("not a records block (wrong magic)")
    count = int.from_bytes(view[4:8], "little")
    entries = int.from_bytes(view[8:12], "little")
    at = HEADER_BYTES + 16 * count  # offsets and timestamps: unused here
    if at > len(view):
        raise BlockFormatError("block cut short in its offsets")
    at, _, _ = _column(view, at, count, "message ids")
    at, entry_offsets = _offsets(view, at, count + 1, "i", "header offsets")
    if (
        entry_offsets[0] != 0
        or entry_offsets[-1] != entries
        or any(a > b for a, b in pairwise(entry_offsets))
    ):
        raise BlockFormatError("block's header offsets do not ascend from 0 to its entries")
    at, key_offsets, keys = _column(view, at, entries, "header keys")
    at, value_offsets, values = _column(view, at, entries, "header values")
    at, body_offsets, bodies = _column(view, at, count, "bodies")
    if at != len(view):
        raise BlockFormatError("block has bytes past its last column")
    try:
        names = [str(keys[a:b], "utf-8") for a, b in pairwise(key_offsets)]
        texts = [str(values[a:b], "utf-8") for a, b in pairwise(value_offsets)]
    except UnicodeDecodeError:
        raise BlockFormatError("block has a header that is not UTF-8") from None
    out = []
    for i in range(count):
        first, last = entry_offsets[i], entry_offsets[i + 1]
        headers = dict(zip(names[first:last], texts[first:last], strict=True))
        out.append((headers, bytes(bodies[body_offsets[i] : body_offsets[i + 1]])))
    return out
