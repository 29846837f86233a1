"""The LMDB index: a checkpointed cache of the journal, and the codecs of its keys and values.

Databases (all keys big endian so they sort numerically):

    meta   b"format" -> marker and version; b"store_id" -> the journal's 16-byte id;
           b"checkpoint" -> (file u32, offset u64): every record before it is reflected here;
           b"next_txno" -> u64; b"state" -> b"ok" or b"building" (a rebuild did not finish)
    msgs   dkey(16) seq(8) -> file u32, offset u64, length u32, size u32, timestamp u64,
           commit_file u32 (the file of the TX_COMMIT that made it visible, 0 if none)
    rev    file(4) dkey(16) seq(8) -> b"": the messages that keep a file alive (compaction)
    tx     txno(8) 0x00 ordinal(4) -> an add of an open transaction (location, size, ...)
           txno(8) 0x01 file(4) offset(8) -> a remove of an open transaction
           txno(8) 0x02 -> file of its TX_BEGIN
    dests  dkey(16) -> destination state;  subs  skey(16) -> durable subscription
    dedup  dkey(16) ordinal(8) -> one id of the destination's window, with the files it needs
    files  file(4) -> pins, live counts, data end, the files that must go before it

`dkey`/`skey` are 128-bit BLAKE2b digests of the names, which keeps keys short and fixed whatever
the length of a destination name (LMDB keys are limited to 511 bytes).

LMDB pages carry no checksum, so `close()` leaves a `clean` file with the CRC-32 of `data.mdb`;
`open` checks and deletes it. After a crash there is no marker and LMDB's own crash safety holds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

FORMAT_MARK = b"sluice-index\x00\x01"
_CLEAN = struct.Struct("<8sIQ")
_CLEAN_MAGIC = b"SLUICEIX"
_CP = struct.Struct("<IQ")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
MSG_VALUE = struct.Struct("<IQIIQI")
_DEST = struct.Struct("<QQQQQIII")
_SUB = struct.Struct("<QIIIB")
_FILE = struct.Struct("<QQQQQI")
_TX_ADD = struct.Struct("<IQIIQ")
_TX_REMOVE = struct.Struct("<QI")
_DBS = (b"meta", b"msgs", b"rev", b"tx", b"dests", b"subs", b"dedup", b"files")


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


def _data_file(index_dir: Path) -> Path:
    return index_dir / "data.mdb"


def _checksum(path: Path) -> tuple[int, int]:
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return crc, size


class Index:
    """The LMDB environment and its databases. The writer thread owns the write transaction;
    any thread may read through `begin_read`."""

    def __init__(self, index_dir: Path, map_bytes: int, *, durable: bool) -> None:
        self.dir = index_dir
        self.durable = durable
        index_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(
                str(index_dir),
                map_size=map_bytes,
                max_dbs=len(_DBS),
                sync=durable,
                metasync=durable,
                readahead=False,
                max_readers=256,
            )
            self.dbs: dict[bytes, Any] = {name: self.env.open_db(name) for name in _DBS}
        except lmdb.Error as exc:
            raise IndexCorrupt(f"LMDB failed to open: {exc}") from exc
        self.txn: Any = None

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def open_checked(
        cls, index_dir: Path, map_bytes: int, store_id: bytes, *, durable: bool
    ) -> Index:
        """Open an existing index and check its clean-close checksum and format marker.
        Raises `IndexCorrupt` (or FileNotFoundError when there is none)."""
        data = _data_file(index_dir)
        if not data.is_file():
            raise FileNotFoundError(str(data))
        clean = index_dir / "clean"
        if clean.exists():
            raw = clean.read_bytes()
            crc, size = _checksum(data)
            if len(raw) != _CLEAN.size or _CLEAN.unpack(raw) != (_CLEAN_MAGIC, crc, size):
                raise IndexCorrupt("index checksum does not match the one written at close")
            # From now on the file changes; a crash must not leave a stale marker.
            clean.unlink()
        index = cls(index_dir, map_bytes, durable=durable)
        try:
            with index.env.begin() as txn:
                meta = index.dbs[b"meta"]
                mark = txn.get(b"format", db=meta)
                sid = txn.get(b"store_id", db=meta)
                state = txn.get(b"state", db=meta)
            if mark != FORMAT_MARK:
                raise IndexCorrupt("index format marker missing or unknown")
            if sid != store_id:
                raise IndexCorrupt("index belongs to another journal")
            if state != b"ok":
                raise IndexCorrupt("an index rebuild did not finish")
        except lmdb.Error as exc:
            index.env.close()
            raise IndexCorrupt(f"LMDB error: {exc}") from exc
        except IndexCorrupt:
            index.env.close()
            raise
        return index

    @classmethod
    def create(cls, index_dir: Path, map_bytes: int, store_id: bytes, *, durable: bool) -> Index:
        """A new, empty index (whatever was in `index_dir` is removed), marked as building."""
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index = cls(index_dir, map_bytes, durable=durable)
        index.begin_write()
        meta = index.dbs[b"meta"]
        index.txn.put(b"format", FORMAT_MARK, db=meta)
        index.txn.put(b"store_id", store_id, db=meta)
        index.txn.put(b"state", b"building", db=meta)
        index.commit()
        return index

    @staticmethod
    def peek_store_id(index_dir: Path) -> bytes | None:
        """The store id an existing index records, if it can be read (for repair)."""
        if not _data_file(index_dir).is_file():
            return None
        try:
            env = lmdb.open(str(index_dir), max_dbs=len(_DBS), readonly=True, lock=False)
            try:
                meta = env.open_db(b"meta", create=False)
                with env.begin() as txn:
                    value = txn.get(b"store_id", db=meta)
            finally:
                env.close()
        except lmdb.Error:
            return None
        return bytes(value) if value is not None and len(value) == 16 else None

    def begin_write(self) -> None:
        """Start the write transaction on the calling thread."""
        self.txn = self.env.begin(write=True)

    def commit(self, *, reopen: bool = False) -> None:
        """Commit the write transaction (durable when the index is), optionally starting the
        next one."""
        self.txn.commit()
        self.txn = self.env.begin(write=True) if reopen else None

    def abort(self) -> None:
        """Drop the write transaction."""
        if self.txn is not None:
            self.txn.abort()
            self.txn = None

    def begin_read(self) -> Any:
        """A read-only transaction (a consistent snapshot of the last commit)."""
        return self.env.begin(buffers=True)

    def close(self, *, clean: bool) -> None:
        """Close the environment; when `clean`, leave the checksum marker for the next open."""
        self.abort()
        self.env.close()
        if clean and self.durable:
            crc, size = _checksum(_data_file(self.dir))
            path = self.dir / "clean"
            with open(path, "wb") as f:
                f.write(_CLEAN.pack(_CLEAN_MAGIC, crc, size))
                f.flush()
                os.fsync(f.fileno())

    def size_bytes(self) -> int:
        """Bytes the index takes on disk."""
        try:
            return _data_file(self.dir).stat().st_size
        except OSError:
            return 0

    # -- meta ------------------------------------------------------------------------------------

    def read_meta(self) -> tuple[tuple[int, int], int]:
        """(checkpoint position, next transaction number) from the write transaction."""
        meta = self.dbs[b"meta"]
        cp = self.txn.get(b"checkpoint", db=meta)
        nt = self.txn.get(b"next_txno", db=meta)
        try:
            pos = _CP.unpack(cp) if cp is not None else (0, 0)
            next_txno = _U64.unpack(nt)[0] if nt is not None else 1
        except struct.error as exc:
            raise IndexCorrupt("bad checkpoint entry") from exc
        return (int(pos[0]), int(pos[1])), int(next_txno)

    def write_meta(self, checkpoint: tuple[int, int], next_txno: int, *, ok: bool) -> None:
        """Record the checkpoint position (in the write transaction)."""
        meta = self.dbs[b"meta"]
        self.txn.put(b"checkpoint", _CP.pack(*checkpoint), db=meta)
        self.txn.put(b"next_txno", _U64.pack(next_txno), db=meta)
        self.txn.put(b"state", b"ok" if ok else b"building", db=meta)
