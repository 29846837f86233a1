"""The small tables of the index's view, held in memory and saved at each checkpoint.

Destinations, durable subscriptions, data files, dedup windows and the last sequences the index
holds alone (`JournalState.hold_seqs`) live here, with what changed since the last flush: `load`
reads them from the index, `flush` writes the changed ones into its write transaction. Per-message
entries are not here: `JournalState` puts them straight into LMDB.

Files' liveness is kept here too, since every change to a table moves it: a record that holds
state pins its file (`FileInfo.pins`), and a record that removes or supersedes state makes its
file depend on the files holding what it removed (`FileInfo.deps`), so the remover never goes
first (see `gc.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sluice.store.journal.index import Index
from sluice.store.journal.indexcodec import (
    DestInfo,
    FileInfo,
    IndexCorrupt,
    SubInfo,
    decode_dedup,
    decode_held_seqs,
    dkey,
    encode_dedup,
    encode_held_seqs,
    file_key,
    skey,
)

MAX_SEQ = (1 << 64) - 1

DedupEntry = tuple[int, str, tuple[int, ...]]  # ordinal, id, files it needs


class Tables:
    """The in-memory tables, their changes since the last flush, and files' pins and deps."""

    def __init__(self, index: Index, dedup_window: int) -> None:
        self._index = index
        self._db = index.dbs
        self.dedup_window = dedup_window
        self.clear()

    def clear(self) -> None:
        """Forget everything (before a load)."""
        self.dests: dict[str, DestInfo] = {}
        self.subs: dict[tuple[str, str], SubInfo] = {}
        self.files: dict[int, FileInfo] = {}
        self.dedup: dict[str, deque[DedupEntry]] = {}
        # Last sequences the index holds but no journal record does yet.
        self.held_seqs: dict[str, int] = {}
        self._dirty_dests: set[str] = set()
        self._dirty_subs: set[tuple[str, str]] = set()
        self._dirty_files: set[int] = set()
        self._dirty_dedup: set[str] = set()
        self._dedup_saved: dict[str, int] = {}
        self._held_dirty = False

    @property
    def dirty(self) -> bool:
        """Whether a table changed since the last flush."""
        return bool(
            self._dirty_dests
            or self._dirty_subs
            or self._dirty_files
            or self._dirty_dedup
            or self._held_dirty
        )

    # -- loading and saving ------------------------------------------------------------------------

    def load(self) -> None:
        """Read the tables from the index (inside its write transaction)."""
        txn = self._index.txn
        by_key: dict[bytes, str] = {}
        for key, value in txn.cursor(db=self._db[b"dests"]):
            info = DestInfo.decode(value)
            self.dests[info.name] = info
            by_key[bytes(key)] = info.name
        for _key, value in txn.cursor(db=self._db[b"subs"]):
            sub = SubInfo.decode(value)
            self.subs[(sub.client_id, sub.name)] = sub
        for key, value in txn.cursor(db=self._db[b"files"]):
            self.files[int.from_bytes(key, "big")] = FileInfo.decode(value)
        for key, value in txn.cursor(db=self._db[b"dedup"]):
            name = by_key.get(bytes(key[:16]))
            if name is None:
                raise IndexCorrupt("dedup entry of an unknown destination")
            dedup_id, files = decode_dedup(value)
            ordinal = int.from_bytes(key[16:], "big")
            self.dedup.setdefault(name, deque()).append((ordinal, dedup_id, files))
            self._dedup_saved[name] = ordinal
        held = txn.get(b"held_seqs", db=self._db[b"meta"])
        if held is not None:
            self.held_seqs = decode_held_seqs(held)
        # An index written with a longer window (another setting, a rebuild by a tool) holds
        # more than this store keeps: let the oldest go, and the files they pinned.
        for name, window in self.dedup.items():
            if len(window) > self.dedup_window:
                while len(window) > self.dedup_window:
                    for f in window.popleft()[2]:
                        self.unpin(f)
                self._dirty_dedup.add(name)

    def flush(self) -> None:
        """Write the changed tables into the write transaction."""
        index = self._index
        for name in self._dirty_dests:
            info = self.dests.get(name)
            if info is None:
                index.delete(b"dests", dkey(name))
            else:
                index.put(b"dests", dkey(name), info.encode())
        for key in self._dirty_subs:
            sub = self.subs.get(key)
            if sub is None:
                index.delete(b"subs", skey(*key))
            else:
                index.put(b"subs", skey(*key), sub.encode())
        for file_no in self._dirty_files:
            fi = self.files.get(file_no)
            if fi is None:
                index.delete(b"files", file_key(file_no))
            else:
                index.put(b"files", file_key(file_no), fi.encode())
        for name in self._dirty_dedup:
            self._flush_dedup(name)
        self._dirty_dests.clear()
        self._dirty_subs.clear()
        self._dirty_files.clear()
        self._dirty_dedup.clear()
        if self._held_dirty:
            meta = self._db[b"meta"]
            if self.held_seqs:
                index.txn.put(b"held_seqs", encode_held_seqs(self.held_seqs), db=meta)
            else:
                index.txn.delete(b"held_seqs", db=meta)
            self._held_dirty = False

    def _flush_dedup(self, name: str) -> None:
        txn = self._index.txn
        db = self._db[b"dedup"]
        dk = dkey(name)
        window = self.dedup.get(name)
        first = window[0][0] if window else MAX_SEQ
        cur = txn.cursor(db=db)
        if cur.set_range(dk):
            while True:
                key = cur.key()
                if not key or key[:16] != dk or int.from_bytes(key[16:], "big") >= first:
                    break
                if not self._index.delete_at(b"dedup", cur):
                    break
        saved = self._dedup_saved.get(name, 0)
        for ordinal, dedup_id, files in window or ():
            if ordinal > saved:
                self._index.put(
                    b"dedup", dk + ordinal.to_bytes(8, "big"), encode_dedup(dedup_id, files)
                )
        if window:
            self._dedup_saved[name] = window[-1][0]
        else:
            self._dedup_saved.pop(name, None)

    # -- destinations and subscriptions ------------------------------------------------------------

    def dest(self, name: str) -> DestInfo:
        """A destination's entry, made if new, marked changed."""
        info = self.dests.get(name)
        if info is None:
            info = self.dests[name] = DestInfo(name)
        self._dirty_dests.add(name)
        return info

    def dest_changed(self, name: str) -> None:
        """A destination's entry changed (or went)."""
        self._dirty_dests.add(name)

    def sub_changed(self, key: tuple[str, str]) -> None:
        """A subscription's entry changed (or went)."""
        self._dirty_subs.add(key)

    # -- files -------------------------------------------------------------------------------------

    def file_seen(self, file_no: int, data_bytes: int) -> None:
        """A data file exists and holds valid data up to `data_bytes`."""
        fi = self.files.get(file_no)
        if fi is None:
            fi = self.files[file_no] = FileInfo()
        if fi.data_bytes != data_bytes:
            fi.data_bytes = data_bytes
        self._dirty_files.add(file_no)

    def files_gone(self, file_nos: Iterable[int]) -> None:
        """Data files were deleted or archived: forget them everywhere."""
        gone = set(file_nos)
        for file_no in gone:
            self.files.pop(file_no, None)
            self._dirty_files.add(file_no)
        for file_no, fi in self.files.items():
            if fi.deps & gone:
                fi.deps -= gone
                self._dirty_files.add(file_no)
        for name, info in self.dests.items():
            if info.files & gone:
                info.files -= gone
                self._dirty_dests.add(name)
        for key, sub in self.subs.items():
            if sub.files & gone:
                sub.files -= gone
                self._dirty_subs.add(key)

    def pin(self, file_no: int) -> None:
        """A record in the file holds state."""
        fi = self.files.get(file_no)
        if fi is None:
            fi = self.files[file_no] = FileInfo()
        fi.pins += 1
        self._dirty_files.add(file_no)

    def unpin(self, file_no: int) -> None:
        """A record in the file holds state no longer."""
        fi = self.files.get(file_no)
        if fi is not None and fi.pins > 0:
            fi.pins -= 1
            self._dirty_files.add(file_no)

    def move_pin(self, old: int, new: int) -> int:
        """Pin `new` and unpin `old` (0: none); returns `new`."""
        self.pin(new)
        if old:
            self.unpin(old)
        return new

    def tx_pin(self, file_no: int) -> None:
        """A transaction's record in the file holds state."""
        self.pin(file_no)
        self.files[file_no].tx_pins += 1

    def tx_unpin(self, file_no: int) -> None:
        """A transaction's record in the file holds state no longer."""
        self.unpin(file_no)
        fi = self.files.get(file_no)
        if fi is not None and fi.tx_pins > 0:
            fi.tx_pins -= 1

    def add_deps(self, file_no: int, targets: Iterable[int]) -> None:
        """The file must not go before the known files among `targets`."""
        # Replay registers a file after its records: a remove in it must still record what it
        # depends on, or collection could delete it before the file of the message it removed.
        fi = self.files.get(file_no)
        if fi is None:
            fi = self.files[file_no] = FileInfo()
        for target in targets:
            if target != file_no and target in self.files and target not in fi.deps:
                fi.deps.add(target)
                self._dirty_files.add(file_no)

    def message_released(self, file_no: int, length: int) -> None:
        """A live message whose ADD record (of `length` bytes) is in the file went."""
        fi = self.files.get(file_no)
        if fi is not None:
            fi.live_msgs -= 1
            fi.live_bytes -= length
            self._dirty_files.add(file_no)

    # -- dedup windows -----------------------------------------------------------------------------

    def dedup_push(self, info: DestInfo, dedup_id: str, files: tuple[int, ...]) -> None:
        """Add an id to a destination's window (pinning `files`), letting the oldest go."""
        window = self.dedup.setdefault(info.name, deque())
        window.append((info.dedup_next, dedup_id, files))
        info.dedup_next += 1
        for f in files:
            self.pin(f)
        while len(window) > self.dedup_window:
            for f in window.popleft()[2]:
                self.unpin(f)
        self._dirty_dedup.add(info.name)

    def dedup_clear(self, name: str) -> None:
        """Empty a destination's window."""
        for _, _, files in self.dedup.pop(name, ()):
            for f in files:
                self.unpin(f)
        self._dirty_dedup.add(name)

    def dedup_drop(self, name: str) -> None:
        """A destination was deleted: empty its window and drop its keys from the index now, as
        one created again restarts its window ordinals."""
        self.dedup_clear(name)
        self._flush_dedup(name)
        self._dirty_dedup.discard(name)

    # -- sequences held ----------------------------------------------------------------------------

    def hold_seq(self, name: str, seq: int) -> None:
        """Keep `seq` as the destination's last sequence held in the index alone."""
        if seq > self.held_seqs.get(name, 0):
            self.held_seqs[name] = seq
            self._held_dirty = True

    def forget_held(self, name: str) -> None:
        """Drop the destination's sequence held in the index alone."""
        if self.held_seqs.pop(name, None) is not None:
            self._held_dirty = True

    def take_held(self) -> dict[str, int]:
        """The sequences held in the index alone, forgotten here (a record now carries them)."""
        held = self.held_seqs
        if held:
            self.held_seqs = {}
            self._held_dirty = True
        return held
