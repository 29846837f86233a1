"""Opening the journal: check the index, verify the journal, replay it from the checkpoint.

The index is used when it passes every check of `Index.open_checked` (clean-close checksum,
the LMDB file read as a file, every entry read back against the digest written with it), its
checkpoint lies within the journal, and the journal backs every message it holds. The journal
is then read from the start: records before the checkpoint are only checked (CRC), the rest are
replayed into the index (the redo role). With `verify_journal = after_checkpoint` only the
replayed part is read. Any other index is rebuilt by replaying every data file.

Data files may be missing where collection removed them: the index knows which files it still
needs, and a rebuild, which has only the journal, trusts the newest FILES_RETIRED record for the
files that came before. A missing file that neither accounts for stops the start.

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

`recover(..., dry_run=True)` is the same path with every write left out: nothing on disk changes
(a rebuild goes to a temporary index, the index's transaction is never committed), and the
report says what a start would do. `sluice store verify` runs it, so whatever would stop a
start, verify reports the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from sluice.config import JournalVerify, StoreConfig
from sluice.errors import CorruptionError, StoreIOError
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
from sluice.store.journal.index import COMMIT_OPERATION, Index
from sluice.store.journal.indexcodec import IndexCorrupt
from sluice.store.journal.repair import forget_lost, note, note_lost, repair_stretch, short_file
from sluice.store.journal.scan import Damage, FileScan, ScannedRecord, resync
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

# While rebuilding, commit every this many records so LMDB's dirty pages stay bounded.
_REBUILD_COMMIT_RECORDS = 200_000
# Applying from here on means "only check" (a file wholly before the checkpoint).
_NEVER = 1 << 62


@dataclass
class Recovered:
    """What `recover` hands to the store (or, dry, to verify)."""

    state: JournalState
    store_id: bytes
    report: list[str] = field(default_factory=list)
    head: HeadFile | None = None
    head_position: tuple[int, int] = (0, 0)
    replayed_records: int = 0
    verified_records_bytes: int = 0
    rebuilt: bool = False
    dry_run: bool = False
    # Damaged ADDs after the checkpoint, (destination, seq) -> report line: lost unless a later
    # record removes them.
    lost_adds: dict[tuple[str, int], str] = field(default_factory=dict)
    # The newest FILES_RETIRED record replayed; changed when repair accepts missing files.
    retired: fmt.FilesRetired = field(default_factory=lambda: fmt.FilesRetired(()))
    retired_changed: bool = False
    # Destinations a replayed DEST_DELETE dropped (a rebuild: sequences the old index held for
    # them are stale).
    deleted: set[str] = field(default_factory=set)


class _IndexAhead(Exception):
    """The index's checkpoint is past the valid end of the journal."""


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
    dry_run: bool = False,
) -> Recovered:
    """Open (or create) the journal and index under `config.data_dir`. With `dry_run`, change
    nothing and say what a start would do (the index is closed again: only the report and the
    counts of the result are meaningful)."""
    report: list[str] = []
    if dry_run:
        config = dataclasses.replace(config, repair=False)
    opening = _Opening(config, dedup_window, durable, dry_run, report)
    files, store_id, new_store = opening.journal_files()
    reason = "requested" if force_rebuild else ""
    if not force_rebuild and not new_store:
        recovered, reason = opening.from_index(store_id, files)
        if recovered is not None:
            return recovered
    recovered = opening.rebuild(store_id, files)
    if not new_store:
        note(
            report,
            f"index rebuilt from {len(files)} journal files ({reason}); "
            f"{recovered.replayed_records} records replayed",
        )
    return recovered


@dataclass
class _Opening:
    """The steps of `recover`: find the data files, then use the index or rebuild it."""

    config: StoreConfig
    dedup_window: int
    durable: bool
    dry_run: bool
    report: list[str]

    @property
    def journal_dir(self) -> Path:
        return self.config.data_dir / "journal"

    @property
    def index_dir(self) -> Path:
        return self.config.data_dir / "index"

    def journal_files(self) -> tuple[list[int], bytes, bool]:
        """(data file numbers, store id, whether the journal is new): spares left by a stop
        removed, a first file whose creation never finished dropped, a new journal created."""
        journal_dir = self.journal_dir
        if not self.dry_run:
            journal_dir.mkdir(parents=True, exist_ok=True)
            remove_spares(journal_dir)
        files = list_files(journal_dir)
        store_id = _store_id(journal_dir, files)
        if store_id is None and files:
            first = file_path(journal_dir, files[0])
            if len(files) == 1 and resync(first.read_bytes(), 0) is None:
                # A first file whose creation never completed: nothing was ever acknowledged.
                if not self.dry_run:
                    first.unlink()
                note(self.report, f"{first}: incomplete new journal removed")
                files = []
            elif self.config.repair:
                store_id = Index.peek_store_id(self.index_dir) or os.urandom(16)
                note(self.report, "no data file has a valid header: repair rewrites them")
            else:
                raise CorruptionError("data file header is damaged", str(first), 0)
        if store_id is not None:
            return files, store_id, False
        if self.dry_run:
            raise CorruptionError("no data files: a start creates a new journal", str(journal_dir))
        store_id = os.urandom(16)
        create_file(
            file_path(journal_dir, 1),
            1,
            store_id,
            self.config.journal_file_bytes,
            sync=self.durable,
        )
        if self.durable:
            fsync_dir(journal_dir)
        return [1], store_id, True

    def from_index(self, store_id: bytes, files: list[int]) -> tuple[Recovered | None, str]:
        """Recover with the index when it passes its checks: (the result, "") or (None, why it
        cannot be used)."""
        sizes = {n: file_path(self.journal_dir, n).stat().st_size for n in files}
        try:
            index = Index.open_checked(
                self.index_dir,
                self.config.lmdb_map_bytes,
                store_id,
                durable=self.durable,
                file_sizes=sizes,
                keep_clean_marker=self.dry_run,
            )
        except FileNotFoundError:
            return None, "index missing"
        except IndexCorrupt as exc:
            return None, f"index unusable: {exc}"
        try:
            recovered = _recover_from_index(
                self.config, index, store_id, files, self.dedup_window, self.report, self.dry_run
            )
        except (IndexCorrupt, lmdb.Error, StoreIOError, _IndexAhead) as exc:
            index.abort()
            index.env.close()
            if isinstance(exc, StoreIOError) and exc.operation != COMMIT_OPERATION:
                # The journal failed (writing or syncing the abort records): the bytes it
                # wrote may never reach the disk, and a rebuild would read them back from the
                # page cache and commit an index that claims them. The start fails instead.
                raise
            # A StoreIOError here is the index commit (Index.commit), the disk full or failing.
            return None, f"index unusable: {exc}"
        except BaseException:
            index.abort()
            index.env.close()
            raise
        if self.dry_run:
            index.abort()
            index.env.close()
        return recovered, ""

    def rebuild(self, store_id: bytes, files: list[int]) -> Recovered:
        """A new index from every data file (a temporary one when dry), keeping the last
        sequences the old index held alone."""
        held = Index.peek_held_seqs(self.index_dir, store_id)
        args = (self.config, store_id, files, self.dedup_window, self.report, self.dry_run, held)
        if self.dry_run:
            with _scratch_index(self.config, store_id) as index:
                return _replay_all(index, *args)
        index = Index.create(
            self.index_dir, self.config.lmdb_map_bytes, store_id, durable=self.durable
        )
        try:
            return _replay_all(index, *args)
        except BaseException:
            index.abort()
            index.env.close()
            raise


@contextlib.contextmanager
def _scratch_index(config: StoreConfig, store_id: bytes) -> Iterator[Index]:
    """A throw-away index for a dry rebuild; closed and deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="sluice-verify-") as tmp:
        index = Index.create(Path(tmp) / "index", config.lmdb_map_bytes, store_id, durable=False)
        try:
            yield index
        finally:
            index.abort()
            index.env.close()


def _recover_from_index(
    config: StoreConfig,
    index: Index,
    store_id: bytes,
    files: list[int],
    dedup_window: int,
    report: list[str],
    dry_run: bool,
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
    recovered = Recovered(state, store_id, report, dry_run=dry_run)
    _drop_outside(config, recovered)
    # A file the index knows but the directory lacks is fine only when nothing in it is live
    # (collection removed it and the crash came before the index heard of it).
    missing = [f for f in state.files if f not in present]
    for file_no in missing:
        if state.files[file_no].pins > 0:
            path = file_path(journal_dir, file_no)
            if not config.repair:
                raise CorruptionError("data file the index needs is missing", str(path))
            note(report, f"{path}: missing; the state records it held stay in the index")
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
    _Replay(config, recovered, (cp_file, cp_offset), known_ends).run(scanned, first_offset)
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
    note(
        recovered.report,
        f"{len(dropped)} messages dropped by repair: their records are gone "
        f"(first: {path} at offset {first.loc.offset}, {first.problem})",
    )
    note_lost(recovered.report, [(name, seq, None) for name, seq, _loc in dropped])


def _replay_all(
    index: Index,
    config: StoreConfig,
    store_id: bytes,
    files: list[int],
    dedup_window: int,
    report: list[str],
    dry_run: bool,
    held: dict[str, int],
) -> Recovered:
    index.begin_write()
    state = JournalState(index, dedup_window)
    recovered = Recovered(state, store_id, report, rebuilt=True, dry_run=dry_run)
    _Replay(config, recovered, (files[0], 0), {}).run(files, 0)
    _check_gaps(config, recovered, files)
    # Sequences cancelled adds used while the disk was full: handed out, never written, and
    # perhaps the only trace of their destination (all its adds cancelled or refused, or in
    # files collected since). Kept unless the journal deleted the destination and has nothing
    # of it since (a delete the old index missed forgets them).
    state.hold_seqs(
        fmt.DestSeq(name, seq)
        for name, seq in held.items()
        if name in state.dests or name not in recovered.deleted
    )
    _finish(config, recovered)
    return recovered


def _check_gaps(config: StoreConfig, recovered: Recovered, files: list[int]) -> None:
    """Every data file number below the newest must exist or have been collected."""
    journal_dir = config.data_dir / "journal"
    present = set(files)
    retired = recovered.retired.numbers()
    lost = [n for n in range(1, files[-1]) if n not in present and n not in retired]
    if not lost:
        return
    names = f"db-{lost[0]}.log" + (f" to db-{lost[-1]}.log" if len(lost) > 1 else "")
    what = f"data files missing that collection did not remove: {names} ({len(lost)} files)"
    if not config.repair:
        raise CorruptionError(what, str(journal_dir))
    note(recovered.report, f"{journal_dir}: {what}; what they held is lost (repair goes on)")
    gone = [n for n in range(1, files[-1]) if n not in present]
    recovered.retired = fmt.FilesRetired.of(gone)
    recovered.retired_changed = True


class _Replay:
    """Reads data files in order: checks records before the checkpoint, applies the rest to the
    index, and handles damage as the module docstring says, one file at a time."""

    def __init__(
        self,
        config: StoreConfig,
        recovered: Recovered,
        checkpoint: tuple[int, int],
        known_ends: dict[int, int],
    ) -> None:
        self.config = config
        self.recovered = recovered
        self.state = recovered.state
        self.journal_dir = config.data_dir / "journal"
        self.checkpoint = checkpoint
        # Where the index knows data to end in files before the checkpoint.
        self.known_ends = known_ends
        self._sinks = (recovered.report, recovered.lost_adds)

    def run(self, files: list[int], start_offset: int) -> None:
        """Replay `files`, the first from `start_offset`; leaves the head after the last."""
        end = 0
        for i, file_no in enumerate(files):
            newest = i == len(files) - 1
            end = self._file(file_no, start_offset if i == 0 else 0, newest=newest)
        recovered = self.recovered
        recovered.head_position = (files[-1], end)
        if not recovered.dry_run:
            recovered.head = HeadFile(
                self.journal_dir,
                recovered.store_id,
                self.config.journal_file_bytes,
                files[-1],
                end,
                sync_on_rollover=True,
                preallocator=None,
            )

    def _apply_from(self, file_no: int) -> int:
        cp_file, cp_offset = self.checkpoint
        if file_no < cp_file:
            return _NEVER
        return cp_offset if file_no == cp_file else 0

    def _file(self, file_no: int, start: int, *, newest: bool) -> int:
        """Replay one file; returns where its valid data ends."""
        path = file_path(self.journal_dir, file_no)
        apply_from = self._apply_from(file_no)
        scan = FileScan(path, start, records_from=apply_from)
        if start > scan.size:
            raise _IndexAhead(f"checkpoint offset {start} is past the end of {path}")
        end = start
        cut = False
        for item in scan:
            if isinstance(item, Damage):
                end, stop, cut = self._damage(path, file_no, scan, item, apply_from, newest=newest)
                if stop:
                    break
                continue
            if item.offset == 0:
                self._check_header(path, file_no, item)
            elif not self._record(path, file_no, scan, item, apply_from):
                continue
            end = item.offset + item.length
        if not cut:
            end = max(end, scan.end_offset)
        self.recovered.verified_records_bytes += end - start
        known = self.known_ends.get(file_no, 0)
        if not cut and end < known:
            short_file(self.config, self.state, path, file_no, end, known, self.recovered.report)
        elif file_no == self.checkpoint[0] and self.checkpoint[1] > end:
            raise _IndexAhead(
                f"checkpoint offset {self.checkpoint[1]} is past the valid end of {path}"
            )
        if end == 0:
            if not newest:
                raise CorruptionError("data file has no valid header", str(path), 0)
            if not self.recovered.dry_run:
                create_file(path, file_no, self.recovered.store_id, self.config.journal_file_bytes)
            end = fmt.FILE_HEADER_RECORD_BYTES
            note(self.recovered.report, f"{path}: incomplete newest data file re-initialised")
        self.state.file_seen(file_no, end)
        return end

    def _check_header(self, path: Path, file_no: int, item: ScannedRecord) -> None:
        try:
            record = fmt.decode(item.rtype, item.payload)
        except fmt.FormatError:
            record = None
        if not (
            isinstance(record, fmt.FileHeader)
            and record.file_no == file_no
            and record.store_id == self.recovered.store_id
        ):
            raise CorruptionError("data file header does not belong here", str(path), 0)

    def _record(
        self, path: Path, file_no: int, scan: FileScan, item: ScannedRecord, apply_from: int
    ) -> bool:
        """Decode and apply one record; False when it was malformed and repair skipped it."""
        recovered = self.recovered
        try:
            record = fmt.decode(item.rtype, item.payload)
        except fmt.FormatError as exc:
            if not self.config.repair:
                raise CorruptionError(
                    f"malformed journal record: {exc}", str(path), item.offset
                ) from exc
            after = item.offset + item.length
            bad = Damage(item.offset, after, after, f"malformed record: {exc}")
            repair_stretch(
                self.config, self.state, path, file_no, scan.data, bad, apply_from, *self._sinks
            )
            return False
        if isinstance(record, fmt.FilesRetired):
            recovered.retired = record
        elif isinstance(record, fmt.DestDelete) and recovered.rebuilt:
            recovered.deleted.add(record.destination)
        forget_lost(recovered.lost_adds, record)
        self.state.apply(item.rtype, record, file_no, item.offset, item.length)
        recovered.replayed_records += 1
        if recovered.rebuilt and self.state.updates >= _REBUILD_COMMIT_RECORDS:
            self.state.flush((file_no, item.offset + item.length), ok=False)
            self.state.index.commit(reopen=True)
        return True

    def _damage(
        self,
        path: Path,
        file_no: int,
        scan: FileScan,
        item: Damage,
        apply_from: int,
        *,
        newest: bool,
    ) -> tuple[int, bool, bool]:
        """Handle one damaged stretch: (where valid data ends so far, whether nothing valid
        follows in the file, whether the damage cut the file's data there)."""
        recovered = self.recovered
        if newest and item.resume is None and item.offset >= apply_from:
            if recovered.dry_run:
                dropped = item.end - item.offset
                verb = "would be cut"
            else:
                dropped = dmg.cut_tail(path, item)
                verb = "cut"
            note(
                recovered.report,
                f"{path}: torn tail {verb} at offset {item.offset}, {dropped} bytes "
                f"dropped ({item.reason})",
            )
            return item.offset, True, True
        if not self.config.repair:
            raise CorruptionError(f"damaged journal record: {item.reason}", str(path), item.offset)
        skipped = item
        end = item.offset
        if item.offset == 0:
            dmg.rewrite_header(path, file_no, recovered.store_id)
            note(recovered.report, f"{path}: damaged file header rewritten by repair")
            end = fmt.FILE_HEADER_RECORD_BYTES
            rest = item.resume if item.resume is not None else item.end
            if rest <= end:
                return end, item.resume is None, False
            skipped = Damage(end, item.resume, item.end, item.reason)
        repair_stretch(
            self.config, self.state, path, file_no, scan.data, skipped, apply_from, *self._sinks
        )
        if item.resume is None:
            return skipped.offset, True, True  # zeroed: nothing valid follows
        return end, False, False


def _finish(config: StoreConfig, recovered: Recovered) -> None:
    """Report lost messages, abort transactions left open, commit the index at the head."""
    state = recovered.state
    if recovered.lost_adds:
        lines = list(recovered.lost_adds.values())
        note(recovered.report, f"{len(lines)} messages in damaged records are lost:")
        for line in lines[: dmg.MAX_LISTED_RECORDS]:
            note(recovered.report, "  " + line)
        if len(lines) > dmg.MAX_LISTED_RECORDS:
            note(recovered.report, f"  and {len(lines) - dmg.MAX_LISTED_RECORDS} more")
        recovered.lost_adds.clear()
    open_txs = sorted(state.open_txs)
    if recovered.dry_run:
        if open_txs:
            note(recovered.report, f"{len(open_txs)} uncommitted transactions would be dropped")
        for problem in state.problems:
            note(recovered.report, problem)
        state.problems.clear()
        return
    head = recovered.head
    assert head is not None
    records: list[fmt.Record] = [fmt.TxAbort(txno) for txno in open_txs]
    if recovered.retired_changed:
        # Repair accepted missing files: name them, so later rebuilds and verify do too.
        records.append(recovered.retired)
    for record in records:
        rtype, payload = fmt.encode(record)
        header, length = fmt.frame(rtype, (payload,))
        if not head.fits(length):
            state.file_seen(head.file_no, head.offset)
            head.rollover()
        location = (head.file_no, head.offset, length)
        head.write((header, payload))
        state.apply(rtype, record, *location)
    if records:
        head.sync()
    if open_txs:
        note(
            recovered.report,
            f"{len(open_txs)} uncommitted transactions dropped (abort records written)",
        )
    for problem in state.problems:
        note(recovered.report, problem)
    state.problems.clear()
    state.file_seen(head.file_no, head.offset)
    state.flush((head.file_no, head.offset), ok=True)
    state.index.commit()
