"""Applying journal records to the index: one code path for live writes, replay and rebuild.

`JournalState` is the index's view of the journal, updated record by record (`apply`). Per-message
entries (messages, their reverse keys by file, open transactions' records) go straight into the
LMDB write transaction; the small tables (destinations, subscriptions, files, dedup windows) live
in memory in `tables.Tables` and are written to the index at each checkpoint (`flush`). It also
notes the sequences that cancelled adds used, for the next checkpoint to write. Used by one thread
at a time (recovery, then the writer thread).

Liveness rules kept here are what make garbage collection safe, including for a later rebuild of
the index from whatever files remain (see `FileInfo`): a record that removes or supersedes state
makes its file depend on the files holding what it removed, so the remover never goes first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sluice.store.api import RecoveredDestination, RecoveredSubscription
from sluice.store.journal import format as fmt
from sluice.store.journal.index import Index
from sluice.store.journal.indexcodec import (
    DestInfo,
    FileInfo,
    MsgLoc,
    SubInfo,
    decode_tx_add,
    decode_tx_remove,
    dkey,
    encode_tx_add,
    encode_tx_remove,
    file_key,
    msg_key,
    rev_key,
)
from sluice.store.journal.tables import MAX_SEQ, DedupEntry, Tables

_TX_ADD = b"\x00"
_TX_REMOVE = b"\x01"
_TX_BEGIN = b"\x02"


class JournalState:
    """The index's view of the journal, updated record by record."""

    def __init__(self, index: Index, dedup_window: int) -> None:
        self.index = index
        self.dedup_window = dedup_window
        self.tables = Tables(index, dedup_window)
        self._cancelled_seqs: dict[str, int] = {}
        self._db = index.dbs
        self._clear()

    def _clear(self) -> None:
        self.tables.clear()
        self.open_txs: set[int] = set()
        self.next_txno = 1
        self.updates = 0
        self.problems: list[str] = []

    # The tables, as collection and recovery read them.

    @property
    def dests(self) -> dict[str, DestInfo]:
        """Destinations by name."""
        return self.tables.dests

    @property
    def subs(self) -> dict[tuple[str, str], SubInfo]:
        """Durable subscriptions by (client id, name)."""
        return self.tables.subs

    @property
    def files(self) -> dict[int, FileInfo]:
        """Data files by number."""
        return self.tables.files

    @property
    def dedup(self) -> dict[str, deque[DedupEntry]]:
        """Dedup windows by destination, oldest first."""
        return self.tables.dedup

    @property
    def dirty(self) -> bool:
        """Whether anything changed since the last flush."""
        return bool(self.updates or self.tables.dirty)

    # -- loading and saving ------------------------------------------------------------------------

    def reload(self) -> None:
        """Forget everything since the last commit and read the tables again (inside a new
        write transaction): the commit failed and LMDB dropped what it held. Sequences of
        cancelled adds not yet written stay noted."""
        self._clear()
        self.load()

    def load(self) -> None:
        """Read the tables and the open transactions from the index (inside its write
        transaction)."""
        self.tables.load()
        txn = self.index.txn
        for key in txn.cursor(db=self._db[b"tx"]).iternext(keys=True, values=False):
            self.open_txs.add(int.from_bytes(key[:8], "big"))

    def flush(self, checkpoint: tuple[int, int], *, ok: bool = True) -> None:
        """Write the changed tables and the checkpoint position into the write transaction."""
        self.tables.flush()
        self.index.write_meta(checkpoint, self.next_txno, ok=ok)
        self.updates = 0

    # -- what recovery hands to the core -----------------------------------------------------------

    def recovered(self) -> tuple[list[RecoveredDestination], list[RecoveredSubscription]]:
        """The destinations and durable subscriptions, as the core sees them after `open()`."""
        dests = [
            RecoveredDestination(
                name=d.name,
                last_seq=d.last_seq,
                message_count=d.count,
                message_bytes=d.message_bytes,
                dispatch_mark=d.dispatch_mark,
                dedup_ids=[i for _, i, _ in self.tables.dedup.get(d.name, ())],
            )
            for d in sorted(self.tables.dests.values(), key=lambda d: d.name)
        ]
        subs = [
            RecoveredSubscription(s.client_id, s.name, s.destination, s.selector, s.cursor)
            for s in sorted(self.tables.subs.values(), key=lambda s: (s.client_id, s.name))
        ]
        return dests, subs

    # -- files -------------------------------------------------------------------------------------

    def file_seen(self, file_no: int, data_bytes: int) -> None:
        """A data file exists and holds valid data up to `data_bytes`."""
        self.tables.file_seen(file_no, data_bytes)

    def files_gone(self, file_nos: Iterable[int]) -> None:
        """Data files were deleted or archived: forget them everywhere."""
        self.tables.files_gone(file_nos)

    # -- applying records --------------------------------------------------------------------------

    def apply(self, rtype: int, record: fmt.Record, file_no: int, offset: int, length: int) -> None:
        """Reflect one journal record, found at (file, offset) with this whole length."""
        self.updates += 1
        if rtype == fmt.RecordType.ADD:
            assert isinstance(record, fmt.AddMeta)
            loc = MsgLoc(file_no, offset, length, record.size, record.timestamp_ms)
            if record.txno:
                self._tx_add(record, loc)
            else:
                self._put_message(record.destination, record.seq, loc, record.dedup_id)
        elif isinstance(record, fmt.Remove):
            if record.txno:
                self._tx_remove(record, file_no, offset)
            else:
                self._remove_message(record.destination, record.seq, (file_no,))
        elif isinstance(record, fmt.RemoveRange):
            self._remove_range(record.destination, record.upto_seq, file_no)
        elif isinstance(record, fmt.TxBegin):
            self._note_txno(record.txno)
            self.index.put(
                b"tx", record.txno.to_bytes(8, "big") + _TX_BEGIN, file_no.to_bytes(4, "big")
            )
        elif isinstance(record, fmt.TxCommit):
            self._close_tx(record.txno, file_no, record.seqs)
        elif isinstance(record, fmt.TxAbort):
            self._close_tx(record.txno, file_no, None)
        elif isinstance(record, fmt.SubPut):
            self._sub_put(record, file_no)
        elif isinstance(record, fmt.SubCursor):
            self._sub_cursor(record, file_no)
        elif isinstance(record, fmt.SubDelete):
            self._sub_delete(record, file_no)
        elif isinstance(record, fmt.DestDelete):
            self._dest_delete(record.destination, file_no)
        elif isinstance(record, fmt.DispatchMark):
            info = self.tables.dest(record.destination)
            info.dispatch_mark = record.seq
            info.mark_pin = self.tables.move_pin(info.mark_pin, file_no)
            info.files.add(file_no)
        elif isinstance(record, fmt.DestState):
            self._dest_state(record, file_no)
        elif isinstance(record, fmt.DestSeq):
            info = self.tables.dest(record.destination)
            # Equal too: a sequence the index held alone (`hold_seqs`) is now in this record.
            if record.seq >= info.last_seq:
                info.last_seq = record.seq
                info.seq_pin = self.tables.move_pin(info.seq_pin, file_no)
                info.files.add(file_no)
        # FILE_HEADER and CHECKPOINT change nothing.

    # -- sequences that cancelled adds used -------------------------------------------------------

    def note_cancelled(self, name: str, seq: int) -> None:
        """An add was cancelled before it was written; its sequence was used all the same, so
        the next checkpoint writes a DEST_SEQ for it (`take_cancelled_seqs`)."""
        info = self.tables.dests.get(name)
        if (info is None or seq > info.last_seq) and seq > self._cancelled_seqs.get(name, 0):
            self._cancelled_seqs[name] = seq

    def take_cancelled_seqs(self) -> list[fmt.DestSeq]:
        """The DEST_SEQ records the next checkpoint must write: cancelled sequences, and the
        ones held in the index only (`hold_seqs`) that are still the last."""
        dests = self.tables.dests
        wanted = {
            name: seq
            for name, seq in self._cancelled_seqs.items()
            if name not in dests or seq > dests[name].last_seq
        }
        for name, seq in self.tables.take_held().items():
            info = dests.get(name)
            if info is not None and info.last_seq == seq and seq > wanted.get(name, 0):
                wanted[name] = seq
        self._cancelled_seqs.clear()
        return [fmt.DestSeq(name, seq) for name, seq in wanted.items()]

    def hold_seqs(self, records: Iterable[fmt.DestSeq]) -> None:
        """The journal had no room for these DEST_SEQ records: the index holds the sequences
        (in the destinations' last sequence, and in meta until a later checkpoint writes the
        records), so that a clean close never lets them be handed out again. A rebuild of the
        index takes them over from the old index when it can read it (`Index.peek_held_seqs`);
        from the journal alone it does not see them."""
        for record in records:
            info = self.tables.dest(record.destination)
            if record.seq > info.last_seq:
                info.last_seq = record.seq
            self.tables.hold_seq(record.destination, record.seq)

    # -- messages ----------------------------------------------------------------------------------

    def _put_message(self, name: str, seq: int, loc: MsgLoc, dedup_id: str) -> None:
        index = self.index
        tables = self.tables
        info = tables.dest(name)
        mkey = msg_key(dkey(name), seq)
        old = index.put(b"msgs", mkey, loc.encode())
        if old is not None:
            # A compaction copy (or a replayed re-add) replaces the entry in place.
            old_loc = MsgLoc.decode(old)
            self._release(mkey, old_loc)
            info.count -= 1
            info.message_bytes -= old_loc.size
        files = loc.files()
        for f in files:
            index.put_marker(b"rev", rev_key(f, mkey))
            tables.pin(f)
            info.files.add(f)
        fi = tables.files[loc.file_no]
        fi.live_msgs += 1
        fi.live_bytes += loc.length
        info.count += 1
        info.message_bytes += loc.size
        if seq >= info.last_seq:
            info.last_seq = seq
            # The ADD names the destination (a TX_COMMIT holds only sequences), and the commit's
            # file depends on the ADD's (`_close_tx`), so it stays as long as this pin does.
            info.seq_pin = tables.move_pin(info.seq_pin, loc.file_no)
        if dedup_id and self.dedup_window > 0:
            tables.dedup_push(info, dedup_id, files)

    def messages_in(self, file_no: int, start: int, end: int) -> list[bytes]:
        """Keys of the live messages whose ADD record lies in [start, end) of a file."""
        txn = self.index.txn
        msgs = self._db[b"msgs"]
        prefix = file_key(file_no)
        out = []
        cur = txn.cursor(db=self._db[b"rev"])
        if cur.set_range(prefix):
            for key in cur.iternext(keys=True, values=False):
                if key[:4] != prefix:
                    break
                mkey = bytes(key[4:])
                raw = txn.get(mkey, db=msgs)
                if raw is None:
                    continue
                loc = MsgLoc.decode(raw)
                if loc.file_no == file_no and start <= loc.offset < end:
                    out.append(mkey)
        return out

    def drop_lost(self, keys: Iterable[bytes]) -> list[tuple[str, int, MsgLoc]]:
        """Forget messages whose records are lost (repair); returns (destination, seq,
        location) of each one dropped."""
        names = {dkey(name): name for name in self.tables.dests}
        out = []
        for mkey in keys:
            name = names.get(mkey[:16])
            raw = self.index.txn.get(mkey, db=self._db[b"msgs"])
            if name is None or raw is None:
                continue
            seq = int.from_bytes(mkey[16:], "big")
            self._remove_message(name, seq, ())
            out.append((name, seq, MsgLoc.decode(raw)))
        return out

    def _release(self, mkey: bytes, loc: MsgLoc) -> None:
        for f in loc.files():
            self.index.delete(b"rev", rev_key(f, mkey))
            self.tables.unpin(f)
        self.tables.message_released(loc.file_no, loc.length)

    def _remove_message(self, name: str, seq: int, record_files: tuple[int, ...]) -> None:
        mkey = msg_key(dkey(name), seq)
        raw = self.index.delete(b"msgs", mkey)
        if raw is None:
            return
        loc = MsgLoc.decode(raw)
        self._release(mkey, loc)
        info = self.tables.dest(name)
        info.count -= 1
        info.message_bytes -= loc.size
        for f in record_files:
            self.tables.add_deps(f, loc.files())

    def _remove_range(self, name: str, upto_seq: int, file_no: int) -> int:
        info = self.tables.dests.get(name)
        if info is None:
            return 0
        dk = dkey(name)
        cur = self.index.txn.cursor(db=self._db[b"msgs"])
        removed = 0
        if cur.set_range(msg_key(dk, 0)):
            while True:
                key = cur.key()
                if not key or key[:16] != dk or int.from_bytes(key[16:], "big") > upto_seq:
                    break
                loc = MsgLoc.decode(cur.value())
                self._release(key, loc)
                info.count -= 1
                info.message_bytes -= loc.size
                self.tables.add_deps(file_no, loc.files())
                removed += 1
                if not self.index.delete_at(b"msgs", cur):
                    break
        self.tables.dest_changed(name)
        return removed

    # -- transactions ------------------------------------------------------------------------------

    def _note_txno(self, txno: int) -> None:
        self.open_txs.add(txno)
        if txno >= self.next_txno:
            self.next_txno = txno + 1

    def _tx_add(self, record: fmt.AddMeta, loc: MsgLoc) -> None:
        self._note_txno(record.txno)
        key = record.txno.to_bytes(8, "big") + _TX_ADD + record.ordinal.to_bytes(4, "big")
        self.index.put(b"tx", key, encode_tx_add(loc, record.destination, record.dedup_id))
        self.tables.tx_pin(loc.file_no)

    def _tx_remove(self, record: fmt.Remove, file_no: int, offset: int) -> None:
        self._note_txno(record.txno)
        key = (
            record.txno.to_bytes(8, "big")
            + _TX_REMOVE
            + file_no.to_bytes(4, "big")
            + offset.to_bytes(8, "big")
        )
        self.index.put(b"tx", key, encode_tx_remove(record.seq, file_no, record.destination))
        self.tables.tx_pin(file_no)

    def tx_removed_files(self) -> set[int]:
        """Files holding the records (ADD or TX_COMMIT) of live messages that an open
        transaction removes."""
        txn = self.index.txn
        msgs = self._db[b"msgs"]
        out: set[int] = set()
        for key, value in txn.cursor(db=self._db[b"tx"]):
            if key[8:9] != _TX_REMOVE:
                continue
            seq, _rfile, name = decode_tx_remove(value)
            raw = txn.get(msg_key(dkey(name), seq), db=msgs)
            if raw is not None:
                out.update(MsgLoc.decode(raw).files())
        return out

    def _close_tx(self, txno: int, file_no: int, seqs: tuple[int, ...] | None) -> None:
        """Commit (with `seqs`) or abort a transaction whose record is in `file_no`."""
        if txno >= self.next_txno:
            self.next_txno = txno + 1
        self.open_txs.discard(txno)
        cur = self.index.txn.cursor(db=self._db[b"tx"])
        prefix = txno.to_bytes(8, "big")
        tx_files: set[int] = set()
        removes: list[tuple[str, int, int]] = []
        missing = 0
        if cur.set_range(prefix):
            while True:
                key = cur.key()
                if not key or key[:8] != prefix:
                    break
                kind = key[8:9]
                if kind == _TX_ADD:
                    loc, name, dedup_id = decode_tx_add(cur.value())
                    self.tables.tx_unpin(loc.file_no)
                    tx_files.add(loc.file_no)
                    ordinal = int.from_bytes(key[9:13], "big")
                    if seqs is not None:
                        if ordinal < len(seqs):
                            loc.commit_file = file_no
                            self._put_message(name, seqs[ordinal], loc, dedup_id)
                        else:
                            missing += 1
                elif kind == _TX_REMOVE:
                    seq, rfile, name = decode_tx_remove(cur.value())
                    self.tables.tx_unpin(rfile)
                    tx_files.add(rfile)
                    removes.append((name, seq, rfile))
                else:
                    tx_files.add(int.from_bytes(cur.value(), "big"))
                if not self.index.delete_at(b"tx", cur):
                    break
        if seqs is not None:
            for name, seq, rfile in removes:
                self._remove_message(name, seq, (rfile, file_no))
        if missing:
            self.problems.append(
                f"transaction {txno}: {missing} adds beyond the {len(seqs or ())} committed "
                "sequences were dropped"
            )
        # The closing record should outlive the transaction's records, or a rebuild would see
        # them without it (and abort what was already closed: harmless, but reported). Not when
        # a record file already depends on the closing one (a transacted remove of a message
        # that compaction copied next to the commit): the two would wait for each other for
        # ever, and the remove's own dependency is the one correctness needs.
        files = self.tables.files
        self.tables.add_deps(
            file_no, (f for f in tx_files if f not in files or file_no not in files[f].deps)
        )

    # -- subscriptions and destinations ------------------------------------------------------------

    def _sub_put(self, record: fmt.SubPut, file_no: int) -> None:
        key = (record.client_id, record.name)
        sub = self.tables.subs.get(key)
        if sub is None:
            sub = self.tables.subs[key] = SubInfo(
                record.client_id, record.name, record.destination, record.selector, record.cursor
            )
        else:
            sub.destination = record.destination
            sub.selector = record.selector
            sub.cursor = record.cursor
        sub.pin = self.tables.move_pin(sub.pin, file_no)
        sub.put_pin = self.tables.move_pin(sub.put_pin, file_no)
        sub.files.add(file_no)
        self.tables.sub_changed(key)

    def _sub_cursor(self, record: fmt.SubCursor, file_no: int) -> None:
        key = (record.client_id, record.name)
        sub = self.tables.subs.get(key)
        if sub is None:
            return
        sub.cursor = record.cursor
        sub.pin = self.tables.move_pin(sub.pin, file_no)
        sub.files.add(file_no)
        self.tables.sub_changed(key)

    def _sub_delete(self, record: fmt.SubDelete, file_no: int) -> None:
        key = (record.client_id, record.name)
        sub = self.tables.subs.pop(key, None)
        if sub is None:
            return
        self.tables.unpin(sub.pin)
        self.tables.unpin(sub.put_pin)
        self.tables.add_deps(file_no, sub.files)
        self.tables.sub_changed(key)

    def _dest_delete(self, name: str, file_no: int) -> None:
        # Sequences its cancelled adds used die with it: no DEST_SEQ may bring it back.
        self._cancelled_seqs.pop(name, None)
        self.tables.forget_held(name)
        # Even when the index does not know the destination (a rebuild after collection took
        # every file of its records): an open transaction's remove of its old message must not
        # take the new message of that sequence at the commit.
        self._drop_tx_removes(name, file_no)
        info = self.tables.dests.get(name)
        if info is None:
            return
        self._remove_range(name, MAX_SEQ, file_no)
        for pin in (info.seq_pin, info.mark_pin):
            if pin:
                self.tables.unpin(pin)
        self.tables.dedup_drop(name)
        self.tables.add_deps(file_no, info.files)
        del self.tables.dests[name]
        self.tables.dest_changed(name)

    def _drop_tx_removes(self, name: str, file_no: int) -> None:
        """Open transactions' removes of a deleted destination's messages acknowledge nothing
        any more: a commit must not take a message of the destination created again under the
        same sequence. The delete's file outlives the dropped records: a rebuild that saw them
        without it would apply them at the commit."""
        cur = self.index.txn.cursor(db=self._db[b"tx"])
        if not cur.first():
            return
        while True:
            key = cur.key()
            if not key:
                break
            if key[8:9] == _TX_REMOVE:
                _seq, rfile, dest = decode_tx_remove(cur.value())
                if dest == name:
                    self.tables.tx_unpin(rfile)
                    self.tables.add_deps(file_no, (rfile,))
                    if not self.index.delete_at(b"tx", cur):
                        break
                    continue
            if not cur.next():
                break

    def _dest_state(self, record: fmt.DestState, file_no: int) -> None:
        info = self.tables.dest(record.destination)
        info.last_seq = record.last_seq
        info.dispatch_mark = record.dispatch_mark
        # A zero says nothing a rebuild needs: the record that set it need not stay either.
        if record.last_seq:
            info.seq_pin = self.tables.move_pin(info.seq_pin, file_no)
        elif info.seq_pin:
            self.tables.unpin(info.seq_pin)
            info.seq_pin = 0
        if record.dispatch_mark:
            info.mark_pin = self.tables.move_pin(info.mark_pin, file_no)
        elif info.mark_pin:
            self.tables.unpin(info.mark_pin)
            info.mark_pin = 0
        self.tables.dedup_clear(record.destination)
        if self.dedup_window > 0:
            for dedup_id in record.dedup_ids[-self.dedup_window :]:
                self.tables.dedup_push(info, dedup_id, (file_no,))
        info.files.add(file_no)

    def dest_state_record(self, name: str) -> fmt.DestState:
        """The record that re-asserts a destination's state at the head (for compaction)."""
        info = self.tables.dests[name]
        ids = tuple(i for _, i, _ in self.tables.dedup.get(name, ()))
        return fmt.DestState(name, info.last_seq, info.dispatch_mark, ids)
