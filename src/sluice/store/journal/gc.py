"""Garbage collection, archiving and compaction of data files: what may go and what to copy.

The functions here decide; `maintenance.Maintenance.collect`, on the writer thread, carries the
plan out.

A file may go when it lies wholly before the index checkpoint, nothing pins it (`FileInfo.pins`),
and every file it depends on is already gone (`FileInfo.deps`, so a remove never outlives the
message it removed while a rebuild could still see that message). It is deleted, or moved to
`archive/` (truncated to its data) when archiving is on.

Compaction goes further than KahaDB: a file before the checkpoint whose live bytes are below
`compaction_live_ratio` of its data has what pins it rewritten at the head (live messages as new
ADD records marked as copies; current subscription and destination state as SUB_PUT / DEST_STATE),
and the index moved to the copies. A file holding a message that an open transaction acknowledges
is left alone until the transaction ends: the copy would land after the ack, and the two files
could come to depend on each other. Order, for crash safety: the copies are written and synced, then
the index is committed, and only then does collection delete the old file. A crash before the
commit leaves duplicates that replay resolves to the newer copy (an ADD of an existing key
replaces it); a crash after it leaves an unpinned old file that the next collection removes.

Before files go, a FILES_RETIRED record naming every file collected so far is written and synced
at the head, so a rebuild of the index from the journal alone can tell a gap that collection made
(an old file still pinned, later ones gone) from a data file that was lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import CorruptionError
from sluice.store.journal import format as fmt
from sluice.store.journal.files import FileReader
from sluice.store.journal.indexcodec import MsgLoc, dkey
from sluice.store.journal.ops import Op
from sluice.store.journal.scan import parse_add
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

# Bound on the live bytes one collection rewrites, so the writer never stalls for long.
MAX_COMPACTION_BYTES = 64 * 1024 * 1024


@dataclass
class GcResult:
    """What one collection did."""

    deleted: list[int] = field(default_factory=list)
    archived: list[int] = field(default_factory=list)
    compacted: list[int] = field(default_factory=list)
    moved_messages: int = 0
    damaged_records: int = 0

    def lines(self) -> list[str]:
        """Human-readable summary."""
        out = []
        if self.compacted:
            out.append(
                f"compacted {len(self.compacted)} files ({self.moved_messages} messages moved): "
                + ", ".join(f"db-{n}.log" for n in self.compacted)
            )
        if self.deleted:
            out.append("deleted " + ", ".join(f"db-{n}.log" for n in self.deleted))
        if self.archived:
            out.append("archived " + ", ".join(f"db-{n}.log" for n in self.archived))
        return out


def deletable(state: JournalState, checkpoint_file: int) -> list[int]:
    """Files that may go now, in an order that deletes what a file depends on before it: before
    `checkpoint_file`, unpinned, with every file they depend on already gone or going first.

    A dependency may point to a newer file (a transacted remove whose message compaction moved
    forward before the commit), so the scan repeats until nothing more can go."""
    remaining = set(state.files)
    out: list[int] = []
    changed = True
    while changed:
        changed = False
        for file_no in sorted(remaining):
            if file_no >= checkpoint_file:
                break
            fi = state.files[file_no]
            if fi.pins == 0 and fi.tx_pins == 0 and not (fi.deps & remaining):
                out.append(file_no)
                remaining.discard(file_no)
                changed = True
    return out


def retired_after(state: JournalState, going: list[int], head_file: int) -> fmt.FilesRetired:
    """The FILES_RETIRED record to write before `going` is removed: every file number below the
    head that no longer exists, or is about to stop existing."""
    kept = set(state.files).difference(going)
    return fmt.FilesRetired.of(n for n in range(1, head_file) if n not in kept)


def compaction_targets(state: JournalState, checkpoint_file: int, ratio: float) -> list[int]:
    """Old, pinned files whose live share is below `ratio`, within a byte budget, and that may
    go once compacted: everything they depend on is gone, or goes in the same collection (an
    unpinned file, or another target, deleted first). A chain of files, each holding removes of
    what the one before held, is so compacted and collected in one round, not one per round."""
    out: list[int] = []
    remaining = set(state.files)
    budget = MAX_COMPACTION_BYTES
    # A message an open transaction removes stays where it is: a copy would land in a file
    # newer than the remove, which then depends on it at the commit, while the copy's file may
    # hold removes of what the remove's file holds. The two would wait for each other for ever.
    tx_removed = state.tx_removed_files()
    changed = True
    while changed:
        changed = False
        for file_no in sorted(remaining):
            if file_no >= checkpoint_file:
                break
            fi = state.files[file_no]
            if fi.tx_pins or file_no in tx_removed:
                continue
            if fi.deps & remaining:
                # It could not go once compacted: the messages' old records would stay behind
                # their copies, and a rebuild could see them after the copies and their removes
                # are gone.
                continue
            if fi.pins:
                if fi.live_bytes >= ratio * max(fi.data_bytes, 1):
                    continue
                if out and fi.live_bytes > budget:
                    continue
                out.append(file_no)
                budget -= fi.live_bytes
            # An unpinned file goes as soon as what it depends on has gone.
            remaining.discard(file_no)
            changed = True
    return sorted(out)


def copy_ops(
    state: JournalState, reader: FileReader, journal_dir: Path, targets: list[int], result: GcResult
) -> list[Op]:
    """The records that take over what pins `targets`: live messages as copies, subscription
    and destination state as SUB_PUT / DEST_STATE. A damaged message record is dropped (a
    REMOVE) and counted in `result`, as `load` drops it, so one never stops compaction."""
    txn = state.index.txn
    msgs_db, rev_db = state.index.dbs[b"msgs"], state.index.dbs[b"rev"]
    ops: list[Op] = []
    seen: set[bytes] = set()
    wanted = set(targets)
    names = {dkey(name): name for name in state.dests}
    for file_no in targets:
        prefix = file_no.to_bytes(4, "big")
        cur = txn.cursor(db=rev_db)
        keys = []
        if cur.set_range(prefix):
            for key in cur.iternext(keys=True, values=False):
                if key[:4] != prefix:
                    break
                keys.append(bytes(key[4:]))
        for mkey in keys:
            if mkey in seen:
                continue
            seen.add(mkey)
            raw = txn.get(mkey, db=msgs_db)
            if raw is None:
                continue
            loc = MsgLoc.decode(raw)
            name = names.get(mkey[:16])
            if name is None:
                continue
            seq = int.from_bytes(mkey[16:], "big")
            path = str(journal_dir / f"db-{loc.file_no}.log")
            try:
                data = reader.read(loc.file_no, loc.offset, loc.length)
                message = parse_add(data, path, loc.offset, loc.length, destination=name, seq=seq)
            except CorruptionError as exc:
                # Dropped as `load` drops it, so one damaged record never stops compaction.
                log.error(
                    "journal gc: message %d of %s dropped, its record is damaged: %s",
                    seq,
                    name,
                    exc,
                )
                result.damaged_records += 1
                ops.append(Op.of(fmt.Remove(0, name, seq)))
                continue
            message.seq = seq
            prefix_bytes, body, meta = fmt.encode_add(message, copy=True)
            ops.append(Op(fmt.RecordType.ADD, meta, [prefix_bytes, body], None))
    for sub in state.subs.values():
        if sub.pin in wanted or sub.put_pin in wanted:
            ops.append(
                Op.of(
                    fmt.SubPut(sub.client_id, sub.name, sub.destination, sub.selector, sub.cursor)
                )
            )
    for name, info in state.dests.items():
        dedup_files = {f for _, _, files in state.dedup.get(name, ()) for f in files}
        if info.seq_pin in wanted or info.mark_pin in wanted or dedup_files & wanted:
            ops.append(Op.of(state.dest_state_record(name)))
    return ops
