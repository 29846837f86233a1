"""What recovery does to damaged journal bytes, and how it says what was there.

- A torn tail (the newest file, nothing valid after it) is zeroed: it was never acknowledged.
- With repair, a damaged stretch elsewhere is first copied to `damaged/db-<n>.log.<offset>` under
  the data directory, then overwritten with one PADDING record of the same size (or zeroed, when
  no valid record follows it), so the journal reads cleanly from then on and the next start needs
  no repair. A damaged file header is rewritten.
- `describe` reads what a damaged stretch seems to hold, record by record without trusting the
  checksums, so the report can name the destinations, sequences and message ids involved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sluice.store.journal import format as fmt
from sluice.store.journal.files import fsync_dir
from sluice.store.journal.scan import Damage

DAMAGED_DIR = "damaged"
# Records listed per damaged stretch in a report; the rest are counted.
MAX_LISTED_RECORDS = 20
_TEXT_LIMIT = 120
_ZEROS = bytes(1024 * 1024)


@dataclass(frozen=True, slots=True)
class SeenRecord:
    """A record read from damaged bytes without checking its checksum."""

    offset: int
    rtype: int
    destination: str | None = None
    seq: int = 0
    txno: int = 0
    message_id: str | None = None
    text: str = ""


def _short(text: str) -> str:
    return repr(text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "...")


def _read_one(offset: int, rtype: int, payload: memoryview) -> SeenRecord:
    name = fmt.RecordType(rtype).name
    if rtype == fmt.RecordType.ADD:
        try:
            message, meta = fmt.decode_add(payload)
        except fmt.FormatError:
            try:
                meta = fmt.decode_add_meta(payload)
            except fmt.FormatError:
                return SeenRecord(offset, rtype, text="ADD (unreadable)")
            return SeenRecord(offset, rtype, meta.destination, meta.seq, meta.txno, None)
        return SeenRecord(offset, rtype, meta.destination, meta.seq, meta.txno, message.message_id)
    try:
        record = fmt.decode(rtype, payload)
    except fmt.FormatError:
        return SeenRecord(offset, rtype, text=f"{name} (unreadable)")
    destination = getattr(record, "destination", None)
    seq = getattr(record, "seq", 0) or getattr(record, "upto_seq", 0)
    return SeenRecord(offset, rtype, destination, seq, getattr(record, "txno", 0), text=name)


def describe(data: bytes, start: int, end: int) -> tuple[list[SeenRecord], int]:
    """The records the bytes [start, end) seem to hold, read header by header while the headers
    make sense, and how many bytes at the end could not be read that way."""
    seen: list[SeenRecord] = []
    pos = start
    view = memoryview(data)
    while end - pos >= fmt.HEADER_BYTES:
        length, _crc, rtype = fmt.HEADER.unpack_from(data, pos)
        stop = pos + fmt.HEADER_BYTES + length
        if rtype not in fmt.VALID_TYPES or stop > end:
            break
        seen.append(_read_one(pos, rtype, view[pos + fmt.HEADER_BYTES : stop]))
        pos = stop
    return seen, end - pos


def message_line(destination: str, seq: int, message_id: str | None, txno: int = 0) -> str:
    """How a report names one lost message."""
    mid = _short(message_id) if message_id is not None else "unreadable"
    where = f"seq {seq}" if seq else f"in transaction {txno}"
    return f"lost message: destination {_short(destination)} {where} message-id {mid}"


def record_line(record: SeenRecord, *, effect_kept: bool) -> str:
    """How a report names a damaged record that is not a lost message."""
    what = record.text or fmt.RecordType(record.rtype).name
    if record.destination is not None:
        what += f" destination {_short(record.destination)}"
        if record.seq:
            what += f" seq {record.seq}"
    if record.txno:
        what += f" transaction {record.txno}"
    tail = "its effect is kept by the index" if effect_kept else "its effect is lost"
    return f"damaged record at offset {record.offset}: {what} ({tail})"


def save_and_pad(data_dir: Path, path: Path, data: bytes, damage: Damage) -> Path | None:
    """Copy the damaged bytes aside, then overwrite them: with a PADDING record of their size
    when a valid record follows, with zeros when nothing valid does (the data then ends where
    the damage starts). Returns the copy's path, or None (nothing changed) when the stretch
    cannot hold a PADDING record."""
    end = damage.resume if damage.resume is not None else damage.end
    span = end - damage.offset
    pad = damage.resume is not None
    if pad and (span < fmt.HEADER_BYTES or span - fmt.HEADER_BYTES > fmt.MAX_PAYLOAD_BYTES):
        return None
    keep_dir = data_dir / DAMAGED_DIR
    keep_dir.mkdir(exist_ok=True)
    copy = keep_dir / f"{path.name}.{damage.offset}"
    with open(copy, "wb") as f:
        f.write(data[damage.offset : end])
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(keep_dir)
    fd = os.open(path, os.O_RDWR)
    try:
        pos = damage.offset + (fmt.HEADER_BYTES if pad else 0)
        while pos < end:
            pos += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - pos)], pos)
        if pad:
            os.pwrite(fd, fmt.padding_header(span), damage.offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return copy


def cut_tail(path: Path, damage: Damage) -> int:
    """Zero a torn tail; returns the bytes dropped."""
    dropped = damage.end - damage.offset
    if dropped > 0:
        fd = os.open(path, os.O_RDWR)
        try:
            pos = damage.offset
            while pos < damage.end:
                pos += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), damage.end - pos)], pos)
            os.fsync(fd)
        finally:
            os.close(fd)
    return dropped


def rewrite_header(path: Path, file_no: int, store_id: bytes) -> None:
    """Write a fresh header record at the start of a data file."""
    header = fmt.encode_file_header(file_no, store_id, 0)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
