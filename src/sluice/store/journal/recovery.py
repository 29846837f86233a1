"""Opening the journal: check the index, verify the journal, replay it from the checkpoint.

The index is used when it passes every check of `Index.open_checked` (clean-close checksum,
the LMDB file read as a file, every entry read back against the digest written with it), its
checkpoint lies within the journal, and the journal backs every message it holds. The journal
is then read from the start: records before the checkpoint are only checked (CRC), the rest are
replayed into the index (the redo role). With `verify_journal = after_checkpoint` only the
replayed part is read. Any other index is rebuilt by replaying every data file.

Damage:

- in the newest file, with no valid record after it: a torn tail (a write the crash interrupted,
  never acknowledged): cut off (zeroed) and reported with file, offset and bytes dropped;
- anywhere else (or a data file or record the index needs that is gone): `CorruptionError`
  naming the file and offset, unless `StoreConfig.repair`: then the damaged bytes are set aside
  and padded over (`damage.py`), and the report names every message lost (destination, sequence,
  message id where readable) and every other damaged record. Before the checkpoint the index
  knows exactly which live messages were there and drops them; after it, the damaged records
  were never applied, and an ADD counts as lost unless the journal removes it later.

Transactions still open at the end are aborted (an abort record is written) and counted.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from sluice.config import JournalVerify, StoreConfig
from sluice.errors import CorruptionError
from sluice.store.journal import damage as dmg
from sluice.store.journal import format as fmt
from sluice.store.journal.files import (
    HeadFile,
    create_file,
    file_path,
    fsync_dir,
    list_files,
    remove_spares,
)
from sluice.store.journal.index import Index
from sluice.store.journal.indexcodec import IndexCorrupt
from sluice.store.journal.scan import Damage, FileScan, resync
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

# While rebuilding, commit every this many records so LMDB's dirty pages stay bounded.
_REBUILD_COMMIT_RECORDS = 200_000


@dataclass
class Recovered:
    """What `recover` hands to the store."""

    state: JournalState
    store_id: bytes
    report: list[str] = field(default_factory=list)
    head: HeadFile | None = None
    replayed_records: int = 0
    verified_records_bytes: int = 0
    rebuilt: bool = False
    # Damaged ADDs after the checkpoint, (destination, seq) -> report line: lost unless a later
    # record removes them.
    lost_adds: dict[tuple[str, int], str] = field(default_factory=dict)


class _IndexAhead(Exception):
    """The index's checkpoint is past the valid end of the journal."""


def _note(report: list[str], line: str) -> None:
    log.warning("%s", line)
    report.append(line)


def _store_id(journal_dir: Path, files: list[int]) -> bytes | None:
    for file_no in files:
        path = file_path(journal_dir, file_no)
        with open(path, "rb") as f:
            data = f.read(fmt.FILE_HEADER_RECORD_BYTES)
        if len(data) < fmt.FILE_HEADER_RECORD_BYTES:
            continue
        length, crc, rtype = fmt.HEADER.unpack_from(data, 0)
        payload = data[fmt.HEADER_BYTES :]
        if rtype != fmt.RecordType.FILE_HEADER or length != len(payload):
            continue
        if fmt.payload_crc(rtype, payload) != crc:
            continue
        try:
            header = fmt.decode(rtype, payload)
        except fmt.FormatError:
            continue
        assert isinstance(header, fmt.FileHeader)
        return header.store_id
    return None


def recover(
    config: StoreConfig,
    *,
    dedup_window: int,
    durable: bool,
    force_rebuild: bool = False,
) -> Recovered:
    """Open (or create) the journal and index under `config.data_dir`."""
    journal_dir = config.data_dir / "journal"
    index_dir = config.data_dir / "index"
    journal_dir.mkdir(parents=True, exist_ok=True)
    remove_spares(journal_dir)
    report: list[str] = []
    files = list_files(journal_dir)
    store_id = _store_id(journal_dir, files)
    if store_id is None and files:
        if len(files) == 1 and resync(file_path(journal_dir, files[0]).read_bytes(), 0) is None:
            # A first file whose creation never completed: nothing was ever acknowledged.
            file_path(journal_dir, files[0]).unlink()
            _note(report, f"{file_path(journal_dir, files[0])}: incomplete new journal removed")
            files = []
        elif config.repair:
            store_id = Index.peek_store_id(index_dir) or os.urandom(16)
            _note(report, "no data file has a valid header: repair rewrites them")
        else:
            first = file_path(journal_dir, files[0])
            raise CorruptionError("data file header is damaged", str(first), 0)
    new_store = store_id is None
    if store_id is None:
        store_id = os.urandom(16)
        create_file(file_path(journal_dir, 1), 1, store_id, config.journal_file_bytes, sync=durable)
        if durable:
            fsync_dir(journal_dir)
        files = [1]

    reason = "requested" if force_rebuild else ""
    if not force_rebuild and not new_store:
        sizes = {n: file_path(journal_dir, n).stat().st_size for n in files}
        try:
            index = Index.open_checked(
                index_dir, config.lmdb_map_bytes, store_id, durable=durable, file_sizes=sizes
            )
        except FileNotFoundError:
            reason = "index missing"
        except IndexCorrupt as exc:
            reason = f"index unusable: {exc}"
        else:
            try:
                return _recover_from_index(config, index, store_id, files, dedup_window, report)
            except (IndexCorrupt, lmdb.Error, _IndexAhead) as exc:
                reason = f"index unusable: {exc}"
                index.abort()
                index.env.close()
            except BaseException:
                index.abort()
                index.env.close()
                raise
    index = Index.create(index_dir, config.lmdb_map_bytes, store_id, durable=durable)
    recovered = _replay_all(config, index, store_id, files, dedup_window, report)
    if not new_store:
        _note(
            report,
            f"index rebuilt from {len(files)} journal files ({reason}); "
            f"{recovered.replayed_records} records replayed",
        )
    return recovered


def _recover_from_index(
    config: StoreConfig,
    index: Index,
    store_id: bytes,
    files: list[int],
    dedup_window: int,
    report: list[str],
) -> Recovered:
    journal_dir = config.data_dir / "journal"
    index.begin_write()
    state = JournalState(index, dedup_window)
    state.load()
    (cp_file, cp_offset), state.next_txno = index.read_meta()
    present = set(files)
    if cp_file not in present:
        path = file_path(journal_dir, cp_file)
        if not config.repair and cp_file > files[-1]:
            raise CorruptionError("the data file the index checkpoint is in is missing", str(path))
        raise _IndexAhead(f"checkpoint file {path} is missing")
    recovered = Recovered(state, store_id, report)
    _drop_outside(config, recovered)
    missing = [f for f in state.files if f not in present]
    for file_no in missing:
        if state.files[file_no].pins > 0:
            path = file_path(journal_dir, file_no)
            if not config.repair:
                raise CorruptionError("data file the index needs is missing", str(path))
            _note(report, f"{path}: missing; the state records it held stay in the index")
    state.files_gone(missing)
    for file_no in files:
        if file_no not in state.files and file_no < cp_file:
            # Not in the index and before the checkpoint: nothing in it is live.
            state.file_seen(file_no, 0)
    if config.verify_journal is JournalVerify.FULL:
        scanned, first_offset = files, 0
    else:
        scanned, first_offset = [f for f in files if f >= cp_file], cp_offset
    # Where the index knows each file's data to end: a journal that ends earlier lost data.
    known_ends = {f: state.files[f].data_bytes for f in files if f < cp_file and f in state.files}
    known_ends[cp_file] = cp_offset
    _replay(
        config, state, store_id, scanned, first_offset, (cp_file, cp_offset), recovered, known_ends
    )
    _finish(config, recovered)
    log.info(
        "journal opened at checkpoint db-%d.log:%d, %d records replayed, %d bytes verified",
        cp_file,
        cp_offset,
        recovered.replayed_records,
        recovered.verified_records_bytes,
    )
    return recovered


def _drop_outside(config: StoreConfig, recovered: Recovered) -> None:
    """Messages the index holds whose records the journal on disk no longer has."""
    outside = recovered.state.index.verified.outside
    if not outside:
        return
    journal_dir = config.data_dir / "journal"
    first = outside[0]
    path = str(file_path(journal_dir, first.loc.file_no))
    if not config.repair:
        raise CorruptionError(
            f"the index holds a message whose record is gone: {first.problem}",
            path,
            first.loc.offset,
        )
    dropped = recovered.state.drop_lost([o.key for o in outside])
    _note(
        recovered.report,
        f"{len(dropped)} messages dropped by repair: their records are gone "
        f"(first: {path} at offset {first.loc.offset}, {first.problem})",
    )
    _note_lost(recovered.report, [(name, seq, None) for name, seq, _loc in dropped])


def _note_lost(report: list[str], lost: list[tuple[str, int, str | None]]) -> None:
    for name, seq, message_id in lost[: dmg.MAX_LISTED_RECORDS]:
        _note(report, "  " + dmg.message_line(name, seq, message_id))
    if len(lost) > dmg.MAX_LISTED_RECORDS:
        _note(report, f"  and {len(lost) - dmg.MAX_LISTED_RECORDS} more lost messages")


def _replay_all(
    config: StoreConfig,
    index: Index,
    store_id: bytes,
    files: list[int],
    dedup_window: int,
    report: list[str],
) -> Recovered:
    index.begin_write()
    state = JournalState(index, dedup_window)
    recovered = Recovered(state, store_id, report, rebuilt=True)
    _replay(config, state, store_id, files, 0, (files[0], 0), recovered, {})
    _finish(config, recovered)
    return recovered


def _replay(
    config: StoreConfig,
    state: JournalState,
    store_id: bytes,
    files: list[int],
    start_offset: int,
    checkpoint: tuple[int, int],
    recovered: Recovered,
    known_ends: dict[int, int],
) -> None:
    """Read `files` (the first from `start_offset`): check records before `checkpoint`, apply
    the rest to the index; handle damage as the module docstring says. `known_ends`: where the
    index knows data to end in files before the checkpoint."""
    journal_dir = config.data_dir / "journal"
    for prev, file_no in itertools.pairwise(files):
        if file_no != prev + 1:
            raise CorruptionError(
                f"data files db-{prev + 1}.log to db-{file_no - 1}.log are missing",
                str(journal_dir),
            )
    head_file, head_offset = files[-1], 0
    for i, file_no in enumerate(files):
        newest = i == len(files) - 1
        path = file_path(journal_dir, file_no)
        start = start_offset if i == 0 else 0
        if file_no < checkpoint[0]:
            apply_from = 1 << 62
        elif file_no == checkpoint[0]:
            apply_from = checkpoint[1]
        else:
            apply_from = 0
        scan = FileScan(path, start, records_from=apply_from)
        if start > scan.size:
            raise _IndexAhead(f"checkpoint offset {start} is past the end of {path}")
        end = start
        cut = False
        for item in scan:
            if isinstance(item, Damage):
                if newest and item.resume is None and item.offset >= apply_from:
                    dropped = dmg.cut_tail(path, item)
                    _note(
                        recovered.report,
                        f"{path}: torn tail cut at offset {item.offset}, {dropped} bytes "
                        f"dropped ({item.reason})",
                    )
                    end = item.offset
                    cut = True
                    break
                if not config.repair:
                    raise CorruptionError(
                        f"damaged journal record: {item.reason}", str(path), item.offset
                    )
                skipped = item
                if item.offset == 0:
                    dmg.rewrite_header(path, file_no, store_id)
                    _note(recovered.report, f"{path}: damaged file header rewritten by repair")
                    end = fmt.FILE_HEADER_RECORD_BYTES
                    rest = item.resume if item.resume is not None else item.end
                    if rest <= end:
                        if item.resume is None:
                            break
                        continue
                    skipped = Damage(end, item.resume, item.end, item.reason)
                _repair(config, state, path, file_no, scan.data, skipped, apply_from, recovered)
                if item.resume is None:
                    end = skipped.offset  # zeroed: nothing valid follows
                    cut = True
                    break
                continue
            if item.offset == 0:
                try:
                    record = fmt.decode(item.rtype, item.payload)
                except fmt.FormatError:
                    record = None
                if not (
                    isinstance(record, fmt.FileHeader)
                    and record.file_no == file_no
                    and record.store_id == store_id
                ):
                    raise CorruptionError("data file header does not belong here", str(path), 0)
                end = item.length
                continue
            try:
                record = fmt.decode(item.rtype, item.payload)
            except fmt.FormatError as exc:
                if not config.repair:
                    raise CorruptionError(
                        f"malformed journal record: {exc}", str(path), item.offset
                    ) from exc
                after = item.offset + item.length
                bad = Damage(item.offset, after, after, f"malformed record: {exc}")
                _repair(config, state, path, file_no, scan.data, bad, apply_from, recovered)
                continue
            _forget_lost(recovered, record)
            state.apply(item.rtype, record, file_no, item.offset, item.length)
            recovered.replayed_records += 1
            end = item.offset + item.length
            if recovered.rebuilt and state.updates >= _REBUILD_COMMIT_RECORDS:
                state.flush((file_no, end), ok=False)
                state.index.commit(reopen=True)
        if not cut:
            end = max(end, scan.end_offset)
        recovered.verified_records_bytes += end - start
        known = known_ends.get(file_no, 0)
        if not cut and end < known:
            _short_file(config, state, path, file_no, end, known, recovered)
        elif file_no == checkpoint[0] and checkpoint[1] > end:
            raise _IndexAhead(f"checkpoint offset {checkpoint[1]} is past the valid end of {path}")
        if end == 0:
            if not newest:
                raise CorruptionError("data file has no valid header", str(path), 0)
            create_file(path, file_no, store_id, config.journal_file_bytes)
            end = fmt.FILE_HEADER_RECORD_BYTES
            _note(recovered.report, f"{path}: incomplete newest data file re-initialised")
        state.file_seen(file_no, end)
        head_file, head_offset = file_no, end
    recovered.head = HeadFile(
        journal_dir,
        store_id,
        config.journal_file_bytes,
        head_file,
        head_offset,
        sync_on_rollover=True,
        preallocator=None,
    )


def _repair(
    config: StoreConfig,
    state: JournalState,
    path: Path,
    file_no: int,
    data: bytes,
    item: Damage,
    apply_from: int,
    recovered: Recovered,
) -> None:
    """Skip one damaged stretch: say what it held and what is lost, then pad over it."""
    report = recovered.report
    stop = item.resume if item.resume is not None else item.end
    seen, unreadable = dmg.describe(data, item.offset, stop)
    copy = dmg.save_and_pad(config.data_dir, path, data, item)
    kept = f"; the bytes are kept in {copy}" if copy is not None else ""
    _note(
        report,
        f"{path}: damaged records skipped by repair at offset {item.offset}: "
        f"{stop - item.offset} bytes lost ({item.reason}){kept}",
    )
    ids = {r.offset: r.message_id for r in seen if r.rtype == fmt.RecordType.ADD}
    # Before the checkpoint the index knows which live messages were there.
    if item.offset < apply_from:
        dropped = state.drop_lost(state.messages_in(file_no, item.offset, stop))
        _note_lost(report, [(name, seq, ids.get(loc.offset)) for name, seq, loc in dropped])
    listed = 0
    for record in seen:
        applied = record.offset < apply_from
        if record.rtype == fmt.RecordType.ADD:
            if applied:
                continue  # what was live there, the index named above
            if record.destination is None:
                _note(report, f"  lost message: unreadable ADD record at offset {record.offset}")
                continue
            line = dmg.message_line(record.destination, record.seq, record.message_id, record.txno)
            if record.txno or not record.seq:
                _note(report, "  " + line)
            else:
                recovered.lost_adds[(record.destination, record.seq)] = line
            continue
        if listed < dmg.MAX_LISTED_RECORDS:
            _note(report, "  " + dmg.record_line(record, effect_kept=applied))
        listed += 1
    if unreadable:
        _note(report, f"  {unreadable} bytes could not be read as records")


def _short_file(
    config: StoreConfig,
    state: JournalState,
    path: Path,
    file_no: int,
    end: int,
    known: int,
    recovered: Recovered,
) -> None:
    """A data file's valid data ends before what the index holds from it: it was cut or
    zeroed after the index was written."""
    reason = f"valid data ends at offset {end}, the index holds data up to {known}"
    if not config.repair:
        raise CorruptionError(f"data file lost data: {reason}", str(path), end)
    dropped = state.drop_lost(state.messages_in(file_no, end, known))
    _note(recovered.report, f"{path}: {reason}; {known - end} bytes lost (repair goes on)")
    _note_lost(recovered.report, [(name, seq, None) for name, seq, _loc in dropped])


def _forget_lost(recovered: Recovered, record: fmt.Record) -> None:
    """A replayed record that removes a message whose damaged ADD was counted as lost."""
    lost = recovered.lost_adds
    if not lost:
        return
    if isinstance(record, fmt.Remove) and not record.txno:
        lost.pop((record.destination, record.seq), None)
    elif isinstance(record, fmt.RemoveRange | fmt.DestDelete):
        upto = record.upto_seq if isinstance(record, fmt.RemoveRange) else 1 << 64
        for key in [k for k in lost if k[0] == record.destination and k[1] <= upto]:
            del lost[key]


def _finish(config: StoreConfig, recovered: Recovered) -> None:
    """Report lost messages, abort transactions left open, commit the index at the head."""
    state = recovered.state
    head = recovered.head
    assert head is not None
    if recovered.lost_adds:
        lines = list(recovered.lost_adds.values())
        _note(recovered.report, f"{len(lines)} messages in damaged records are lost:")
        for line in lines[: dmg.MAX_LISTED_RECORDS]:
            _note(recovered.report, "  " + line)
        if len(lines) > dmg.MAX_LISTED_RECORDS:
            _note(recovered.report, f"  and {len(lines) - dmg.MAX_LISTED_RECORDS} more")
        recovered.lost_adds.clear()
    open_txs = sorted(state.open_txs)
    for txno in open_txs:
        record = fmt.TxAbort(txno)
        rtype, payload = fmt.encode(record)
        header, length = fmt.frame(rtype, (payload,))
        if not head.fits(length):
            state.file_seen(head.file_no, head.offset)
            head.rollover()
        location = (head.file_no, head.offset, length)
        head.write((header, payload))
        state.apply(rtype, record, *location)
    if open_txs:
        head.sync()
        _note(
            recovered.report,
            f"{len(open_txs)} uncommitted transactions dropped (abort records written)",
        )
    for problem in state.problems:
        _note(recovered.report, problem)
    state.problems.clear()
    state.file_seen(head.file_no, head.offset)
    state.flush((head.file_no, head.offset), ok=True)
    state.index.commit()
