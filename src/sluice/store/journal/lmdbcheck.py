"""Checking the index's LMDB file by reading it as a file, before LMDB maps it.

LMDB keeps no checksums and trusts its pages: a damaged page can make it read past the end of the
file (SIGBUS), trip one of its assertions (SIGABRT), or quietly route a lookup to the wrong page.
So `data.mdb` is never handed to LMDB before this module has read it with ordinary reads (which
cannot fault) and checked everything LMDB relies on when it reads, or allocates from, the file:

- the meta pages: magic, version, page size, and which one LMDB will use;
- every page reachable from the free, main and named trees lies within the file (LMDB maps the
  file whole and would fault on a page past its end: a truncated file is caught here; pages that
  are only free may lie past it, as LMDB writes those before it reads them), its header names its
  own page number,
  branch pages sit above leaves and all leaves at the tree's recorded depth, no page is reached
  twice, every node pointer, node, key and value lies within its page (or its overflow pages), and
  branch keys are ordered and bound the keys of the pages below them;
- the tree sizes recorded in the main tree match what was walked;
- the free list: its page numbers lie within the file, appear once and are used by no tree, and
  every page is either a meta page, a tree page or free, so LMDB never hands out a live page.

Leaves of the fixed-size tables (`msgs`, `rev`) are checked in bulk: their nodes must tile the page
exactly with the one node header those tables ever have. Key order inside leaves is checked by the
index's own scan (`Index.verify`), which reads every entry through LMDB once this check passed.

Layout of LMDB 0.9 on a 64-bit little-endian machine (the version the `lmdb` package bundles).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_PAGE_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_PAGE_HEADER_BYTES = 16
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_NODE_BYTES = 8
_META = struct.Struct("<IIQQ")  # magic, version, address, map size
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META_TAIL = struct.Struct("<QQ")  # last page, txnid
_U64 = struct.Struct("<Q")

_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_P_BRANCH = 0x01
_P_LEAF = 0x02
_P_OVERFLOW = 0x04
_P_META = 0x08
_F_BIGDATA = 0x01
_F_SUBDATA = 0x02
_P_INVALID = (1 << 64) - 1
_MAX_KEY_BYTES = 511
_MAX_DEPTH = 32
_META_PAGES = 2
# Names for LMDB's own trees in messages (named trees never start with a zero byte).
_FREE_TREE = b"\0free"
_MAIN_TREE = b"\0main"

# Named tables whose nodes all have one size: (key bytes, value bytes).
FIXED_NODES: dict[bytes, tuple[int, int]] = {b"msgs": (24, 32), b"rev": (28, 0)}


class LmdbDamage(Exception):
    """`data.mdb` is not a sound LMDB file; the message says where."""


@dataclass(frozen=True, slots=True)
class DbRecord:
    """A tree's record (LMDB's MDB_db)."""

    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> DbRecord:
        """Parse the 48-byte record at `offset`."""
        _pad, flags, depth, branch, leaf, overflow, entries, root = _DB.unpack_from(data, offset)
        return cls(flags, depth, branch, leaf, overflow, entries, root)


@dataclass(frozen=True, slots=True)
class MetaPage:
    """The meta page LMDB will use: page size, last page, transaction id, the two root trees."""

    page_bytes: int
    last_page: int
    txnid: int
    free: DbRecord
    main: DbRecord


@dataclass
class Walked:
    """What a tree walk found."""

    branch_pages: int = 0
    leaf_pages: int = 0
    overflow_pages: int = 0
    entries: int = 0


@dataclass
class FileCheck:
    """The result of `check_file`: the meta page used and the named trees found."""

    meta: MetaPage
    trees: dict[bytes, DbRecord] = field(default_factory=dict)
    free_pages: frozenset[int] = frozenset()


def _meta_at(data: bytes, offset: int) -> tuple[int, int, int, DbRecord, DbRecord] | str:
    if len(data) < offset + _PAGE_HEADER_BYTES + 152:
        return "meta page truncated"
    _pgno, _pad, flags, _lower, _upper = _PAGE_HEADER.unpack_from(data, offset)
    if not flags & _P_META:
        return "meta page flag missing"
    base = offset + _PAGE_HEADER_BYTES
    magic, version, _address, _map = _META.unpack_from(data, base)
    if magic != _MAGIC:
        return "bad magic in meta page"
    if version != _DATA_VERSION:
        return f"unknown LMDB data version {version}"
    free = DbRecord.unpack(data, base + _META.size)
    main = DbRecord.unpack(data, base + _META.size + _DB.size)
    last_page, txnid = _META_TAIL.unpack_from(data, base + _META.size + 2 * _DB.size)
    page_bytes = _DB.unpack_from(data, base + _META.size)[0]  # LMDB keeps it in free's pad
    return page_bytes, last_page, txnid, free, main


def read_meta(path: Path) -> MetaPage:
    """The meta page LMDB would pick (the one with the higher transaction id), after checking
    both. Raises `LmdbDamage`."""
    with open(path, "rb") as f:
        head = f.read(65536 + _PAGE_HEADER_BYTES + 152)
    first = _meta_at(head, 0)
    if isinstance(first, str):
        raise LmdbDamage(f"{path}: {first} (page 0)")
    page_bytes = first[0]
    if page_bytes < 512 or page_bytes > 65536 or page_bytes & (page_bytes - 1):
        raise LmdbDamage(f"{path}: implausible page size {page_bytes}")
    second = _meta_at(head, page_bytes)
    if isinstance(second, str):
        raise LmdbDamage(f"{path}: {second} (page 1)")
    if second[0] != page_bytes:
        raise LmdbDamage(f"{path}: the meta pages disagree on the page size")
    chosen = second if second[2] > first[2] else first
    _, last_page, txnid, free, main = chosen
    if last_page < _META_PAGES - 1:
        raise LmdbDamage(f"{path}: the meta page names {last_page + 1} pages")
    return MetaPage(page_bytes, last_page, txnid, free, main)


class _Walker:
    """Walks every tree of one file; the first inconsistency raises `LmdbDamage`."""

    def __init__(self, path: Path, data: mmap.mmap | bytes, meta: MetaPage) -> None:
        self.path = path
        self.data = data
        self.meta = meta
        self.page_bytes = meta.page_bytes
        self.last_page = meta.last_page
        self.file_pages = len(data) // meta.page_bytes
        self.used = bytearray(meta.last_page + 1)
        self.used[0] = self.used[1] = 1
        self.free_ids: list[int] = []
        self.subdbs: dict[bytes, DbRecord] = {}

    def fail(self, pgno: int, what: str) -> LmdbDamage:
        return LmdbDamage(f"{self.path}: page {pgno} (offset {pgno * self.page_bytes}): {what}")

    def _claim(self, pgno: int, count: int = 1) -> None:
        if pgno < _META_PAGES or pgno + count - 1 > self.last_page:
            raise self.fail(pgno, f"page number beyond the last page {self.last_page}")
        if pgno + count > self.file_pages:
            raise self.fail(pgno, f"page past the end of the file ({self.file_pages} pages)")
        if any(self.used[pgno : pgno + count]):
            raise self.fail(pgno, "page reached twice")
        self.used[pgno : pgno + count] = b"\1" * count

    def _page(self, pgno: int, flags_wanted: int) -> tuple[bytes, int, int]:
        """The page's bytes and its (lower, upper), after checking its header."""
        self._claim(pgno)
        ps = self.page_bytes
        page = self.data[pgno * ps : (pgno + 1) * ps]
        own, _pad, flags, lower, upper = _PAGE_HEADER.unpack_from(page, 0)
        if own != pgno:
            raise self.fail(pgno, f"header names page {own}")
        if flags != flags_wanted:
            raise self.fail(pgno, f"flags {flags:#x} where {flags_wanted:#x} belongs")
        if not (_PAGE_HEADER_BYTES < lower <= upper <= ps) or lower & 1:
            raise self.fail(pgno, f"bounds lower={lower} upper={upper}")
        return page, lower, upper

    def _overflow(self, pgno: int, value_bytes: int) -> tuple[bytes, int]:
        ps = self.page_bytes
        if not _META_PAGES <= pgno < min(self.last_page + 1, self.file_pages):
            raise self.fail(pgno, "overflow page beyond the last page or the file")
        head = self.data[pgno * ps : pgno * ps + _PAGE_HEADER_BYTES]
        own, _pad, flags, pages_lo, pages_hi = _PAGE_HEADER.unpack_from(head, 0)
        pages = pages_lo | pages_hi << 16
        if own != pgno or flags != _P_OVERFLOW:
            raise self.fail(pgno, "not an overflow page")
        if pages < 1 or value_bytes > pages * ps - _PAGE_HEADER_BYTES:
            raise self.fail(pgno, f"overflow of {pages} pages cannot hold {value_bytes} bytes")
        self._claim(pgno, pages)
        start = pgno * ps + _PAGE_HEADER_BYTES
        return self.data[start : start + value_bytes], pages

    def walk(self, name: bytes, record: DbRecord, order: Callable[[bytes], bytes]) -> Walked:
        """Check one tree; returns the pages and entries found."""
        walked = Walked()
        if record.root == _P_INVALID:
            if record.depth or record.entries:
                raise LmdbDamage(f"{self.path}: tree {name!r} is empty but records entries")
            return walked
        if not 1 <= record.depth <= _MAX_DEPTH:
            raise LmdbDamage(f"{self.path}: tree {name!r} has depth {record.depth}")
        fixed = FIXED_NODES.get(name)
        # (page, level, lowest key allowed, key every key must sort below)
        stack: list[tuple[int, int, bytes | None, bytes | None]] = [(record.root, 1, None, None)]
        while stack:
            pgno, level, low, high = stack.pop()
            if level < record.depth:
                walked.branch_pages += 1
                children = self._branch(pgno, low, high, order)
                stack.extend((c, level + 1, lo, hi) for c, lo, hi in reversed(children))
            else:
                walked.leaf_pages += 1
                if fixed is not None:
                    walked.entries += self._fixed_leaf(pgno, low, high, order, fixed)
                else:
                    walked.entries += self._leaf(name, pgno, low, high, order, walked)
        mismatch = (
            walked.branch_pages != record.branch_pages
            or walked.leaf_pages != record.leaf_pages
            or walked.overflow_pages != record.overflow_pages
            or walked.entries != record.entries
        )
        if mismatch:
            raise LmdbDamage(f"{self.path}: tree {name!r} does not match its recorded size")
        return walked

    def _nodes(self, page: bytes, pgno: int, lower: int, upper: int) -> tuple[int, ...]:
        count = (lower - _PAGE_HEADER_BYTES) // 2
        ptrs = struct.unpack_from(f"<{count}H", page, _PAGE_HEADER_BYTES)
        if min(ptrs) < upper or max(ptrs) > self.page_bytes - _NODE_BYTES:
            raise self.fail(pgno, "node pointer outside the page")
        return ptrs

    def _key(self, page: bytes, pgno: int, ptr: int) -> tuple[int, int, int, bytes]:
        lo, hi, flags, key_bytes = _NODE.unpack_from(page, ptr)
        end = ptr + _NODE_BYTES + key_bytes
        if key_bytes > _MAX_KEY_BYTES or end > self.page_bytes:
            raise self.fail(pgno, f"key of {key_bytes} bytes runs past the page")
        return lo | hi << 16, flags, end, page[ptr + _NODE_BYTES : end]

    def _bounded(
        self,
        pgno: int,
        key: bytes,
        low: bytes | None,
        high: bytes | None,
        order: Callable[[bytes], bytes],
    ) -> None:
        k = order(key)
        if (low is not None and k < order(low)) or (high is not None and k >= order(high)):
            raise self.fail(pgno, "key outside the range its parent gives")

    def _branch(
        self,
        pgno: int,
        low: bytes | None,
        high: bytes | None,
        order: Callable[[bytes], bytes],
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        page, lower, upper = self._page(pgno, _P_BRANCH)
        ptrs = self._nodes(page, pgno, lower, upper)
        keys: list[bytes | None] = [low]
        childs = []
        for i, ptr in enumerate(ptrs):
            size_lo, flags, _end, key = self._key(page, pgno, ptr)
            childs.append(size_lo | flags << 32)
            if i == 0:
                continue  # LMDB ignores the first key of a branch page
            self._bounded(pgno, key, low, high, order)
            prev = keys[-1]
            if i > 1 and prev is not None and order(key) <= order(prev):
                raise self.fail(pgno, "branch keys out of order")
            keys.append(key)
        keys.append(high)
        return [(child, keys[i], keys[i + 1]) for i, child in enumerate(childs)]

    def _fixed_leaf(
        self,
        pgno: int,
        low: bytes | None,
        high: bytes | None,
        order: Callable[[bytes], bytes],
        fixed: tuple[int, int],
    ) -> int:
        page, lower, upper = self._page(pgno, _P_LEAF)
        key_bytes, value_bytes = fixed
        stride = _NODE_BYTES + key_bytes + value_bytes
        count = (lower - _PAGE_HEADER_BYTES) // 2
        if (self.page_bytes - upper) != count * stride:
            raise self.fail(pgno, "leaf nodes do not fill the page")
        ptrs = struct.unpack_from(f"<{count}H", page, _PAGE_HEADER_BYTES)
        if sorted(ptrs) != list(range(upper, self.page_bytes, stride)):
            raise self.fail(pgno, "leaf node pointers do not match its nodes")
        header = _NODE.pack(value_bytes & 0xFFFF, value_bytes >> 16, 0, key_bytes)
        area = page[upper:]
        for j in range(_NODE_BYTES):
            if area[j::stride] != header[j : j + 1] * count:
                raise self.fail(pgno, "leaf node header damaged")
        for ptr in (ptrs[0], ptrs[-1]):
            key = page[ptr + _NODE_BYTES : ptr + _NODE_BYTES + key_bytes]
            self._bounded(pgno, key, low, high, order)
        return count

    def _leaf(
        self,
        name: bytes,
        pgno: int,
        low: bytes | None,
        high: bytes | None,
        order: Callable[[bytes], bytes],
        walked: Walked,
    ) -> int:
        page, lower, upper = self._page(pgno, _P_LEAF)
        ptrs = self._nodes(page, pgno, lower, upper)
        prev: bytes | None = None
        for ptr in ptrs:
            value_bytes, flags, end, key = self._key(page, pgno, ptr)
            self._bounded(pgno, key, low, high, order)
            if prev is not None and order(key) <= order(prev):
                raise self.fail(pgno, "leaf keys out of order")
            prev = key
            if flags & ~(_F_BIGDATA | _F_SUBDATA):
                raise self.fail(pgno, f"node flags {flags:#x}")
            if flags & _F_BIGDATA:
                if end + 8 > self.page_bytes:
                    raise self.fail(pgno, "overflow reference runs past the page")
                (opgno,) = _U64.unpack_from(page, end)
                value, pages = self._overflow(opgno, value_bytes)
                walked.overflow_pages += pages
            else:
                if end + value_bytes > self.page_bytes:
                    raise self.fail(pgno, f"value of {value_bytes} bytes runs past the page")
                value = page[end : end + value_bytes]
            if name == _FREE_TREE:
                self._free_list(pgno, value)
            elif flags & _F_SUBDATA:
                if name != _MAIN_TREE or value_bytes != _DB.size:
                    raise self.fail(pgno, "misplaced sub-database record")
                self.subdbs[key] = DbRecord.unpack(value)
        return len(ptrs)

    def _free_list(self, pgno: int, value: bytes) -> None:
        if len(value) < 8 or len(value) % 8:
            raise self.fail(pgno, "free list entry of a wrong size")
        count = len(value) // 8 - 1
        (recorded, *ids) = struct.unpack(f"<{count + 1}Q", value)
        if recorded != count:
            raise self.fail(pgno, "free list count does not match its size")
        last = _P_INVALID
        for free in ids:
            if free >= last or not _META_PAGES <= free <= self.last_page:
                raise self.fail(pgno, "free list entry out of order or range")
            last = free
        self.free_ids.extend(ids)

    def finish(self) -> frozenset[int]:
        """Check that the free pages are unused and every page is accounted for; returns the
        free pages."""
        free = self.free_ids
        for pgno in free:
            if self.used[pgno]:
                raise self.fail(pgno, "page is both free and in use")
            self.used[pgno] = 1
        if self.used.count(0):
            lost = self.used.index(0)
            raise self.fail(lost, "page neither free nor in use")
        return frozenset(free)


def _integer_key(key: bytes) -> bytes:
    return key[::-1]  # 8-byte native (little endian) integers: reversed, they sort as bytes


def _bytes_key(key: bytes) -> bytes:
    return key


def check_file(path: Path, names: tuple[bytes, ...]) -> FileCheck:
    """Check `path` as described at the top; `names` are the named trees that must exist.
    Raises `LmdbDamage`; never maps the file beyond its end."""
    meta = read_meta(path)
    result = FileCheck(meta)
    fd = os.open(path, os.O_RDONLY)
    try:
        # Never more than the file holds, so reading the map cannot fault.
        pages = min(meta.last_page + 1, os.fstat(fd).st_size // meta.page_bytes)
        if pages < _META_PAGES:
            raise LmdbDamage(f"{path}: shorter than its meta pages")
        with mmap.mmap(fd, pages * meta.page_bytes, prot=mmap.PROT_READ) as data:
            walker = _Walker(path, data, meta)
            walker.walk(_FREE_TREE, meta.free, _integer_key)
            walker.walk(_MAIN_TREE, meta.main, _bytes_key)
            for name in names:
                record = walker.subdbs.get(name)
                if record is None:
                    raise LmdbDamage(f"{path}: tree {name!r} is missing")
                if record.flags:
                    raise LmdbDamage(f"{path}: tree {name!r} has flags {record.flags:#x}")
                walker.walk(name, record, _bytes_key)
                result.trees[name] = record
            if set(walker.subdbs) - set(names):
                raise LmdbDamage(f"{path}: unknown trees in the main tree")
            result.free_pages = walker.finish()
    finally:
        os.close(fd)
    return result
