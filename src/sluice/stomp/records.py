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
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Protocol

__all__ = ["BLOCK_MAGIC", "HEADER_BYTES", "BlockRecord", "encode_block"]

BLOCK_MAGIC = b"SLR1"
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
    id_offsets = array("i", [0])
    id_parts: list[bytes] = []
    id_total = 0
    entry_offsets = array("i", [0])
    entries = 0
    key_offsets = array("i", [0])
    key_parts: list[bytes] = []
    key_total = 0
    value_offsets = array("i", [0])
    value_parts: list[bytes] = []
    value_total = 0
    body_offsets = array("i", [0])
    body_parts: list[bytes] = []
    body_total = 0
    for i, message in enumerate(messages):
        seqs[i] = message.seq
        stamps[i] = message.timestamp_ms
        mid = message.message_id.encode()
        id_total += len(mid)
        id_parts.append(mid)
        id_offsets.append(id_total)
        headers = message.headers
        if message.expires_ms or message.priority != _DEFAULT_PRIORITY or message.persistent:
            extra: dict[str, str] = {}
            if message.expires_ms:
                extra["expires"] = str(message.expires_ms)
            if message.priority != _DEFAULT_PRIORITY:
                extra["priority"] = str(message.priority)
            if message.persistent:
                extra["persistent"] = "true"
            headers = {**extra, **headers} if headers else extra
        for key, value in headers.items():
            k = key.encode()
            v = value.encode()
            key_total += len(k)
            value_total += len(v)
            key_parts.append(k)
            value_parts.append(v)
            key_offsets.append(key_total)
            value_offsets.append(value_total)
        entries += len(headers)
        entry_offsets.append(entries)
        body = message.body
        body_total += len(body)
        body_parts.append(body)
        body_offsets.append(body_total)
    head = BLOCK_MAGIC + count.to_bytes(4, "little") + entries.to_bytes(4, "little")
    return [
        head,
        _little(seqs),
        _little(stamps),
        _little(id_offsets),
        *id_parts,
        _little(entry_offsets),
        _little(key_offsets),
        *key_parts,
        _little(value_offsets),
        *value_parts,
        _little(body_offsets),
        *body_parts,
    ]
