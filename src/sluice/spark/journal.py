"""Reading journal and archive files offline: one row per record, no broker needed.

A data directory holds `journal/db-<n>.log` (the live files, preallocated with zeros) and, when
archiving is on, `archive/db-<n>.log` (retired files, cut to their data). File numbers are unique
for the life of a store, so sorting by number orders every record ever written.

Each file is mapped into memory and walked record by record with the layout of
`sluice.store.journal.format`: length, checksum, type, payload. An all-zero header ends the data.
A record that does not check out is damage: the reader looks for the next valid record after it;
if there is none, it was the torn tail of a file being written (logged, not an error); if there is
one, the damaged stretch becomes a `DAMAGED` row (or `CorruptionError` with `failOnCorruption`).

Columns, by record type (`sequence` and `transaction` are null when the record has none):

- `ADD`: destination, sequence (null for a transacted add: its TX_COMMIT assigns it), message id,
  timestamp, headers (the message's, plus `persistent`, `priority`, `expires` as a MESSAGE carries
  them), body, transaction;
- `REMOVE`: destination, sequence, transaction; `REMOVE_RANGE`: destination, sequence = up to;
- `TX_BEGIN` (headers `txid`), `TX_COMMIT` (headers `sequences`, comma-separated, in add
  order), `TX_ABORT`: transaction;
- `SUB_PUT`: destination, sequence = cursor, headers `client_id`, `name`, `selector`;
  `SUB_CURSOR`: sequence = cursor, headers `client_id`, `name`; `SUB_DELETE`: headers;
- `DEST_DELETE`: destination; `DISPATCH_MARK`: destination, sequence;
  `DEST_STATE`: destination, sequence = last sequence, headers `dispatch_mark`, `dedup_ids` (count);
- `CHECKPOINT`: timestamp, headers `file_no`, `offset`; `FILE_HEADER`: timestamp (created),
  headers `file_no`, `store_id`, `version`;
- `DAMAGED`: position, headers `reason`, `length`.
"""

from __future__ import annotations

import logging
import mmap
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sluice.errors import CorruptionError
from sluice.spark.schema import JOURNAL_ARROW_SCHEMA, timestamps_us
from sluice.store.journal import format as fmt
from sluice.store.journal import scan

__all__ = ["JournalFile", "journal_files", "read_journal_file"]

logger = logging.getLogger(__name__)

BATCH_ROWS = 8192
_NAME = re.compile(r"^db-([1-9][0-9]*)\.log$")
_SUBDIRS = ("archive", "journal")
_DEFAULT_PRIORITY = 4
_HEADER_BYTES = fmt.HEADER_BYTES
_ADD = int(fmt.RecordType.ADD)
_TYPE_NAMES = {int(t): t.name for t in fmt.RecordType}
_HEADERS_TYPE = JOURNAL_ARROW_SCHEMA.field("headers").type


@dataclass(frozen=True, slots=True)
class JournalFile:
    """One data file: its number, where it is, and the name rows show (`journal/db-3.log`)."""

    number: int
    path: str
    name: str


def journal_files(root: str | Path) -> list[JournalFile]:
    """The data files under `root`, by number: a data directory (its `archive/` and `journal/`),
    a directory of `db-<n>.log` files, or one file."""
    base = Path(root)
    if base.is_file():
        match = _NAME.match(base.name)
        return [JournalFile(int(match.group(1)) if match else 0, str(base), base.name)]
    if not base.is_dir():
        raise FileNotFoundError(f"no journal at {base}")
    found: list[JournalFile] = []
    for directory, prefix in [(base / sub, f"{sub}/") for sub in _SUBDIRS] + [(base, "")]:
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            match = _NAME.match(entry.name)
            if match and entry.is_file():
                found.append(JournalFile(int(match.group(1)), str(entry), prefix + entry.name))
    found.sort(key=lambda f: (f.number, f.name))
    return found


class _Columns:
    """Rows gathered column by column until they make a record batch."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.clear()

    def clear(self) -> None:
        self.positions: list[int] = []
        self.types: list[str] = []
        self.destinations: list[str | None] = []
        self.sequences: list[int | None] = []
        self.message_ids: list[str | None] = []
        self.timestamps: list[int | None] = []
        self.headers: list[dict[str, str] | None] = []
        self.bodies: list[bytes | None] = []
        self.transactions: list[int | None] = []

    def __len__(self) -> int:
        return len(self.positions)

    def add(
        self,
        position: int,
        rtype: str,
        *,
        destination: str | None = None,
        sequence: int | None = None,
        message_id: str | None = None,
        timestamp_ms: int | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        transaction: int | None = None,
    ) -> None:
        self.positions.append(position)
        self.types.append(rtype)
        self.destinations.append(destination)
        self.sequences.append(sequence)
        self.message_ids.append(message_id)
        self.timestamps.append(timestamp_ms)
        self.headers.append(headers)
        self.bodies.append(body)
        self.transactions.append(transaction)

    def batch(self) -> Any:
        count = len(self.positions)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.name] * count, type=pa.string()),
                pa.array(self.positions, type=pa.int64()),
                pa.array(self.types, type=pa.string()),
                pa.array(self.destinations, type=pa.string()),
                pa.array(self.sequences, type=pa.int64()),
                pa.array(self.message_ids, type=pa.string()),
                timestamps_us(self.timestamps),
                pa.array(self.headers, type=_HEADERS_TYPE),
                pa.array(self.bodies, type=pa.binary()),
                pa.array(self.transactions, type=pa.int64()),
            ],
            schema=JOURNAL_ARROW_SCHEMA,
        )
        self.clear()
        return batch


def _pairs(values: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in values.items() if v is not None}


def _decode_into(columns: _Columns | None, position: int, rtype: int, payload: Any) -> None:
    """Decode one record's payload and add its row to `columns` (only check it when None).
    One branch per record type, each filling the same columns."""
    if rtype == _ADD:
        message, meta = fmt.decode_add(payload)
        if columns is None:
            return
        headers = message.headers
        if message.persistent:
            headers["persistent"] = "true"
        if message.priority != _DEFAULT_PRIORITY:
            headers["priority"] = str(message.priority)
        if message.expires_ms:
            headers["expires"] = str(message.expires_ms)
        columns.add(
            position,
            "ADD",
            destination=message.destination,
            sequence=message.seq or None,
            message_id=message.message_id,
            timestamp_ms=message.timestamp_ms,
            headers=headers,
            body=message.body,
            transaction=meta.txno or None,
        )
        return
    record = fmt.decode(rtype, payload)
    if columns is None:
        return
    name = _TYPE_NAMES[rtype]
    add = columns.add
    if isinstance(record, fmt.Remove):
        add(
            position,
            name,
            destination=record.destination,
            sequence=record.seq,
            transaction=record.txno or None,
        )
    elif isinstance(record, fmt.RemoveRange):
        add(position, name, destination=record.destination, sequence=record.upto_seq)
    elif isinstance(record, fmt.TxBegin):
        add(position, name, headers={"txid": record.txid}, transaction=record.txno)
    elif isinstance(record, fmt.TxCommit):
        sequences = ",".join(map(str, record.seqs))
        add(position, name, headers={"sequences": sequences}, transaction=record.txno)
    elif isinstance(record, fmt.TxAbort):
        add(position, name, transaction=record.txno)
    elif isinstance(record, fmt.SubPut):
        fields = {"client_id": record.client_id, "name": record.name, "selector": record.selector}
        add(
            position,
            name,
            destination=record.destination,
            sequence=record.cursor,
            headers=_pairs(fields),
        )
    elif isinstance(record, fmt.SubCursor):
        fields = {"client_id": record.client_id, "name": record.name}
        add(position, name, sequence=record.cursor, headers=_pairs(fields))
    elif isinstance(record, fmt.SubDelete):
        add(position, name, headers={"client_id": record.client_id, "name": record.name})
    elif isinstance(record, fmt.DestDelete):
        add(position, name, destination=record.destination)
    elif isinstance(record, fmt.DispatchMark):
        add(position, name, destination=record.destination, sequence=record.seq)
    elif isinstance(record, fmt.DestState):
        fields = {
            "dispatch_mark": str(record.dispatch_mark),
            "dedup_ids": str(len(record.dedup_ids)),
        }
        add(
            position,
            name,
            destination=record.destination,
            sequence=record.last_seq,
            headers=_pairs(fields),
        )
    elif isinstance(record, fmt.Checkpoint):
        fields = {"file_no": str(record.file_no), "offset": str(record.offset)}
        add(position, name, timestamp_ms=record.time_ms, headers=_pairs(fields))
    elif isinstance(record, fmt.FileHeader):
        fields = {
            "file_no": str(record.file_no),
            "store_id": record.store_id.hex(),
            "version": str(record.version),
        }
        add(position, name, timestamp_ms=record.created_ms, headers=_pairs(fields))
    else:
        add(position, name)


def read_journal_file(
    journal_file: JournalFile, *, fail_on_corruption: bool = False, batch_rows: int = BATCH_ROWS
) -> Iterator[Any]:
    """Yield the records of one data file as Arrow record batches of the journal schema."""
    columns = _Columns(journal_file.name)
    with open(journal_file.path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            pos = 0
            while 0 <= pos < size:
                if size - pos < _HEADER_BYTES or not any(data[pos : pos + _HEADER_BYTES]):
                    nonzero = scan.first_nonzero(data, pos)
                    if nonzero == size:
                        break  # the zero tail of a preallocated file
                    reason = "data after the end-of-data mark"
                    pos = _damage(
                        columns, journal_file, data, pos, nonzero, reason, fail_on_corruption
                    )
                    continue
                rtype, length, reason = scan.check_record(data, pos, layout=False)
                if rtype:
                    try:
                        _decode_into(columns, pos, rtype, data[pos + _HEADER_BYTES : pos + length])
                    except fmt.FormatError as exc:
                        reason = f"malformed {_TYPE_NAMES[rtype]} record: {exc}"
                    else:
                        pos += length
                        if len(columns) >= batch_rows:
                            yield columns.batch()
                        continue
                pos = _damage(columns, journal_file, data, pos, pos + 1, reason, fail_on_corruption)
    if len(columns):
        yield columns.batch()


def _damage(
    columns: _Columns,
    journal_file: JournalFile,
    data: Any,
    pos: int,
    search_from: int,
    reason: str,
    fail: bool,
) -> int:
    """Handle bytes at `pos` that are not a record; return where to go on (-1: stop)."""
    resume = scan.resync(data, search_from)
    if resume is None:
        # Nothing valid follows: the tail of a file whose last write was cut short.
        logger.info(
            "%s: %s at offset %d and no valid record after it: a torn tail, ignored",
            journal_file.name,
            reason,
            pos,
        )
        return -1
    if fail:
        raise CorruptionError(f"damaged journal data ({reason})", journal_file.path, pos)
    logger.warning(
        "%s: %d damaged bytes at offset %d (%s)", journal_file.name, resume - pos, pos, reason
    )
    columns.add(pos, "DAMAGED", headers={"reason": reason, "length": str(resume - pos)})
    return resume
