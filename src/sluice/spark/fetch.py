"""Reading exactly one offset range of a topic: what `read()` of the `sluice` source runs.

By default the range is read in range blocks (`sluice.spark.blocks`, option `fetch=blocks`).
This module is the frame by frame way (`fetch=frames`, and any broker without range reads):

The task subscribes at the range's first offset (`x-offset`), with `client` (cumulative) acks and
a credit of `prefetch` messages and `_PREFETCH_BYTES` bytes, so the broker never has more than
that on its way to a task that Spark keeps busy elsewhere. It acknowledges every half credit and
stops at the range's end. Messages come in offset order; each is checked against the range:

- the SUBSCRIBE receipt says which offsets the topic still keeps. If the range starts before the
  first one, retention dropped what the query needs: that is data loss, and `failOnDataLoss`
  decides between `DataLossError` and a logged skip. Once subscribed, the broker keeps everything
  from the subscription's cursor on, so no loss can happen while reading;
- offsets the broker skips inside the range (messages that expired) are holes, not loss: logged;
- a range whose end the broker does not reach (its last offsets expired, or the broker is slow)
  is settled by asking where the cursor stands: after `_IDLE_PROBE_S` without a message the task
  unsubscribes with a receipt, which carries the cursor (`x-next-offset`), and subscribes again
  from there. With no message and no progress for `timeoutMs`, the rest is reported as lost.

Rows are gathered into Arrow record batches of at most `BATCH_ROWS` rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from sluice.spark.blocks import DataLossError, read_blocks
from sluice.spark.offsets import (
    NEXT_OFFSET_HEADER,
    OffsetRange,
    offsets_from_receipt,
    open_session,
)
from sluice.spark.options import FETCH_BLOCKS, SCHEMA_KAFKA, SourceOptions
from sluice.spark.schema import TOPIC_ARROW_SCHEMA, kafka_batch, timestamps_from_text
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command
from sluice.stomp.records import RANGE_READS_FEATURE

__all__ = ["BATCH_ROWS", "DataLossError", "read_range"]

logger = logging.getLogger(__name__)

BATCH_ROWS = 8192
# Byte credit of a reading subscription: below the broker's write-buffer mark, so a task that is
# slow to come back for more is never taken for a slow consumer.
_PREFETCH_BYTES = 512 * 1024
# Silence after which a reader asks the broker where its cursor stands.
_IDLE_PROBE_S = 1.0
# MESSAGE headers that are columns of their own or belong to one delivery.
_NOT_HEADERS = frozenset(
    {
        "destination",
        "message-id",
        "timestamp",
        "x-offset",
        "content-length",
        "subscription",
        "ack",
        "x-delivery-count",
        "redelivered",
    }
)


_HEADERS_TYPE = TOPIC_ARROW_SCHEMA.field("headers").type


def read_range(
    options: SourceOptions, offsets: OffsetRange, *, batch_rows: int = BATCH_ROWS
) -> Iterator[Any]:
    """Yield the messages of `offsets` as Arrow record batches of the topic schema (Kafka's
    columns with option `schema=kafka`)."""
    if not len(offsets):
        return
    with open_session(options) as session:
        if options.fetch == FETCH_BLOCKS and session.has_feature(RANGE_READS_FEATURE):
            yield from _kafka(options, offsets, read_blocks(session, options, offsets))
            return
        if options.fetch == FETCH_BLOCKS:
            logger.info("%s has no range reads: reading frame by frame", session.label)
        batches = _RangeReader(session, options, offsets, batch_rows).batches()
        yield from _kafka(options, offsets, batches)


def _kafka(options: SourceOptions, offsets: OffsetRange, batches: Iterator[Any]) -> Iterator[Any]:
    """`batches`, in Kafka's columns with option `schema=kafka`."""
    if options.schema != SCHEMA_KAFKA:
        yield from batches
        return
    name = offsets.topic.removeprefix("/topic/")
    for batch in batches:
        yield kafka_batch(batch, name)


class _RangeReader:
    """The state of one range being read: where it stands and the rows not yet handed out."""

    def __init__(
        self, session: WireSession, options: SourceOptions, offsets: OffsetRange, batch_rows: int
    ) -> None:
        self.session = session
        self.options = options
        self.topic = offsets.topic
        self.start = offsets.start
        self.position = offsets.start
        self.end = offsets.end
        self.batch_rows = batch_rows
        self.holes = 0
        self.lost = 0
        self._subscriptions = 0
        self._last_progress = time.monotonic()
        self._clear()

    def _clear(self) -> None:
        # Column lists; the destination is the topic for every row.
        self.offsets: list[int] = []
        self.message_ids: list[str | None] = []
        self.timestamps: list[str | None] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []

    def _batch(self) -> Any:
        count = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.offsets, type=pa.int64()),
                pa.array([self.topic] * count, type=pa.string()),
                pa.array(self.message_ids, type=pa.string()),
                timestamps_from_text(self.timestamps),
                pa.array(self.headers, type=_HEADERS_TYPE),
                pa.array(self.bodies, type=pa.binary()),
            ],
            schema=TOPIC_ARROW_SCHEMA,
        )
        self._clear()
        return batch

    def batches(self) -> Iterator[Any]:
        """Read the range, yielding full batches as they fill and the rest at the end."""
        while self.position < self.end:
            sub_id = self._subscribe()
            if sub_id is None:
                break
            yield from self._consume(sub_id)
        if self.offsets:
            yield self._batch()
        if self.holes:
            logger.info(
                "%s offsets %d to %d: %d were not delivered (expired messages)",
                self.topic,
                self.start,
                self.end - 1,
                self.holes,
            )

    def _subscribe(self) -> str | None:
        """Subscribe at the current position; None when nothing is left to read."""
        self._subscriptions += 1
        sub_id = f"range-{self._subscriptions}"
        receipt = self.session.request(
            Command.SUBSCRIBE,
            {
                "destination": self.topic,
                "id": sub_id,
                "ack": "client",
                "activemq.prefetchSize": str(self.options.prefetch),
                "x-prefetch-bytes": str(_PREFETCH_BYTES),
                "x-offset": str(self.position),
            },
        )
        kept = offsets_from_receipt(receipt, self.topic)
        if kept.first > self.position:
            upto = min(kept.first, self.end)
            self._lose(self.position, upto, f"the topic keeps offsets from {kept.first} on")
            self.position = upto
        if kept.last < self.end - 1:
            # Offsets planned from an earlier report that the broker does not have at all.
            start = max(self.position, kept.last + 1)
            self._lose(
                start,
                self.end,
                f"the topic's last offset is {kept.last}: was the topic deleted or the "
                "broker's store replaced?",
            )
            self.end = start
        if self.position >= self.end:
            return None
        return sub_id

    def _lose(self, start: int, stop: int, why: str) -> None:
        """Offsets `start` to `stop - 1` cannot be read: raise, or log and count them."""
        message = f"offsets {start} to {stop - 1} of {self.topic} are lost: {why}"
        if self.options.fail_on_data_loss:
            raise DataLossError(message + " (set failOnDataLoss=false to skip them)")
        logger.warning("%s; skipped, as failOnDataLoss=false", message)
        self.lost += stop - start

    def _consume(self, sub_id: str) -> Iterator[Any]:
        """Take messages of subscription `sub_id` until the range ends or the broker is silent."""
        session = self.session
        options = self.options
        end = self.end
        ack_every = max(1, options.prefetch // 2)
        ack_bytes = _PREFETCH_BYTES // 2
        unacked = 0
        unacked_bytes = 0
        offsets = self.offsets
        position = self.position
        session.set_timeout(_IDLE_PROBE_S)
        try:
            while position < end:
                try:
                    frame = session.receive()
                except TimeoutError:
                    if position > self.position:
                        # Messages came until a moment ago: the silence starts now.
                        self._last_progress = time.monotonic()
                    self.position = position
                    self._settle_idle(sub_id)
                    return
                headers = frame.headers
                if headers.get("subscription") != sub_id:
                    continue  # a straggler of an earlier subscription of this range
                offset = int(headers["x-offset"])
                if offset < position:
                    continue
                if offset >= end:
                    position = end
                    break
                if offset > position:
                    self.holes += offset - position
                    logger.debug("%s: offsets %d to %d skipped", self.topic, position, offset - 1)
                body = frame.body
                offsets.append(offset)
                self.message_ids.append(headers.get("message-id"))
                self.timestamps.append(headers.get("timestamp"))
                self.headers.append({k: v for k, v in headers.items() if k not in _NOT_HEADERS})
                self.bodies.append(body)
                position = offset + 1
                unacked += 1
                unacked_bytes += len(body)
                if unacked >= ack_every or unacked_bytes >= ack_bytes:
                    session.send(Command.ACK, {"id": headers["ack"]})
                    session.flush()
                    unacked = 0
                    unacked_bytes = 0
                if len(offsets) >= self.batch_rows:
                    self.position = position
                    self._last_progress = time.monotonic()
                    yield self._batch()
                    offsets = self.offsets
        finally:
            session.set_timeout(options.timeout_s)
        self.position = position
        self._last_progress = time.monotonic()

    def _settle_idle(self, sub_id: str) -> None:
        """No message for a while: learn where the cursor stands, then resubscribe from there."""
        session = self.session
        receipt = session.request(Command.UNSUBSCRIBE, {"id": sub_id})
        # What the broker sent before the receipt is in the session's buffer: take it first.
        stragglers = session.take_messages()
        for frame in stragglers:
            if frame.headers.get("subscription") == sub_id:
                self._take(frame)
        cursor = receipt.get(NEXT_OFFSET_HEADER)
        if cursor is not None and cursor.isdigit() and int(cursor) > self.position:
            skipped_to = min(int(cursor), self.end)
            self.holes += skipped_to - self.position
            self.position = skipped_to
            self._last_progress = time.monotonic()
            return
        if stragglers:
            self._last_progress = time.monotonic()
        silent_s = time.monotonic() - self._last_progress
        if silent_s >= self.options.timeout_s:
            self._lose(
                self.position,
                self.end,
                f"no message came for {silent_s:.0f} s (timeoutMs={self.options.timeout_ms}); "
                "they expired or the broker is stuck",
            )
            self.position = self.end

    def _take(self, frame: Any) -> None:
        headers = frame.headers
        offset = int(headers["x-offset"])
        if offset < self.position or offset >= self.end:
            return
        if offset > self.position:
            self.holes += offset - self.position
        self.offsets.append(offset)
        self.message_ids.append(headers.get("message-id"))
        self.timestamps.append(headers.get("timestamp"))
        self.headers.append({k: v for k, v in headers.items() if k not in _NOT_HEADERS})
        self.bodies.append(frame.body)
        self.position = offset + 1
