"""Reading a data file record by record, finding where its data ends and where it is damaged.

The scanner does not decide what damage means; recovery does (a torn tail of the newest file is cut
off, anything else stops the start unless repair is on). It reports, for every damaged stretch,
where the next valid record starts, if any (`Damage.resume`), by scanning forward for a header whose
length, checksum and payload all check out.
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import CorruptionError
from sluice.store.api import StoredMessage
from sluice.store.journal import format as fmt

_CHUNK = 1024 * 1024

# What the checks read: a file's bytes, or the file mapped (the offline reader maps it).
Data = bytes | mmap.mmap


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


def first_nonzero(data: Data, start: int) -> int:
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


def last_nonzero_end(data: Data, start: int) -> int:
    """One past the last non-zero byte at or after `start` (or `start`)."""
    end = len(data)
    while end > start:
        lo = max(start, end - _CHUNK)
        stripped = data[lo:end].rstrip(b"\0")
        if stripped:
            return lo + len(stripped)
        end = lo
    return start


def check_record(data: Data, offset: int, *, layout: bool = True) -> tuple[int, int, str]:
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


# Resync looks for candidates a window at a time, so its scratch memory stays bounded.
_WINDOW = 1024 * 1024
# A candidate whose next header is implausible is still checked when this small: a valid record
# followed by another damaged one must not be lost, and checking a small one costs little.
_SMALL_RECORD_BYTES = 64 * 1024
_TYPE_MASK = bytes(1 if b in fmt.VALID_TYPES else 0 for b in range(256))
_HIGH_MASKS = [
    bytes(1 if b <= hi else 0 for b in range(256))
    for hi in range((fmt.MAX_PAYLOAD_BYTES >> 24) + 1)
]


def _candidates(data: Data, start: int) -> Iterator[int]:
    """Offsets at or after `start` whose type byte is a record type and whose length's high byte
    allows a length within the record bound and the file: found with bulk byte operations, so
    a long stretch of damage costs a few passes in C rather than a Python step per byte."""
    size = len(data)
    high = _HIGH_MASKS[min(fmt.MAX_PAYLOAD_BYTES, size) >> 24]
    last = size - fmt.HEADER_BYTES  # the last offset where a header fits
    pos = start
    while pos <= last:
        end = min(last, pos + _WINDOW - 1)
        count = end - pos + 1
        types = data[pos + fmt.HEADER_BYTES - 1 : pos + fmt.HEADER_BYTES - 1 + count]
        highs = data[pos + 3 : pos + 3 + count]
        both = int.from_bytes(types.translate(_TYPE_MASK), "little") & int.from_bytes(
            highs.translate(high), "little"
        )
        if both:
            hits = both.to_bytes(count, "little")
            i = hits.find(1)
            while i >= 0:
                yield pos + i
                i = hits.find(1, i + 1)
        pos = end + 1


def _plausible_next(data: Data, offset: int) -> bool:
    """Whether what follows a record ending at `offset` could be the file's next thing: the end
    of the file, zero fill (the end-of-data mark) or a header with a known type and a length
    that fits."""
    size = len(data)
    left = size - offset
    if left < fmt.HEADER_BYTES:
        return not any(data[offset:])
    length, crc, rtype = fmt.HEADER.unpack_from(data, offset)
    if rtype == 0:
        return bool(length == 0 and crc == 0)
    return rtype in fmt.VALID_TYPES and length <= min(
        fmt.MAX_PAYLOAD_BYTES, left - fmt.HEADER_BYTES
    )


def _layout_ok(rtype: int, payload: memoryview) -> bool:
    try:
        if rtype == fmt.RecordType.ADD:
            fmt.decode_add(payload)
        else:
            fmt.decode(rtype, payload)
    except fmt.FormatError:
        return False
    return True


def resync(data: Data, start: int) -> int | None:
    """Offset of the next valid record at or after `start`, or None.

    Candidates are filtered cheapest first: a known type byte and a length within the record
    bound and the file (in bulk, `_candidates`), a plausible next header or zero fill after it
    (or a small record), a payload that follows its type's layout; only then the checksum."""
    size = len(data)
    view = memoryview(data)
    for pos in _candidates(data, start):
        length, crc, rtype = fmt.HEADER.unpack_from(data, pos)
        payload_start = pos + fmt.HEADER_BYTES
        end = payload_start + length
        if length > fmt.MAX_PAYLOAD_BYTES or end > size:
            continue
        if length > _SMALL_RECORD_BYTES and not _plausible_next(data, end):
            continue
        payload = view[payload_start:end]
        if not _layout_ok(rtype, payload):
            continue
        if fmt.payload_crc(rtype, payload) == crc:
            return pos
    return None


def _valid_run(data: Data, pos: int, stop: int) -> int:
    """Step over valid records (checksums only) from `pos` while they start before `stop`;
    returns where that ends. The tight loop of a start that verifies the whole journal."""
    size = len(data)
    view = memoryview(data)
    unpack = fmt.HEADER.unpack_from
    crc32 = zlib.crc32
    seeds = fmt.TYPE_CRC_SEEDS
    limit = fmt.MAX_PAYLOAD_BYTES
    header = fmt.HEADER_BYTES
    while pos < stop and size - pos >= header:
        length, crc, rtype = unpack(data, pos)
        seed = seeds.get(rtype)
        end = pos + header + length
        if seed is None or length > limit or end > size:
            break
        if crc32(view[pos + header : end], seed) != crc:
            break
        pos = end
    return pos


class FileScan:
    """Iterate the records of one file from `start`; afterwards `end_offset` is where valid
    data ends (where a writer would append) and `damages` lists what was not valid.

    With `records_from`, records that start before it are only checked, not yielded (damage
    is yielded wherever it is); the file header record is always yielded."""

    def __init__(self, path: Path, start: int = 0, *, records_from: int = 0) -> None:
        self.path = path
        self.start = start
        self.records_from = records_from
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
            if 0 < pos < self.records_from:
                pos = self.end_offset = _valid_run(data, pos, self.records_from)
                if pos >= self.records_from or pos >= size:
                    continue
            if size - pos >= fmt.HEADER_BYTES and not any(data[pos : pos + fmt.HEADER_BYTES]):
                nonzero = first_nonzero(data, pos)
                if nonzero == size:
                    break  # the preallocated zero tail: not damage
                # A record's type byte is never zero, but its first bytes may be.
                search_from = max(pos + 1, nonzero - fmt.HEADER_BYTES + 1)
                damage = self._damage(pos, search_from, "data after the end-of-data mark")
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


def parse_add(
    data: bytes | memoryview,
    path: str,
    offset: int,
    length: int,
    *,
    destination: str | None = None,
    seq: int = 0,
) -> StoredMessage:
    """The message in an ADD record read back by location; damage raises `CorruptionError`, and
    so does a record of another message than `destination`/`seq` when they are given (a
    transacted add carries sequence 0: its commit assigned the sequence)."""
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
    if destination is not None and (
        message.destination != destination or message.seq not in (0, seq)
    ):
        raise CorruptionError("the index points at another message's record", path, offset)
    return message
