"""The LMDB index: a checkpointed cache of the journal, kept with a digest of its own contents.

Databases (all keys big endian so they sort numerically; codecs in `indexcodec.py`):

    meta   b"format" -> marker and version; b"store_id" -> the journal's 16-byte id;
           b"checkpoint" -> (file u32, offset u64): every record before it is reflected here;
           b"next_txno" -> u64; b"state" -> b"ok" or b"building" (a rebuild did not finish);
           b"held_seqs" -> destinations' last sequences that no journal record holds yet (the
           journal had no room for their DEST_SEQ at a checkpoint), written at a later one;
           b"digest" -> (entries u64, sum u64) for each of the other databases, in `DIGESTED`
           order
    msgs   dkey(16) seq(8) -> file u32, offset u64, length u32, size u32, timestamp u64,
           commit_file u32 (the file of the TX_COMMIT that made it visible, 0 if none)
    rev    file(4) dkey(16) seq(8) -> b"": the messages that keep a file alive (compaction)
    tx     txno(8) 0x00 ordinal(4) -> an add of an open transaction (location, size, ...)
           txno(8) 0x01 file(4) offset(8) -> a remove of an open transaction
           txno(8) 0x02 -> file of its TX_BEGIN
    dests  dkey(16) -> destination state;  subs  skey(16) -> durable subscription
    dedup  dkey(16) ordinal(8) -> one id of the destination's window, with the files it needs
    files  file(4) -> pins, live counts, data end, the files that must go before it

Trust. LMDB pages carry no checksum and a damaged page can crash the process that maps it, so
opening an index is a sequence of checks, any failure of which makes recovery rebuild it from the
journal: a clean close leaves `clean`, the CRC-32 of `data.mdb`, checked at the next open; then
`lmdbcheck` reads the file as a file (meta pages, size, every tree page, the free list); then LMDB
opens it and `verify` reads every entry, checking key order and that each value decodes, and
compares per-database entry counts and an order-independent digest (the sum, modulo 2**64, of a
64-bit hash of each key and value) with the ones in `meta`. Every write goes through `put`,
`put_marker`, `delete` or `delete_at`, which keep those numbers exact; `commit` stores them in the
same transaction as the changes, so they hold after a crash too.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from sluice.errors import DiskFullError, StoreIOError
from sluice.store.journal import files
from sluice.store.journal import format as fmt
from sluice.store.journal.indexcodec import (
    MSG_VALUE,
    DestInfo,
    FileInfo,
    IndexCorrupt,
    MsgLoc,
    SubInfo,
    decode_dedup,
    decode_held_seqs,
    decode_tx_add,
    decode_tx_remove,
    dkey,
    skey,
)
from sluice.store.journal.lmdbcheck import LmdbDamage, check_file

FORMAT_MARK = b"sluice-index\x00\x02"
_CLEAN = struct.Struct("<8sIQ")
_CLEAN_MAGIC = b"SLUICEIX"
_CP = struct.Struct("<IQ")
_U64 = struct.Struct("<Q")
_DBS = (b"meta", b"msgs", b"rev", b"tx", b"dests", b"subs", b"dedup", b"files")
DIGESTED = _DBS[1:]
_DIGEST = struct.Struct("<" + "QQ" * len(DIGESTED))
_MASK64 = (1 << 64) - 1
# A commit that fails with less than this free on the index's filesystem met a full disk.
FULL_DISK_SLACK_BYTES = 1 << 20
# The `operation` of the `StoreIOError` a failed commit raises, which callers tell apart from a
# failure of the journal.
COMMIT_OPERATION = "committing the index"

_MSG_KEY_BYTES = 24
_REV_KEY_BYTES = 28
# The largest record the index may point at.
_MAX_RECORD_BYTES = fmt.HEADER_BYTES + fmt.MAX_PAYLOAD_BYTES


def entry_hash(key: bytes, value: bytes) -> int:
    """The 64-bit hash of one entry that the digest sums: CRC-32 and Adler-32 of key + value."""
    crc32, adler32 = zlib.crc32, zlib.adler32
    return crc32(value, crc32(key)) | adler32(value, adler32(key)) << 32


@dataclass
class Outside:
    """A message entry whose location is not in the journal as it is on disk (a missing file,
    or past the end of one): the index is intact, the journal lost data."""

    key: bytes
    loc: MsgLoc
    problem: str


@dataclass
class VerifyResult:
    """What `verify` found besides damage (which raises)."""

    entries: dict[bytes, int] = field(default_factory=dict)
    outside: list[Outside] = field(default_factory=list)


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


def check_structure(index_dir: Path) -> None:
    """Check `data.mdb` as a file before LMDB may map it; raises `IndexCorrupt`."""
    try:
        check_file(_data_file(index_dir), _DBS)
    except LmdbDamage as exc:
        raise IndexCorrupt(str(exc)) from exc
    except OSError as exc:
        raise IndexCorrupt(f"cannot read {_data_file(index_dir)}: {exc.strerror}") from exc


def _check_value(name: bytes, key: bytes, value: bytes) -> None:
    """Decode one entry of a small table; raises `IndexCorrupt`."""
    if name == b"dests":
        if len(key) != 16 or dkey(DestInfo.decode(value).name) != key:
            raise IndexCorrupt("destination entry does not match its key")
    elif name == b"subs":
        sub = SubInfo.decode(value)
        if len(key) != 16 or skey(sub.client_id, sub.name) != key:
            raise IndexCorrupt("subscription entry does not match its key")
    elif name == b"files":
        if len(key) != 4:
            raise IndexCorrupt("bad file key")
        FileInfo.decode(value)
    elif name == b"dedup":
        if len(key) != 24:
            raise IndexCorrupt("bad dedup key")
        decode_dedup(value)
    elif name == b"tx":
        kind = key[8:9]
        if kind == b"\x00" and len(key) == 13:
            decode_tx_add(value)
        elif kind == b"\x01" and len(key) == 21:
            decode_tx_remove(value)
        elif not (kind == b"\x02" and len(key) == 9 and len(value) == 4):
            raise IndexCorrupt("bad transaction entry")


def verify_entries(
    txn: Any, dbs: Mapping[bytes, Any], file_sizes: Mapping[int, int]
) -> tuple[dict[bytes, tuple[int, int]], VerifyResult]:
    """Read every entry of the digested databases: keys in order, values that decode; returns the
    (entries, digest) of each and what points outside the journal (`file_sizes`: file -> bytes).
    Raises `IndexCorrupt`."""
    found: dict[bytes, tuple[int, int]] = {}
    result = VerifyResult()
    unpack_loc = MSG_VALUE.unpack
    for name in DIGESTED:
        total = 0
        count = 0
        prev = b""
        for key, value in txn.cursor(db=dbs[name]).iternext():
            if key <= prev or len(key) > 511:
                raise IndexCorrupt(f"{name.decode()} keys out of order")
            prev = key
            count += 1
            total += entry_hash(key, value)
            if name == b"msgs":
                if len(key) != _MSG_KEY_BYTES or len(value) != MSG_VALUE.size:
                    raise IndexCorrupt("bad message entry")
                file_no, offset, length, _size, _ts, commit_file = unpack_loc(value)
                size = file_sizes.get(file_no)
                problem = ""
                if length < fmt.HEADER_BYTES or length > _MAX_RECORD_BYTES:
                    raise IndexCorrupt(f"message entry with a record length of {length}")
                if size is None:
                    problem = "its data file is missing"
                elif offset < fmt.FILE_HEADER_RECORD_BYTES or offset + length > size:
                    problem = f"its record would run past the end of the file ({size} bytes)"
                elif commit_file and commit_file not in file_sizes:
                    problem = f"the file of its commit, db-{commit_file}.log, is missing"
                if problem:
                    loc = MsgLoc(*unpack_loc(value))
                    result.outside.append(Outside(key, loc, problem))
            elif name == b"rev":
                if len(key) != _REV_KEY_BYTES or value:
                    raise IndexCorrupt("bad reverse entry")
            else:
                _check_value(name, key, value)
        found[name] = (count, total & _MASK64)
        result.entries[name] = count
    return found, result


def digest_problems(txn: Any, dbs: Mapping[bytes, Any], found: Mapping[bytes, Any]) -> list[str]:
    """How the entries `verify_entries` found differ from the digest in `meta`."""
    raw = txn.get(b"digest", db=dbs[b"meta"])
    if raw is None or len(raw) != _DIGEST.size:
        return ["index digest missing"]
    numbers = _DIGEST.unpack(raw)
    out = []
    for i, name in enumerate(DIGESTED):
        recorded = (numbers[2 * i], numbers[2 * i + 1])
        if tuple(found[name]) != recorded:
            out.append(
                f"{name.decode()} holds {found[name][0]} entries that do not match the digest "
                f"written with them ({recorded[0]} entries)"
            )
    return out


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
            # One write transaction (one sync) for all of them.
            with self.env.begin(write=True) as txn:
                self.dbs: dict[bytes, Any] = {
                    name: self.env.open_db(name, txn=txn) for name in _DBS
                }
        except lmdb.Error as exc:
            raise IndexCorrupt(f"LMDB failed to open: {exc}") from exc
        self.txn: Any = None
        # Entries and digest of each database as the write transaction has them, and as the
        # last commit left them.
        self.counts = dict.fromkeys(DIGESTED, 0)
        self.sums = dict.fromkeys(DIGESTED, 0)
        self._committed = (dict(self.counts), dict(self.sums))
        self.verified = VerifyResult()

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def open_checked(
        cls,
        index_dir: Path,
        map_bytes: int,
        store_id: bytes,
        *,
        durable: bool,
        file_sizes: Mapping[int, int],
        keep_clean_marker: bool = False,
    ) -> Index:
        """Open an existing index after the checks described at the top (`file_sizes`: the data
        files present, file number -> bytes). Raises `IndexCorrupt` (or FileNotFoundError when
        there is none); `verified.outside` lists entries the journal on disk cannot back.
        `keep_clean_marker`: for a look that commits nothing (verify), leave the marker."""
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
            if not keep_clean_marker:
                clean.unlink()
        check_structure(index_dir)
        index = cls(index_dir, map_bytes, durable=durable)
        try:
            with index.env.begin() as txn:
                meta = index.dbs[b"meta"]
                mark = txn.get(b"format", db=meta)
                sid = txn.get(b"store_id", db=meta)
                state = txn.get(b"state", db=meta)
                digest = txn.get(b"digest", db=meta)
                if mark != FORMAT_MARK:
                    raise IndexCorrupt("index format marker missing or unknown")
                if sid != store_id:
                    raise IndexCorrupt("index belongs to another journal")
                if state != b"ok":
                    raise IndexCorrupt("an index rebuild did not finish")
                if digest is None or len(digest) != _DIGEST.size:
                    raise IndexCorrupt("index digest missing")
                found, index.verified = verify_entries(txn, index.dbs, file_sizes)
                problems = digest_problems(txn, index.dbs, found)
                if problems:
                    raise IndexCorrupt(problems[0])
            numbers = _DIGEST.unpack(digest)
            for i, name in enumerate(DIGESTED):
                index.counts[name], index.sums[name] = numbers[2 * i], numbers[2 * i + 1]
            index._committed = (dict(index.counts), dict(index.sums))
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
        value = _peek_meta(index_dir, b"store_id")
        return value if value is not None and len(value) == 16 else None

    @staticmethod
    def peek_held_seqs(index_dir: Path, store_id: bytes) -> dict[str, int]:
        """The last sequences an existing index of this store holds alone (`Tables.hold_seq`),
        if it can be read: a rebuild from the journal alone would not see them."""
        if Index.peek_store_id(index_dir) != store_id:
            return {}
        value = _peek_meta(index_dir, b"held_seqs")
        if value is None:
            return {}
        try:
            return decode_held_seqs(value)
        except IndexCorrupt:
            return {}

    def begin_write(self) -> None:
        """Start the write transaction on the calling thread."""
        self.txn = self.env.begin(write=True)

    def commit(self, *, reopen: bool = False) -> None:
        """Commit the write transaction with the digest of what it holds (durable when the index
        is), optionally starting the next one. A failed commit leaves no write transaction and
        the index as it was: `DiskFullError` when the disk had no room, else `StoreIOError`."""
        numbers: list[int] = []
        for name in DIGESTED:
            numbers.append(self.counts[name])
            numbers.append(self.sums[name] & _MASK64)
        self.txn.put(b"digest", _DIGEST.pack(*numbers), db=self.dbs[b"meta"])
        try:
            self.txn.commit()
        except lmdb.Error as exc:
            # LMDB aborts a transaction whose commit fails before it writes the meta page: the
            # index stays as the last commit left it, and its changes are gone.
            self.txn = None
            self.counts, self.sums = (dict(d) for d in self._committed)
            path = str(_data_file(self.dir))
            if isinstance(exc, lmdb.DiskError) or self._short_of_space():
                raise DiskFullError(COMMIT_OPERATION, os.strerror(errno.ENOSPC), path) from exc
            raise StoreIOError(COMMIT_OPERATION, str(exc), path) from exc
        self._committed = (dict(self.counts), dict(self.sums))
        self.txn = self.env.begin(write=True) if reopen else None

    def _short_of_space(self) -> bool:
        """Whether the index's filesystem is (next to) full. LMDB reports a page write that the
        disk cut short as EIO, not ENOSPC: on a full disk that is what a commit meets."""
        try:
            return files.free_bytes(self.dir) < FULL_DISK_SLACK_BYTES
        except OSError:
            return False

    def abort(self) -> None:
        """Drop the write transaction."""
        if self.txn is not None:
            self.txn.abort()
            self.txn = None
            self.counts, self.sums = (dict(d) for d in self._committed)

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

    # -- writes (in the write transaction; each keeps the digest exact) --------------------------

    def put(self, name: bytes, key: bytes, value: bytes) -> bytes | None:
        """Insert or replace an entry; returns the value it replaced."""
        old = self.txn.replace(key, value, db=self.dbs[name])
        if old is None:
            self.counts[name] += 1
        else:
            self.sums[name] -= entry_hash(key, old)
        self.sums[name] += entry_hash(key, value)
        return old  # type: ignore[no-any-return]

    def put_marker(self, name: bytes, key: bytes) -> None:
        """Insert an entry with an empty value unless it exists."""
        if self.txn.put(key, b"", db=self.dbs[name], overwrite=False):
            self.counts[name] += 1
            self.sums[name] += entry_hash(key, b"")

    def delete(self, name: bytes, key: bytes) -> bytes | None:
        """Delete an entry; returns its value (None if there was none)."""
        old = self.txn.pop(key, db=self.dbs[name])
        if old is not None:
            self.counts[name] -= 1
            self.sums[name] -= entry_hash(key, old)
        return old  # type: ignore[no-any-return]

    def delete_at(self, name: bytes, cursor: Any) -> bool:
        """Delete the entry under a write cursor of database `name`; as `Cursor.delete`, returns
        whether the cursor still points at an entry."""
        key, value = cursor.item()
        self.counts[name] -= 1
        self.sums[name] -= entry_hash(key, value)
        return bool(cursor.delete())

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

    def checkpoint_in(self, txn: Any) -> tuple[int, int]:
        """The checkpoint position a read transaction (`begin_read`) sees."""
        cp = txn.get(b"checkpoint", db=self.dbs[b"meta"])
        try:
            pos = _CP.unpack(cp) if cp is not None else (0, 0)
        except struct.error as exc:
            raise IndexCorrupt("bad checkpoint entry") from exc
        return int(pos[0]), int(pos[1])

    def write_meta(self, checkpoint: tuple[int, int], next_txno: int, *, ok: bool) -> None:
        """Record the checkpoint position (in the write transaction)."""
        meta = self.dbs[b"meta"]
        self.txn.put(b"checkpoint", _CP.pack(*checkpoint), db=meta)
        self.txn.put(b"next_txno", _U64.pack(next_txno), db=meta)
        self.txn.put(b"state", b"ok" if ok else b"building", db=meta)


def _peek_meta(index_dir: Path, key: bytes) -> bytes | None:
    """A meta value of an existing index, read-only, or None if it cannot be read."""
    if not _data_file(index_dir).is_file():
        return None
    try:
        check_structure(index_dir)
        env = lmdb.open(str(index_dir), max_dbs=len(_DBS), readonly=True, lock=False)
        try:
            meta = env.open_db(b"meta", create=False)
            with env.begin() as txn:
                value = txn.get(key, db=meta)
                return bytes(value) if value is not None else None
        finally:
            env.close()
    except (lmdb.Error, IndexCorrupt):
        return None
