"""Reading a data file record by record, finding where its data ends and where it is damaged.

The scanner does not decide what damage means; recovery does (a torn tail of the newest file is cut
off, anything else stops the start unless repair is on). It reports, for every damaged stretch,
where the next valid record starts, if any (`Damage.resume`), by scanning forward for a header whose
length, checksum and payload all check out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import CorruptionError
from sluice.store.api import StoredMessage
from sluice.store.journal import format as fmt

_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A record whose checksum and layout are valid. `payload` views the file's bytes."""

    offset: int
    rtype: int
    payload: memoryview
    length: int  # the whole record, header included


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes from `offset` that are not a valid record, up to `resume` (the next valid record),
    or to the end of the file's non-zero bytes when `resume` is None."""

    offset: int
    resume: int | None
    end: int
    reason: str

    @property
    def dropped_bytes(self) -> int:
        """How many bytes this damage covers."""
        return (self.resume if self.resume is not None else self.end) - self.offset


def first_nonzero(data: bytes, start: int) -> int:
    """Offset of the first non-zero byte at or after `start`, or len(data)."""
    pos = start
    size = len(data)
    while pos < size:
        chunk = data[pos : pos + _CHUNK]
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return pos + len(chunk) - len(stripped)
        pos += len(chunk)
    return size


def last_nonzero_end(data: bytes, start: int) -> int:
    """One past the last non-zero byte at or after `start` (or `start`)."""
    end = len(data)
    while end > start:
        lo = max(start, end - _CHUNK)
        stripped = data[lo:end].rstrip(b"\0")
        if stripped:
            return lo + len(stripped)
        end = lo
    return start


def check_record(data: bytes, offset: int, *, layout: bool = True) -> tuple[int, int, str]:
    """Validate the record at `offset`: (type, whole length, "") or (0, 0, reason). Without
    `layout` the payload is only checksummed (its reader decodes it anyway)."""
    size = len(data)
    if size - offset < fmt.HEADER_BYTES:
        return 0, 0, "truncated record header"
    length, crc, rtype = fmt.HEADER.unpack_from(data, offset)
    if rtype not in fmt.VALID_TYPES:
        return 0, 0, f"invalid record type {rtype}"
    if length > fmt.MAX_PAYLOAD_BYTES or length > size - offset - fmt.HEADER_BYTES:
        return 0, 0, f"record length {length} runs past the end of the file"
    start = offset + fmt.HEADER_BYTES
    view = memoryview(data)[start : start + length]
    if fmt.payload_crc(rtype, view) != crc:
        return 0, 0, "checksum mismatch"
    if not layout:
        return rtype, fmt.HEADER_BYTES + length, ""
    try:
        if rtype == fmt.RecordType.ADD:
            fmt.decode_add(view)
        else:
            fmt.decode(rtype, view)
    except fmt.FormatError as exc:
        return 0, 0, f"malformed {fmt.RecordType(rtype).name} record: {exc}"
    return rtype, fmt.HEADER_BYTES + length, ""


def resync(data: bytes, start: int) -> int | None:
    """Offset of the next valid record at or after `start`, or None."""
    size = len(data)
    pos = start
    type_at = fmt.HEADER_BYTES - 1
    while pos + fmt.HEADER_BYTES <= size:
        if data[pos + type_at] == 0:
            # No record has type 0: skip the whole zero run under the type byte.
            pos = max(pos + 1, first_nonzero(data, pos + type_at) - type_at)
            continue
        rtype, _, _ = check_record(data, pos)
        if rtype:
            return pos
        pos += 1
    return None


class FileScan:
    """Iterate the records of one file from `start`; afterwards `end_offset` is where valid
    data ends (where a writer would append) and `damages` lists what was not valid."""

    def __init__(self, path: Path, start: int = 0) -> None:
        self.path = path
        self.start = start
        with open(path, "rb") as f:
            self.data = f.read()
        self.end_offset = start
        self.damages: list[Damage] = []

    @property
    def size(self) -> int:
        """Bytes in the file."""
        return len(self.data)

    def __iter__(self) -> Iterator[ScannedRecord | Damage]:
        data = self.data
        size = len(data)
        view = memoryview(data)
        pos = self.start
        while pos < size:
            if size - pos >= fmt.HEADER_BYTES and not any(data[pos : pos + fmt.HEADER_BYTES]):
                nonzero = first_nonzero(data, pos)
                if nonzero == size:
                    break  # the preallocated zero tail: not damage
                damage = self._damage(pos, nonzero, "data after the end-of-data mark")
            else:
                rtype, length, reason = check_record(data, pos, layout=False)
                if rtype:
                    start = pos + fmt.HEADER_BYTES
                    yield ScannedRecord(pos, rtype, view[start : pos + length], length)
                    pos += length
                    self.end_offset = pos
                    continue
                if size - pos < fmt.HEADER_BYTES and not any(data[pos:]):
                    break
                damage = self._damage(pos, pos + 1, reason)
            self.damages.append(damage)
            yield damage
            if damage.resume is None:
                break
            pos = damage.resume
            self.end_offset = pos

    def _damage(self, offset: int, search_from: int, reason: str) -> Damage:
        resume = resync(self.data, search_from)
        end = last_nonzero_end(self.data, offset) if resume is None else resume
        return Damage(offset, resume, max(end, offset), reason)


def parse_add(data: bytes, path: str, offset: int, length: int) -> StoredMessage:
    """The message in an ADD record read back by location; damage raises `CorruptionError`."""
    if len(data) != length or len(data) < fmt.HEADER_BYTES:
        raise CorruptionError("message record is truncated", path, offset)
    payload_length, crc, rtype = fmt.HEADER.unpack_from(data, 0)
    payload = memoryview(data)[fmt.HEADER_BYTES :]
    if (
        rtype != fmt.RecordType.ADD
        or payload_length != len(payload)
        or fmt.payload_crc(rtype, payload) != crc
    ):
        raise CorruptionError("message record is damaged", path, offset)
    try:
        message, _ = fmt.decode_add(payload)
    except fmt.FormatError as exc:
        raise CorruptionError(f"message record is malformed: {exc}", path, offset) from exc
    return message
