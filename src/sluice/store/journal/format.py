"""The journal's on-disk format: record framing and the payload of every record type.

Everything is little endian. `docs/store-format.md` is the full specification; in brief:

Files are `journal/db-<n>.log`, n = 1, 2, 3... (decimal, no padding), preallocated with zeros.

Record (9-byte header, then the payload):

    offset 0  u32  length   payload bytes that follow the header (not counting the header)
    offset 4  u32  crc32    zlib.crc32 over the type byte and the payload
    offset 8  u8   type     RecordType; 0 never occurs, so an all-zero header marks the end
    offset 9  ...  payload  `length` bytes, layout by type (below)

Strings are UTF-8 with a length prefix: `str16` = u16 length + bytes, `str32` = u32 length + bytes.

    1  FILE_HEADER    magic 8s "SLUICEJL" | version u16 | file_no u32 | store_id 16s |
                      created_ms u64
    2  ADD            flags u8 (1 persistent, 2 compaction copy) | priority u8 | txno u64 |
                      ordinal u32 | seq u64 | timestamp_ms u64 | expires_ms u64 | size u32 |
                      destination str16 | message_id str16 | dedup_id str16 | header_count u32 |
                      header_count x (key str32, value str32) | body_length u32 | body
    3  REMOVE         txno u64 | seq u64 | destination str16
    4  REMOVE_RANGE   upto_seq u64 | destination str16
    5  TX_BEGIN       txno u64 | txid str16
    6  TX_COMMIT      txno u64 | count u32 | count x seq u64      (seqs in add order)
    7  TX_ABORT       txno u64
    8  SUB_PUT        cursor u64 | has_selector u8 | client_id str16 | name str16 |
                      destination str16 | selector str32
    9  SUB_DELETE     client_id str16 | name str16
    10 SUB_CURSOR     cursor u64 | client_id str16 | name str16
    11 DEST_DELETE    destination str16
    12 DISPATCH_MARK  seq u64 | destination str16
    13 DEST_STATE     last_seq u64 | dispatch_mark u64 | id_count u32 | destination str16 |
                      id_count x dedup_id str16
    14 CHECKPOINT     file_no u32 | offset u64 | time_ms u64
    15 DEST_SEQ       seq u64 | destination str16   (last sequence is at least seq)
    16 PADDING        zeros: bytes a repair overwrote (damaged records it skipped)
    17 FILES_RETIRED  count u32 | count x (first u32, last u32)   (every data file number
                      collected so far, as inclusive ranges; the newest such record counts)

`txno` 0 means "not transacted". Transaction numbers are the store's own, unique for the life of
the journal; TX_BEGIN maps one to the client's transaction id for tools. Decoders check every
length against the bytes that remain before slicing, so a damaged length cannot make them allocate
or loop beyond the record it came from; the record length itself is checked by the scanner against
`MAX_PAYLOAD_BYTES` and the bytes left in the file.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.store.api import DEDUP_HEADER, StoredMessage
from sluice.store.journal.records import (
    FORMAT_VERSION,
    READABLE_VERSIONS,
    AddMeta,
    Checkpoint,
    DestDelete,
    DestSeq,
    DestState,
    DispatchMark,
    FileHeader,
    FilesRetired,
    FormatError,
    Padding,
    Record,
    RecordType,
    Remove,
    RemoveRange,
    SubCursor,
    SubDelete,
    SubPut,
    TxAbort,
    TxBegin,
    TxCommit,
)

# The record types live in `records`; they are part of this module's interface.
__all__ = [
    "FILE_HEADER_RECORD_BYTES",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_PAYLOAD_BYTES",
    "READABLE_VERSIONS",
    "TYPE_CRC_SEEDS",
    "VALID_TYPES",
    "AddMeta",
    "Checkpoint",
    "DestDelete",
    "DestSeq",
    "DestState",
    "DispatchMark",
    "FileHeader",
    "FilesRetired",
    "FormatError",
    "Padding",
    "Record",
    "RecordType",
    "Remove",
    "RemoveRange",
    "SubCursor",
    "SubDelete",
    "SubPut",
    "TxAbort",
    "TxBegin",
    "TxCommit",
    "decode",
    "decode_add",
    "decode_add_meta",
    "encode",
    "encode_add",
    "encode_file_header",
    "frame",
    "padding_header",
    "payload_crc",
    "record_bytes",
]

MAGIC = b"SLUICEJL"
HEADER = struct.Struct("<IIB")
HEADER_BYTES = HEADER.size  # 9
# A record is at most a 64 MiB frame plus its headers; anything far larger is damage.
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024

FLAG_PERSISTENT = 1
FLAG_COPY = 2

_FILE_HEADER = struct.Struct("<8sHI16sQ")
_ADD_PREFIX = struct.Struct("<BBQIQQQI")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U64_U64 = struct.Struct("<QQ")
_U64_U32 = struct.Struct("<QI")
_U64_U64_U32 = struct.Struct("<QQI")
_U32_U64_U64 = struct.Struct("<IQQ")
_U32_U32 = struct.Struct("<II")
_U64_U8 = struct.Struct("<QB")
_MAX_U16 = 0xFFFF
_MAX_U32 = 0xFFFF_FFFF
_MAX_U64 = 0xFFFF_FFFF_FFFF_FFFF


VALID_TYPES = frozenset(int(t) for t in RecordType)
# crc32 of the type byte alone, the seed of every record's checksum.
_TYPE_CRC = {int(t): zlib.crc32(bytes([int(t)])) for t in RecordType}
TYPE_CRC_SEEDS: Mapping[int, int] = _TYPE_CRC


# -- framing -----------------------------------------------------------------------------------


def frame(rtype: int, parts: Sequence[bytes]) -> tuple[bytes, int]:
    """The 9-byte header for a record whose payload is `parts` joined, and the record's size."""
    crc = _TYPE_CRC[rtype]
    length = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    if length > MAX_PAYLOAD_BYTES:
        raise FormatError(f"record payload of {length} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return HEADER.pack(length, crc, rtype), HEADER_BYTES + length


def record_bytes(rtype: int, payload: bytes) -> bytes:
    """One whole record as bytes (header and payload)."""
    header, _ = frame(rtype, (payload,))
    return header + payload


def payload_crc(rtype: int, payload: bytes | memoryview) -> int:
    """The checksum a record of this type and payload carries."""
    return zlib.crc32(payload, _TYPE_CRC[rtype])


# -- primitive readers -------------------------------------------------------------------------


class _Reader:
    """Bounded reads over one payload; every length is checked before it is used."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0
        self.end = len(self.buf)

    def fixed(self, st: struct.Struct) -> tuple[Any, ...]:
        if self.pos + st.size > self.end:
            raise FormatError(f"truncated payload at byte {self.pos}")
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def raw(self, length: int) -> memoryview:
        if length > self.end - self.pos:
            raise FormatError(f"length {length} at byte {self.pos} exceeds the payload")
        view = self.buf[self.pos : self.pos + length]
        self.pos += length
        return view

    def str16(self) -> str:
        (length,) = self.fixed(_U16)
        return self._text(length)

    def str32(self) -> str:
        (length,) = self.fixed(_U32)
        return self._text(length)

    def _text(self, length: int) -> str:
        try:
            return str(self.raw(length), "utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"invalid UTF-8 before byte {self.pos}") from exc

    def done(self) -> None:
        if self.pos != self.end:
            raise FormatError(f"{self.end - self.pos} trailing bytes in payload")


def _str16(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > _MAX_U16:
        raise FormatError(f"string of {len(data)} bytes is too long (max {_MAX_U16})")
    return _U16.pack(len(data)) + data


def _str32(text: str) -> bytes:
    data = text.encode("utf-8")
    return _U32.pack(len(data)) + data


def _check_u64(value: int, what: str) -> int:
    if not 0 <= value <= _MAX_U64:
        raise FormatError(f"{what} {value} out of range")
    return value


# -- ADD ---------------------------------------------------------------------------------------


def encode_add(
    message: StoredMessage, txno: int = 0, ordinal: int = 0, *, copy: bool = False
) -> tuple[bytes, bytes, AddMeta]:
    """Encode a message as an ADD payload: (everything before the body, the body, its meta).

    The body is returned apart so the writer can hand it to `writev` without copying it."""
    headers = message.headers
    dedup_id = headers.get(DEDUP_HEADER, "") if not copy else ""
    size = message.size
    if not 0 <= message.priority <= 255:
        raise FormatError(f"priority {message.priority} out of range")
    if len(message.body) > _MAX_U32 or size > _MAX_U32 or len(headers) > _MAX_U32:
        raise FormatError("message too large for the journal")
    flags = (FLAG_PERSISTENT if message.persistent else 0) | (FLAG_COPY if copy else 0)
    parts = [
        _ADD_PREFIX.pack(
            flags,
            message.priority,
            _check_u64(txno, "txno"),
            ordinal,
            _check_u64(message.seq, "seq"),
            _check_u64(message.timestamp_ms, "timestamp_ms"),
            _check_u64(message.expires_ms, "expires_ms"),
            size,
        ),
        _str16(message.destination),
        _str16(message.message_id),
        _str16(dedup_id),
        _U32.pack(len(headers)),
    ]
    for key, value in headers.items():
        parts.append(_str32(key))
        parts.append(_str32(value))
    parts.append(_U32.pack(len(message.body)))
    meta = AddMeta(
        destination=message.destination,
        seq=message.seq,
        txno=txno,
        ordinal=ordinal,
        size=size,
        timestamp_ms=message.timestamp_ms,
        dedup_id=dedup_id,
        copy=copy,
    )
    return b"".join(parts), bytes(message.body), meta


def decode_add_meta(payload: bytes | memoryview) -> AddMeta:
    """The index fields of an ADD payload, without decoding headers or copying the body."""
    end = len(payload)
    if end < _ADD_PREFIX.size:
        raise FormatError("truncated ADD payload")
    flags, _prio, txno, ordinal, seq, ts, _exp, size = _ADD_PREFIX.unpack_from(payload, 0)
    pos = _ADD_PREFIX.size
    texts = []
    for _ in range(3):  # destination, message id, dedup id
        if pos + 2 > end:
            raise FormatError("truncated ADD payload")
        length = payload[pos] | payload[pos + 1] << 8
        pos += 2
        if pos + length > end:
            raise FormatError(f"length {length} at byte {pos} exceeds the payload")
        texts.append(payload[pos : pos + length])
        pos += length
    try:
        destination = str(texts[0], "utf-8")
        dedup_id = str(texts[2], "utf-8") if texts[2] else ""
    except UnicodeDecodeError as exc:
        raise FormatError("invalid UTF-8 in ADD payload") from exc
    return AddMeta(destination, seq, txno, ordinal, size, ts, dedup_id, bool(flags & FLAG_COPY))


def decode_add(payload: bytes | memoryview) -> tuple[StoredMessage, AddMeta]:
    """A whole ADD payload: the message (with the sequence it was written with) and its meta."""
    r = _Reader(payload)
    flags, priority, txno, ordinal, seq, ts, expires, size = r.fixed(_ADD_PREFIX)
    destination = r.str16()
    message_id = r.str16()
    dedup_id = r.str16()
    (count,) = r.fixed(_U32)
    if count * 8 > r.end - r.pos:
        raise FormatError(f"header count {count} exceeds the payload")
    headers: dict[str, str] = {}
    for _ in range(count):
        key = r.str32()
        headers[key] = r.str32()
    (body_length,) = r.fixed(_U32)
    body = bytes(r.raw(body_length))
    r.done()
    message = StoredMessage(
        destination,
        seq,
        message_id,
        ts,
        headers,
        body,
        expires_ms=expires,
        priority=priority,
        persistent=bool(flags & FLAG_PERSISTENT),
    )
    meta = AddMeta(destination, seq, txno, ordinal, size, ts, dedup_id, bool(flags & FLAG_COPY))
    return message, meta


# -- the other records -------------------------------------------------------------------------


def encode(record: Record) -> tuple[int, bytes]:
    """Encode any record but ADD: (type, payload). One branch per record type, in the order of
    the layout table at the top; long because the table is."""
    if isinstance(record, Remove):
        return RecordType.REMOVE, _U64_U64.pack(
            record.txno, _check_u64(record.seq, "seq")
        ) + _str16(record.destination)
    if isinstance(record, RemoveRange):
        return RecordType.REMOVE_RANGE, _U64.pack(_check_u64(record.upto_seq, "seq")) + _str16(
            record.destination
        )
    if isinstance(record, TxBegin):
        return RecordType.TX_BEGIN, _U64.pack(record.txno) + _str16(record.txid)
    if isinstance(record, TxCommit):
        seqs = [_check_u64(s, "seq") for s in record.seqs]
        return RecordType.TX_COMMIT, _U64_U32.pack(record.txno, len(seqs)) + struct.pack(
            f"<{len(seqs)}Q", *seqs
        )
    if isinstance(record, TxAbort):
        return RecordType.TX_ABORT, _U64.pack(record.txno)
    if isinstance(record, SubPut):
        selector = record.selector
        return RecordType.SUB_PUT, b"".join(
            (
                _U64_U8.pack(_check_u64(record.cursor, "cursor"), selector is not None),
                _str16(record.client_id),
                _str16(record.name),
                _str16(record.destination),
                _str32(selector or ""),
            )
        )
    if isinstance(record, SubDelete):
        return RecordType.SUB_DELETE, _str16(record.client_id) + _str16(record.name)
    if isinstance(record, SubCursor):
        return RecordType.SUB_CURSOR, b"".join(
            (
                _U64.pack(_check_u64(record.cursor, "cursor")),
                _str16(record.client_id),
                _str16(record.name),
            )
        )
    if isinstance(record, DestDelete):
        return RecordType.DEST_DELETE, _str16(record.destination)
    if isinstance(record, DispatchMark):
        return RecordType.DISPATCH_MARK, _U64.pack(_check_u64(record.seq, "seq")) + _str16(
            record.destination
        )
    if isinstance(record, DestState):
        parts = [
            _U64_U64_U32.pack(
                _check_u64(record.last_seq, "seq"),
                _check_u64(record.dispatch_mark, "seq"),
                len(record.dedup_ids),
            ),
            _str16(record.destination),
        ]
        parts.extend(_str16(i) for i in record.dedup_ids)
        return RecordType.DEST_STATE, b"".join(parts)
    if isinstance(record, DestSeq):
        return RecordType.DEST_SEQ, _U64.pack(_check_u64(record.seq, "seq")) + _str16(
            record.destination
        )
    if isinstance(record, Checkpoint):
        return RecordType.CHECKPOINT, _U32_U64_U64.pack(
            record.file_no, record.offset, record.time_ms
        )
    if isinstance(record, FilesRetired):
        parts = [_U32.pack(len(record.ranges))]
        for first, last in record.ranges:
            if not 1 <= first <= last <= 0xFFFFFFFF:
                raise FormatError(f"bad retired file range {first}-{last}")
            parts.append(_U32_U32.pack(first, last))
        return RecordType.FILES_RETIRED, b"".join(parts)
    if isinstance(record, FileHeader):
        if len(record.store_id) != 16:
            raise FormatError("store id must be 16 bytes")
        return RecordType.FILE_HEADER, _FILE_HEADER.pack(
            MAGIC, record.version, record.file_no, record.store_id, record.created_ms
        )
    raise FormatError(f"cannot encode {type(record).__name__} here")


def decode(rtype: int, payload: bytes | memoryview) -> Record:
    """Decode a payload of the given type; ADD yields only its `AddMeta`. One branch per record
    type, as in `encode`."""
    if rtype == RecordType.ADD:
        return decode_add_meta(payload)
    r = _Reader(payload)
    record: Record
    if rtype == RecordType.REMOVE:
        txno, seq = r.fixed(_U64_U64)
        record = Remove(txno, r.str16(), seq)
    elif rtype == RecordType.REMOVE_RANGE:
        (upto,) = r.fixed(_U64)
        record = RemoveRange(r.str16(), upto)
    elif rtype == RecordType.TX_BEGIN:
        (txno,) = r.fixed(_U64)
        record = TxBegin(txno, r.str16())
    elif rtype == RecordType.TX_COMMIT:
        txno, count = r.fixed(_U64_U32)
        if count * 8 != r.end - r.pos:
            raise FormatError(f"commit of {count} sequences does not match the payload")
        record = TxCommit(txno, struct.unpack_from(f"<{count}Q", r.buf, r.pos))
        r.pos = r.end
    elif rtype == RecordType.TX_ABORT:
        (txno,) = r.fixed(_U64)
        record = TxAbort(txno)
    elif rtype == RecordType.SUB_PUT:
        cursor, has_selector = r.fixed(_U64_U8)
        client_id, name, destination = r.str16(), r.str16(), r.str16()
        selector = r.str32()
        record = SubPut(client_id, name, destination, selector if has_selector else None, cursor)
    elif rtype == RecordType.SUB_DELETE:
        record = SubDelete(r.str16(), r.str16())
    elif rtype == RecordType.SUB_CURSOR:
        (cursor,) = r.fixed(_U64)
        client_id = r.str16()
        record = SubCursor(client_id, r.str16(), cursor)
    elif rtype == RecordType.DEST_DELETE:
        record = DestDelete(r.str16())
    elif rtype == RecordType.DISPATCH_MARK:
        (seq,) = r.fixed(_U64)
        record = DispatchMark(r.str16(), seq)
    elif rtype == RecordType.DEST_STATE:
        last_seq, mark, count = r.fixed(_U64_U64_U32)
        destination = r.str16()
        if count * 2 > r.end - r.pos:
            raise FormatError(f"dedup id count {count} exceeds the payload")
        record = DestState(destination, last_seq, mark, tuple(r.str16() for _ in range(count)))
    elif rtype == RecordType.DEST_SEQ:
        (seq,) = r.fixed(_U64)
        record = DestSeq(r.str16(), seq)
    elif rtype == RecordType.CHECKPOINT:
        file_no, offset, time_ms = r.fixed(_U32_U64_U64)
        record = Checkpoint(file_no, offset, time_ms)
    elif rtype == RecordType.PADDING:
        if not _all_zero(r.buf):
            raise FormatError("padding holds non-zero bytes")
        record = Padding(r.end)
        r.pos = r.end
    elif rtype == RecordType.FILES_RETIRED:
        (count,) = r.fixed(_U32)
        if count * _U32_U32.size > r.end - r.pos:
            raise FormatError(f"retired range count {count} exceeds the payload")
        ranges = tuple((int(a), int(b)) for a, b in (r.fixed(_U32_U32) for _ in range(count)))
        if any(not 1 <= first <= last for first, last in ranges):
            raise FormatError("retired file ranges out of order")
        record = FilesRetired(ranges)
    elif rtype == RecordType.FILE_HEADER:
        magic, version, file_no, store_id, created_ms = r.fixed(_FILE_HEADER)
        if magic != MAGIC:
            raise FormatError("bad magic in file header")
        if version not in READABLE_VERSIONS:
            raise FormatError(f"unsupported journal format version {version}")
        record = FileHeader(file_no, bytes(store_id), created_ms, version)
    else:
        raise FormatError(f"unknown record type {rtype}")
    r.done()
    return record


_ZEROS = bytes(1 << 20)


def _all_zero(view: memoryview) -> bool:
    step = len(_ZEROS)
    for i in range(0, len(view), step):
        chunk = view[i : i + step].tobytes()
        if chunk != _ZEROS[: len(chunk)]:
            return False
    return True


def padding_header(record_bytes: int) -> bytes:
    """The 9-byte header of a PADDING record that spans `record_bytes` (header included) of
    zeros; the caller writes the zeros."""
    length = record_bytes - HEADER_BYTES
    if not 0 <= length <= MAX_PAYLOAD_BYTES:
        raise FormatError(f"cannot pad {record_bytes} bytes")
    crc = _TYPE_CRC[RecordType.PADDING]
    left = length
    while left:
        n = min(left, len(_ZEROS))
        crc = zlib.crc32(_ZEROS if n == len(_ZEROS) else _ZEROS[:n], crc)
        left -= n
    return HEADER.pack(length, crc, RecordType.PADDING)


def encode_file_header(file_no: int, store_id: bytes, created_ms: int) -> bytes:
    """The whole header record that starts file `file_no`."""
    rtype, payload = encode(FileHeader(file_no, store_id, created_ms))
    return record_bytes(rtype, payload)


FILE_HEADER_RECORD_BYTES = HEADER_BYTES + _FILE_HEADER.size
