"""Opening the journal: check the index, replay the journal from its checkpoint, cut a torn tail.

The index is trusted when it opens, its clean-close checksum (if any) and format marker match, and
its checkpoint lies within the journal; the journal is then replayed from the checkpoint (the
redo role). Otherwise the index is rebuilt by replaying every data file. Damage:

- in the newest file, with no valid record after it: a torn tail (a write the crash interrupted,
  never acknowledged): cut off (zeroed) and reported with file, offset and bytes dropped;
- anywhere else: `CorruptionError` naming the file and offset, unless `StoreConfig.repair`, in
  which case the damaged bytes are skipped up to the next valid record and reported.

Transactions still open at the end are aborted (an abort record is written) and counted.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from sluice.config import StoreConfig
from sluice.errors import CorruptionError
from sluice.store.journal import format as fmt
from sluice.store.journal.files import (
    HeadFile,
    create_file,
    file_path,
    fsync_dir,
    list_files,
    remove_spares,
)
from sluice.store.journal.index import Index, IndexCorrupt
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
    rebuilt: bool = False


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
        try:
            index = Index.open_checked(index_dir, config.lmdb_map_bytes, store_id, durable=durable)
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
        raise _IndexAhead(f"checkpoint file db-{cp_file}.log is missing")
    missing = [f for f in state.files if f not in present]
    for file_no in missing:
        if state.files[file_no].pins > 0:
            raise CorruptionError(
                "data file the index needs is missing", str(file_path(journal_dir, file_no))
            )
    state.files_gone(missing)
    for file_no in files:
        if file_no not in state.files and file_no < cp_file:
            # Not in the index and before the checkpoint: nothing in it is live.
            state.file_seen(file_no, 0)
    replay = [f for f in files if f >= cp_file]
    recovered = Recovered(state, store_id, report)
    _replay(config, state, store_id, replay, cp_offset, recovered)
    _finish(config, recovered)
    log.info(
        "journal opened at checkpoint db-%d.log:%d, %d records replayed",
        cp_file,
        cp_offset,
        recovered.replayed_records,
    )
    return recovered


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
    _replay(config, state, store_id, files, 0, recovered)
    _finish(config, recovered)
    return recovered


def _replay(
    config: StoreConfig,
    state: JournalState,
    store_id: bytes,
    files: list[int],
    start_offset: int,
    recovered: Recovered,
) -> None:
    journal_dir = config.data_dir / "journal"
    report = recovered.report
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
        scan = FileScan(path, start)
        if start > scan.size:
            raise _IndexAhead(f"checkpoint offset {start} is past the end of {path}")
        end = start
        cut = False
        for item in scan:
            if isinstance(item, Damage):
                if (
                    item.offset == 0
                    and config.repair
                    and item.resume
                    in (
                        None,
                        fmt.FILE_HEADER_RECORD_BYTES,
                    )
                ):
                    _rewrite_header(path, file_no, store_id, report)
                    end = fmt.FILE_HEADER_RECORD_BYTES
                    if item.resume is None:
                        break
                    continue
                if newest and item.resume is None:
                    _cut_tail(path, item, report)
                    end = item.offset
                    cut = True
                    break
                if not config.repair:
                    raise CorruptionError(
                        f"damaged journal record: {item.reason}", str(path), item.offset
                    )
                _note(
                    report,
                    f"{path}: damaged records skipped by repair at offset {item.offset}: "
                    f"{item.dropped_bytes} bytes lost ({item.reason})",
                )
                continue
            try:
                record = fmt.decode(item.rtype, item.payload)
            except fmt.FormatError as exc:
                if not config.repair:
                    raise CorruptionError(
                        f"malformed journal record: {exc}", str(path), item.offset
                    ) from exc
                _note(report, f"{path}: malformed record skipped by repair at {item.offset}")
                continue
            if item.offset == 0:
                if not (
                    isinstance(record, fmt.FileHeader)
                    and record.file_no == file_no
                    and record.store_id == store_id
                ):
                    raise CorruptionError("data file header does not belong here", str(path), 0)
                end = item.offset + item.length
                continue
            state.apply(item.rtype, record, file_no, item.offset, item.length)
            recovered.replayed_records += 1
            end = item.offset + item.length
            if recovered.rebuilt and state.updates >= _REBUILD_COMMIT_RECORDS:
                state.flush((file_no, end), ok=False)
                state.index.commit(reopen=True)
        if not cut:
            end = max(end, scan.end_offset)
        if start > end:
            raise _IndexAhead(f"checkpoint offset {start} is past the valid end of {path}")
        if end == 0:
            if not newest:
                raise CorruptionError("data file has no valid header", str(path), 0)
            create_file(path, file_no, store_id, config.journal_file_bytes)
            end = fmt.FILE_HEADER_RECORD_BYTES
            _note(report, f"{path}: incomplete newest data file re-initialised")
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


def _rewrite_header(path: Path, file_no: int, store_id: bytes, report: list[str]) -> None:
    header = fmt.encode_file_header(file_no, store_id, 0)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    _note(report, f"{path}: damaged file header rewritten by repair")


def _cut_tail(path: Path, damage: Damage, report: list[str]) -> None:
    dropped = damage.end - damage.offset
    if dropped > 0:
        fd = os.open(path, os.O_RDWR)
        try:
            zeros = b"\0" * (1024 * 1024)
            pos = damage.offset
            while pos < damage.end:
                n = min(len(zeros), damage.end - pos)
                pos += os.pwrite(fd, zeros[:n], pos)
            os.fsync(fd)
        finally:
            os.close(fd)
    _note(
        report,
        f"{path}: torn tail cut at offset {damage.offset}, {dropped} bytes dropped "
        f"({damage.reason})",
    )


def _finish(config: StoreConfig, recovered: Recovered) -> None:
    """Abort transactions left open, then commit the index at the head position."""
    state = recovered.state
    head = recovered.head
    assert head is not None
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
