"""Keys and values of the index's tables, and their codecs (layout: see `index.py`).

`dkey`/`skey` are 128-bit BLAKE2b digests of the names, which keeps keys short and fixed whatever
the length of a destination name (LMDB keys are limited to 511 bytes). Every decoder checks sizes
before it slices and raises `IndexCorrupt` on anything it cannot parse.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

_U32 = struct.Struct("<I")
MSG_VALUE = struct.Struct("<IQIIQI")
_DEST = struct.Struct("<QQQQQIII")
_SUB = struct.Struct("<QIIIB")
_FILE = struct.Struct("<QQQQQI")
_TX_ADD = struct.Struct("<IQIIQ")
_TX_REMOVE = struct.Struct("<QI")


class IndexCorrupt(Exception):
    """The index cannot be trusted; it is rebuilt from the journal."""


def dkey(destination: str) -> bytes:
    """Fixed-size key of a destination."""
    return hashlib.blake2b(destination.encode("utf-8"), digest_size=16).digest()


def skey(client_id: str, name: str) -> bytes:
    """Fixed-size key of a durable subscription."""
    return hashlib.blake2b(f"{client_id}\0{name}".encode(), digest_size=16).digest()


def msg_key(dk: bytes, seq: int) -> bytes:
    """Key of a message in `msgs`."""
    return dk + seq.to_bytes(8, "big")


def rev_key(file_no: int, mkey: bytes) -> bytes:
    """Key of a message in a file's reverse list."""
    return file_no.to_bytes(4, "big") + mkey


def file_key(file_no: int) -> bytes:
    """Key of a file in `files`."""
    return file_no.to_bytes(4, "big")


@dataclass(slots=True)
class MsgLoc:
    """Where a stored message's record is, and what the index keeps about it."""

    file_no: int
    offset: int
    length: int
    size: int
    timestamp_ms: int
    commit_file: int = 0

    def encode(self) -> bytes:
        """The `msgs` value."""
        return MSG_VALUE.pack(
            self.file_no, self.offset, self.length, self.size, self.timestamp_ms, self.commit_file
        )

    @classmethod
    def decode(cls, data: bytes | memoryview) -> MsgLoc:
        """Parse a `msgs` value."""
        if len(data) != MSG_VALUE.size:
            raise IndexCorrupt("bad message entry")
        return cls(*MSG_VALUE.unpack(data))

    def files(self) -> tuple[int, ...]:
        """The files this message needs: its ADD and, if transacted, its TX_COMMIT."""
        if self.commit_file and self.commit_file != self.file_no:
            return (self.file_no, self.commit_file)
        return (self.file_no,)


@dataclass(slots=True)
class DestInfo:
    """A destination's state in the index."""

    name: str
    last_seq: int = 0
    count: int = 0
    message_bytes: int = 0
    dispatch_mark: int = 0
    dedup_next: int = 1
    seq_pin: int = 0  # file of the record that established last_seq
    mark_pin: int = 0  # file of the record that established dispatch_mark
    files: set[int] = field(default_factory=set)  # files with records that establish state

    def encode(self) -> bytes:
        """The `dests` value."""
        files = sorted(self.files)
        return (
            _DEST.pack(
                self.last_seq,
                self.count,
                self.message_bytes,
                self.dispatch_mark,
                self.dedup_next,
                self.seq_pin,
                self.mark_pin,
                len(files),
            )
            + struct.pack(f"<{len(files)}I", *files)
            + self.name.encode("utf-8")
        )

    @classmethod
    def decode(cls, data: bytes | memoryview) -> DestInfo:
        """Parse a `dests` value."""
        try:
            fields = _DEST.unpack_from(data, 0)
            n = fields[7]
            files = struct.unpack_from(f"<{n}I", data, _DEST.size)
            name = bytes(data[_DEST.size + 4 * n :]).decode("utf-8")
        except (struct.error, UnicodeDecodeError) as exc:
            raise IndexCorrupt("bad destination entry") from exc
        last_seq, count, message_bytes, mark, dedup_next, seq_pin, mark_pin = fields[:7]
        return cls(
            name, last_seq, count, message_bytes, mark, dedup_next, seq_pin, mark_pin, set(files)
        )


@dataclass(slots=True)
class SubInfo:
    """A durable subscription in the index."""

    client_id: str
    name: str
    destination: str
    selector: str | None
    cursor: int
    pin: int = 0  # file of the record that set the current cursor (SUB_PUT or SUB_CURSOR)
    put_pin: int = 0  # file of the SUB_PUT that created it: a cursor alone cannot
    files: set[int] = field(default_factory=set)

    def encode(self) -> bytes:
        """The `subs` value."""
        files = sorted(self.files)
        texts = [self.client_id, self.name, self.destination, self.selector or ""]
        encoded = b"".join(_U32.pack(len(b)) + b for b in (t.encode("utf-8") for t in texts))
        return (
            _SUB.pack(self.cursor, self.pin, self.put_pin, len(files), self.selector is not None)
            + struct.pack(f"<{len(files)}I", *files)
            + encoded
        )

    @classmethod
    def decode(cls, data: bytes | memoryview) -> SubInfo:
        """Parse a `subs` value."""
        try:
            cursor, pin, put_pin, n, has_selector = _SUB.unpack_from(data, 0)
            pos = _SUB.size
            files = struct.unpack_from(f"<{n}I", data, pos)
            pos += 4 * n
            texts = []
            for _ in range(4):
                (length,) = _U32.unpack_from(data, pos)
                pos += 4
                if pos + length > len(data):
                    raise IndexCorrupt("bad subscription entry")
                texts.append(bytes(data[pos : pos + length]).decode("utf-8"))
                pos += length
        except (struct.error, UnicodeDecodeError) as exc:
            raise IndexCorrupt("bad subscription entry") from exc
        selector = texts[3] if has_selector else None
        return cls(texts[0], texts[1], texts[2], selector, cursor, pin, put_pin, set(files))


@dataclass(slots=True)
class FileInfo:
    """A data file's liveness.

    `pins` counts everything that needs the file: live messages whose ADD or TX_COMMIT is in it,
    records of open transactions, and current state records (subscription, a destination's last
    sequence, dispatch mark, dedup ids). `deps` are files that must be gone before this one may
    go, because this file holds records that undo something in them (a remove of a message they
    hold): dropping this file first would let a rebuild resurrect what it undid."""

    pins: int = 0
    tx_pins: int = 0
    live_msgs: int = 0
    live_bytes: int = 0
    data_bytes: int = 0
    deps: set[int] = field(default_factory=set)

    def encode(self) -> bytes:
        """The `files` value."""
        deps = sorted(self.deps)
        return _FILE.pack(
            self.pins, self.tx_pins, self.live_msgs, self.live_bytes, self.data_bytes, len(deps)
        ) + struct.pack(f"<{len(deps)}I", *deps)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> FileInfo:
        """Parse a `files` value."""
        try:
            *counts, n = _FILE.unpack_from(data, 0)
            deps = struct.unpack_from(f"<{n}I", data, _FILE.size)
        except struct.error as exc:
            raise IndexCorrupt("bad file entry") from exc
        pins, tx_pins, live_msgs, live_bytes, data_bytes = counts
        return cls(pins, tx_pins, live_msgs, live_bytes, data_bytes, set(deps))


def encode_tx_add(loc: MsgLoc, destination: str, dedup_id: str) -> bytes:
    """Value of an open transaction's add."""
    d = destination.encode("utf-8")
    return (
        _TX_ADD.pack(loc.file_no, loc.offset, loc.length, loc.size, loc.timestamp_ms)
        + _U32.pack(len(d))
        + d
        + dedup_id.encode("utf-8")
    )


def decode_tx_add(data: bytes | memoryview) -> tuple[MsgLoc, str, str]:
    """(location, destination, dedup id) of an open transaction's add."""
    try:
        file_no, offset, length, size, ts = _TX_ADD.unpack_from(data, 0)
        (n,) = _U32.unpack_from(data, _TX_ADD.size)
        pos = _TX_ADD.size + 4
        destination = bytes(data[pos : pos + n]).decode("utf-8")
        dedup_id = bytes(data[pos + n :]).decode("utf-8")
    except (struct.error, UnicodeDecodeError) as exc:
        raise IndexCorrupt("bad transaction entry") from exc
    return MsgLoc(file_no, offset, length, size, ts), destination, dedup_id


def encode_tx_remove(seq: int, file_no: int, destination: str) -> bytes:
    """Value of an open transaction's remove."""
    return _TX_REMOVE.pack(seq, file_no) + destination.encode("utf-8")


def decode_tx_remove(data: bytes | memoryview) -> tuple[int, int, str]:
    """(seq, file of the record, destination) of an open transaction's remove."""
    try:
        seq, file_no = _TX_REMOVE.unpack_from(data, 0)
        destination = bytes(data[_TX_REMOVE.size :]).decode("utf-8")
    except (struct.error, UnicodeDecodeError) as exc:
        raise IndexCorrupt("bad transaction entry") from exc
    return seq, file_no, destination


def encode_dedup(dedup_id: str, files: tuple[int, ...]) -> bytes:
    """Value of one dedup window entry."""
    return bytes([len(files)]) + struct.pack(f"<{len(files)}I", *files) + dedup_id.encode()


def decode_dedup(data: bytes | memoryview) -> tuple[str, tuple[int, ...]]:
    """(id, files) of one dedup window entry."""
    try:
        n = data[0]
        files = struct.unpack_from(f"<{n}I", data, 1)
        return bytes(data[1 + 4 * n :]).decode("utf-8"), files
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise IndexCorrupt("bad dedup entry") from exc


_HELD = struct.Struct("<QH")


def encode_held_seqs(held: dict[str, int]) -> bytes:
    """The meta `held_seqs` value: sequences in the index that no journal record holds yet."""
    parts = [_U32.pack(len(held))]
    for name, seq in sorted(held.items()):
        raw = name.encode("utf-8")
        parts.append(_HELD.pack(seq, len(raw)) + raw)
    return b"".join(parts)


def decode_held_seqs(data: bytes | memoryview) -> dict[str, int]:
    """Parse a meta `held_seqs` value."""
    try:
        (count,) = _U32.unpack_from(data, 0)
        pos = _U32.size
        out = {}
        for _ in range(count):
            seq, n = _HELD.unpack_from(data, pos)
            pos += _HELD.size
            out[bytes(data[pos : pos + n]).decode("utf-8")] = seq
            pos += n
        return out
    except (struct.error, UnicodeDecodeError) as exc:
        raise IndexCorrupt("bad held sequences entry") from exc
