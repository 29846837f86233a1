"""Range blocks (`sluice.stomp.records`) turned into Arrow record batches of the topic schema.

The block's columns are Arrow layouts already, so a batch is made of slices of the received body
(no Python step per message). Every length is checked against the body's size before anything is
sliced, and the arrays are validated in full (offsets in order and in bounds, UTF-8 text) before
the batch is handed out: a malformed block is a `BlockError`, never a crash or a wrong row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import ClientError, SluiceError
from sluice.spark.offsets import OffsetRange, offsets_from_receipt
from sluice.spark.options import SourceOptions
from sluice.spark.schema import TOPIC_ARROW_SCHEMA
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command
from sluice.stomp.records import BLOCK_MAGIC, HEADER_BYTES

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_COUNT",
    "BlockError",
    "DataLossError",
    "RangeReadsUnsupported",
    "decode_block",
    "read_blocks",
]

# The reader's logger, whichever way it reads (docs/spark.md names it).
logger = logging.getLogger("sluice.spark.fetch")

# What one range block may hold (the broker caps both too).
BLOCK_COUNT = 16_384
BLOCK_BYTES = 4 * 1024 * 1024
# How long a reader waits before asking again for offsets the broker does not show yet (being
# written); after `timeoutMs` without progress they count as lost.
_RETRY_S = 0.05
_NEXT_HEADER = "x-range-next"

_TIMESTAMP = TOPIC_ARROW_SCHEMA.field("timestamp").type
_HEADERS = TOPIC_ARROW_SCHEMA.field("headers").type


class BlockError(ClientError):
    """A range block that does not follow its layout."""


class DataLossError(SluiceError):
    """Offsets a query needs are no longer kept by the broker (and `failOnDataLoss` is on)."""


class RangeReadsUnsupported(ClientError):
    """The broker answered a range read as a plain subscription: it has no range reads."""


class _Cursor:
    """Takes consecutive pieces of a buffer, each checked against what is left."""

    def __init__(self, data: Any, size: int) -> None:
        self.data = data
        self.size = size
        self.at = HEADER_BYTES

    def take(self, nbytes: int, what: str) -> Any:
        if nbytes < 0 or self.at + nbytes > self.size:
            raise BlockError(f"range block cut short in its {what} ({nbytes} bytes wanted)")
        piece = self.data.slice(self.at, nbytes)
        self.at += nbytes
        return piece

    def binary(self, count: int, what: str, kind: Any) -> Any:
        """An Arrow binary or string array: `count + 1` int32 offsets, then the bytes."""
        offsets = self.take(4 * (count + 1), what)
        last = int.from_bytes(self.data[self.at - 4 : self.at].to_pybytes(), "little", signed=True)
        values = self.take(last, what)
        return pa.Array.from_buffers(kind, count, [None, offsets, values]), offsets


def decode_block(body: bytes, topic: str) -> tuple[Any, int]:
    """(the record batch of a block's messages, read from `topic`, the number of messages)."""
    try:
        return _decode(body, topic)
    except pa.ArrowInvalid as exc:
        raise BlockError(f"malformed range block: {exc}") from None


def _decode(body: bytes, topic: str) -> tuple[Any, int]:
    size = len(body)
    if size < HEADER_BYTES or body[:4] != BLOCK_MAGIC:
        raise BlockError("not a range block (wrong magic): is the broker a Sluice broker?")
    count = int.from_bytes(body[4:8], "little")
    entries = int.from_bytes(body[8:12], "little")
    data = pa.py_buffer(body)
    cursor = _Cursor(data, size)
    offsets = pa.Array.from_buffers(pa.int64(), count, [None, cursor.take(8 * count, "offsets")])
    stamps_ms = pa.Array.from_buffers(
        pa.int64(), count, [None, cursor.take(8 * count, "timestamps")]
    )
    message_ids, _ = cursor.binary(count, "message ids", pa.string())
    entry_offsets = cursor.take(4 * (count + 1), "header offsets")
    keys, _ = cursor.binary(entries, "header keys", pa.string())
    values, _ = cursor.binary(entries, "header values", pa.string())
    bodies, _ = cursor.binary(count, "bodies", pa.binary())
    if cursor.at != size:
        raise BlockError(f"range block has {size - cursor.at} bytes past its last column")
    headers = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), count + 1, [None, entry_offsets]), keys, values
    )
    for array in (offsets, stamps_ms, message_ids, keys, values, bodies, headers):
        array.validate(full=True)
    timestamps = pc.multiply(stamps_ms, 1000).cast(_TIMESTAMP)
    batch = pa.RecordBatch.from_arrays(
        [
            offsets,
            pa.array([topic] * count, type=pa.string()),
            message_ids,
            timestamps,
            headers.cast(_HEADERS),
            bodies,
        ],
        schema=TOPIC_ARROW_SCHEMA,
    )
    return batch, count


def read_blocks(
    session: WireSession, options: SourceOptions, offsets: OffsetRange
) -> Iterator[Any]:
    """Yield the messages of `offsets` as record batches, one range block at a time.

    The next block is asked for as soon as a block's headers are in, before it is decoded, so
    the broker builds one while the task decodes the other. Loss is checked on every block
    against the offsets the topic keeps; offsets the broker skips (expired messages) are holes.
    """
    topic = offsets.topic
    position, end = offsets.start, offsets.end
    holes = lost = requests = 0
    last_progress = time.monotonic()

    def ask(start: int) -> str:
        nonlocal requests
        requests += 1
        sub_id = f"block-{requests}"
        session.send(
            Command.SUBSCRIBE,
            {
                "destination": topic,
                "id": sub_id,
                "x-offset": str(start),
                "x-range-end": str(end),
                "x-range-max-count": str(BLOCK_COUNT),
                "x-range-max-bytes": str(BLOCK_BYTES),
            },
        )
        session.flush()
        return sub_id

    def lose(start: int, stop: int, why: str) -> None:
        nonlocal lost
        message = f"offsets {start} to {stop - 1} of {topic} are lost: {why}"
        if options.fail_on_data_loss:
            raise DataLossError(message + " (set failOnDataLoss=false to skip them)")
        logger.warning("%s; skipped, as failOnDataLoss=false", message)
        lost += stop - start

    pending = ask(position) if position < end else None
    while pending is not None:
        frame = session.receive()
        headers = frame.headers
        if headers.get("subscription") != pending:
            continue
        raw_next = headers.get(_NEXT_HEADER)
        if raw_next is None:
            raise RangeReadsUnsupported(f"no {_NEXT_HEADER} on the answer to a range read")
        kept = offsets_from_receipt(headers, topic)
        block_start = position
        next_offset = min(max(int(raw_next), position), end)
        if kept.first > position:
            upto = min(kept.first, end)
            lose(position, upto, f"the topic keeps offsets from {kept.first} on")
            next_offset = max(next_offset, upto)
        if kept.last < end - 1 and next_offset > kept.last:
            lose(
                next_offset,
                end,
                f"the topic's last offset is {kept.last}: was the topic deleted or the broker's "
                "store replaced?",
            )
            next_offset = end
        position = next_offset
        pending = None
        if position < end:
            if position > block_start:
                last_progress = time.monotonic()
                pending = ask(position)
            elif time.monotonic() - last_progress >= options.timeout_s:
                lose(
                    position,
                    end,
                    f"no message came for {options.timeout_s:.0f} s (timeoutMs="
                    f"{options.timeout_ms}); they expired or the broker is stuck",
                )
                position = end
            else:
                time.sleep(_RETRY_S)  # the offsets are being written: ask again shortly
                pending = ask(position)
        batch, count = decode_block(frame.body, topic)
        skipped = position - block_start - count
        if skipped > 0 and kept.first <= block_start:
            holes += skipped
        if count:
            yield batch
    if holes:
        logger.info(
            "%s offsets %d to %d: %d were not delivered (expired messages)",
            topic,
            offsets.start,
            offsets.end - 1,
            holes,
        )
