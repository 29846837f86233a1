"""Garbage collection, archiving and compaction of data files (run on the writer thread).

A file may go when it lies wholly before the index checkpoint, nothing pins it (`FileInfo.pins`),
and every file it depends on is already gone (`FileInfo.deps`, so a remove never outlives the
message it removed while a rebuild could still see that message). It is deleted, or moved to
`archive/` (truncated to its data) when archiving is on.

Compaction goes further than KahaDB: a file before the checkpoint whose live bytes are below
`compaction_live_ratio` of its data has what pins it rewritten at the head (live messages as new
ADD records marked as copies; current subscription and destination state as SUB_PUT / DEST_STATE),
and the index moved to the copies. Order, for crash safety: the copies are written and synced, then
the index is committed, and only then does collection delete the old file. A crash before the
commit leaves duplicates that replay resolves to the newer copy (an ADD of an existing key
replaces it); a crash after it leaves an unpinned old file that the next collection removes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.errors import CorruptionError
from sluice.store.journal import format as fmt
from sluice.store.journal.indexcodec import MsgLoc, dkey
from sluice.store.journal.ops import Op
from sluice.store.journal.scan import parse_add

if TYPE_CHECKING:
    from sluice.store.journal.writer import Writer

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


def collect(writer: Writer, *, compact: bool = True) -> GcResult:
    """Checkpoint, compact what is worth it, then delete or archive what nothing needs."""
    result = GcResult()
    writer.checkpoint()
    if compact:
        targets = compaction_targets(writer)
        if targets:
            ops = _copy_ops(writer, targets)
            writer.write_durable(ops)
            writer.checkpoint()
            result.compacted = targets
            result.moved_messages = sum(1 for op in ops if op.rtype == fmt.RecordType.ADD)
            with writer.lock:
                writer.stats.compacted_files += len(targets)
    retire = deletable(writer)
    if retire:
        writer.retire_files(retire, writer.config.archive and writer.durable)
        if writer.config.archive and writer.durable:
            result.archived = retire
        else:
            result.deleted = retire
        writer.checkpoint()
    for line in result.lines():
        log.info("journal gc: %s", line)
    return result


def deletable(writer: Writer) -> list[int]:
    """Files that may go now, ascending."""
    state = writer.state
    checkpoint_file = writer.head.file_no
    remaining = set(state.files)
    out = []
    for file_no in sorted(state.files):
        if file_no >= checkpoint_file:
            break
        fi = state.files[file_no]
        if fi.pins == 0 and fi.tx_pins == 0 and not (fi.deps & remaining):
            out.append(file_no)
            remaining.discard(file_no)
    return out


def compaction_targets(writer: Writer) -> list[int]:
    """Old, pinned files whose live share is below the configured ratio, within a byte budget."""
    state = writer.state
    ratio = writer.config.compaction_live_ratio
    checkpoint_file = writer.head.file_no
    out: list[int] = []
    budget = MAX_COMPACTION_BYTES
    for file_no in sorted(state.files):
        if file_no >= checkpoint_file:
            break
        fi = state.files[file_no]
        if fi.pins == 0 or fi.tx_pins:
            continue
        if fi.live_bytes >= ratio * max(fi.data_bytes, 1):
            continue
        if out and fi.live_bytes > budget:
            break
        out.append(file_no)
        budget -= fi.live_bytes
    return out


def _copy_ops(writer: Writer, targets: list[int]) -> list[Op]:
    state = writer.state
    txn = state.index.txn
    msgs_db, rev_db = state.index.dbs[b"msgs"], state.index.dbs[b"rev"]
    reader = writer.reader_for_gc()
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
            path = str(writer.journal_dir / f"db-{loc.file_no}.log")
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
                with writer.lock:
                    writer.stats.damaged_records += 1
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
