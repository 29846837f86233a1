"""Sending one Spark task's rows to the broker inside one transaction, without duplicates.

Every message carries an `x-dedup-id` made of the write's id, the batch, the partition and the
row's index in the partition: the same rows written again (a retried task, a batch replayed after
a restart) carry the same ids, and the broker drops a SEND whose id it saw within its dedup window
for that destination (`limits.dedup_window`, default 10,000 ids per destination). Ids are
registered when the transaction commits, so an aborted attempt leaves nothing behind and a
committed one makes any later copy a duplicate. A row that brings its own `x-dedup-id` header
keeps it.

The window holds the last ids committed to a destination, so a transaction with more rows for
one destination than the window evicts its own first ids as it commits, and a retry would send
those rows again. Such a transaction is refused before its COMMIT: at the first row beyond
`dedup_window` (the `dedupWindow` option, which must not exceed the broker's setting: the broker
does not report it) `send_transaction` raises `DedupWindowExceeded` and drops the connection,
and the broker discards the open transaction, so none of its rows is delivered.

Sends are pipelined without receipts; the COMMIT's receipt says the whole transaction is in (on
disk, for persistent messages). A connection lost before that receipt fails the task: the broker
aborted the transaction or committed it, and in both cases Spark's retry is safe.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sluice.errors import LimitExceeded
from sluice.spark.options import SEND_BLOCKS, OptionError, SinkOptions
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command
from sluice.stomp.records import RECORDS_BLOCKS_FEATURE, encode_block

# What one records block holds at most (the broker's max frame size bounds it too).
BLOCK_ROWS = 4096
BLOCK_BYTES = 4 * 1024 * 1024
_RECORDS_HEADER = "x-records-block"

__all__ = [
    "DEDUP_HEADER",
    "DEDUP_WINDOW_OPTION",
    "DedupWindowExceeded",
    "TaskResult",
    "dedup_prefix",
    "send_transaction",
]

logger = logging.getLogger(__name__)

DEDUP_HEADER = "x-dedup-id"
# Headers a row may not set: the broker or the transaction owns them.
_RESERVED = frozenset(
    {
        "destination",
        "transaction",
        "receipt",
        "content-length",
        "message-id",
        "subscription",
        "ack",
        "x-offset",
        "timestamp",
        "x-delivery-count",
        "redelivered",
    }
)

DEDUP_WINDOW_OPTION = "dedupWindow"


class DedupWindowExceeded(LimitExceeded):
    """One transaction has more rows for a destination than the broker's dedup window covers."""

    def __init__(self, window: int, destination: str, prefix: str) -> None:
        super().__init__(
            DEDUP_WINDOW_OPTION,
            window,
            f"the task writing {prefix}* has more than {window} rows for {destination}, and the "
            f"broker remembers the last {window} dedup ids of a destination "
            "(limits.dedup_window): a retry could send its first rows again. Nothing of it was "
            "committed. Spread the rows over more partitions (repartition), or raise the "
            "broker's limits.dedup_window and this option together",
        )
        self.destination = destination


OutgoingRow = tuple[str | None, Mapping[str, object] | None, bytes | str | None]
"""A row to send: (destination or None for the default, headers or None, body)."""


@dataclass
class TaskResult:
    """What one task sent: rows per destination."""

    rows: int = 0
    per_destination: Counter[str] = field(default_factory=Counter)


def dedup_prefix(write_id: str, batch: str | int, partition: int) -> str:
    """The part of a dedup id shared by the rows of one task: `write:batch:partition:`."""
    return f"{write_id}:{batch}:{partition}:"


def send_transaction(options: SinkOptions, rows: Iterable[OutgoingRow], prefix: str) -> TaskResult:
    """Send `rows` in one transaction, row `i` with dedup id `prefix + str(i)`; commit."""
    result = TaskResult()
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        return result
    default_destination = options.destination
    persistent = options.persistent
    window = options.dedup_window
    counts = result.per_destination
    with WireSession.open(
        options.broker,
        login=options.login,
        passcode=options.passcode,
        timeout_s=options.timeout_s,
        tls=options.tls,
    ) as session:
        tx = f"spark-{secrets.token_hex(6)}"
        session.send(Command.BEGIN, {"transaction": tx})
        blocks = None
        if options.send == SEND_BLOCKS:
            if session.has_feature(RECORDS_BLOCKS_FEATURE):
                blocks = _Blocks(session, tx, persistent)
            else:
                # An older broker would store a block as one message: send row by row.
                logger.info("%s has no records blocks: one SEND per row", session.label)
        index = 0
        row: OutgoingRow | None = first
        while row is not None:
            destination, extra, body = row
            destination = destination or default_destination
            if destination is None:
                raise OptionError(
                    f"row {index} has no destination: give a destination column or the "
                    "destination option"
                )
            sent_there = counts[destination]
            if sent_there >= window:
                # Raised inside the session: it is dropped, and the broker aborts the transaction.
                raise DedupWindowExceeded(window, destination, prefix)
            headers: dict[str, str] = {}
            if extra:
                for key, value in extra.items():
                    if value is not None and key not in _RESERVED:
                        headers[key] = value if isinstance(value, str) else str(value)
            if DEDUP_HEADER not in headers:
                headers[DEDUP_HEADER] = prefix + str(index)
            if body is None:
                data = b""
            elif isinstance(body, str):
                data = body.encode("utf-8")
            else:
                data = bytes(body)
            if blocks is not None:
                blocks.add(destination, headers, data)
            else:
                headers["destination"] = destination
                headers["transaction"] = tx
                if persistent:
                    headers["persistent"] = "true"
                session.send(Command.SEND, headers, data)
            counts[destination] = sent_there + 1
            index += 1
            row = next(iterator, None)
        if blocks is not None:
            blocks.flush()
        session.request(Command.COMMIT, {"transaction": tx})
    result.rows = index
    logger.debug("transaction %s committed %d rows (%s...)", tx, index, prefix)
    return result


class _Record:
    """One row as a block holds it: headers and body (the rest is the broker's)."""

    __slots__ = ("body", "headers")
    seq = 0
    timestamp_ms = 0
    message_id = ""
    expires_ms = 0
    priority = 4
    persistent = False

    def __init__(self, headers: dict[str, str], body: bytes) -> None:
        self.headers = headers
        self.body = body


class _Blocks:
    """Rows gathered into records blocks (`sluice.stomp.records`), one SEND per block: a block
    holds consecutive rows for one destination, up to `BLOCK_ROWS` rows or `BLOCK_BYTES`."""

    def __init__(self, session: WireSession, tx: str, persistent: bool) -> None:
        self.session = session
        self.headers = {"transaction": tx, _RECORDS_HEADER: "1"}
        if persistent:
            self.headers["persistent"] = "true"
        self.destination: str | None = None
        self.rows: list[_Record] = []
        self.nbytes = 0

    def add(self, destination: str, headers: dict[str, str], body: bytes) -> None:
        if destination != self.destination or len(self.rows) >= BLOCK_ROWS:
            self.flush()
            self.destination = destination
        self.rows.append(_Record(headers, body))
        self.nbytes += len(body)
        if self.nbytes >= BLOCK_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.rows or self.destination is None:
            return
        body = b"".join(encode_block(self.rows))
        self.session.send(Command.SEND, {**self.headers, "destination": self.destination}, body)
        self.rows = []
        self.nbytes = 0
