"""Offline store tools behind `sluice store verify|dump|rebuild-index|compact DIR`.

Each returns a structured result with human-readable `lines`. They must not run while a broker has
the store open (the index's lock would let them, the journal would not stay still).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import lmdb

from sluice.config import DEFAULT_DEDUP_WINDOW, StoreConfig
from sluice.errors import CorruptionError, StoreError
from sluice.store.api import WriteHandle
from sluice.store.journal import format as fmt
from sluice.store.journal.files import FileReader, file_path, free_bytes, list_files
from sluice.store.journal.gc import GcResult
from sluice.store.journal.index import (
    DIGESTED,
    check_structure,
    digest_problems,
    verify_entries,
)
from sluice.store.journal.indexcodec import DestInfo, IndexCorrupt, MsgLoc, dkey
from sluice.store.journal.recovery import recover
from sluice.store.journal.scan import Damage, FileScan, ScannedRecord, parse_add
from sluice.store.journal.store import JournalStore


@dataclass
class FileReport:
    """What verify found in one data file."""

    file_no: int
    path: str
    records: int = 0
    data_bytes: int = 0
    damage: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    """The result of `verify`."""

    ok: bool
    files: list[FileReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    index_messages: int = 0
    # What a start would do, from the start's own checks run without writing anything.
    start: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _config(data_dir: Path, config: StoreConfig | None) -> StoreConfig:
    base = config or StoreConfig()
    return dataclasses.replace(base, data_dir=Path(data_dir))


def verify(data_dir: Path, config: StoreConfig | None = None) -> VerifyReport:
    """Check every data file record by record (checksums, layout, headers), that every index
    entry points at a valid ADD record, and run a start's recovery without writing anything
    (`recover(dry_run=True)`: missing files, the checkpoint, replay): whatever would stop a
    start is a problem here too. Changes nothing."""
    cfg = _config(data_dir, config)
    journal_dir = cfg.data_dir / "journal"
    report = VerifyReport(ok=True)
    numbers = list_files(journal_dir)
    if not numbers:
        report.problems.append(f"{journal_dir}: no data files")
    store_ids: set[bytes] = set()
    for i, file_no in enumerate(numbers):
        path = file_path(journal_dir, file_no)
        fr = FileReport(file_no, str(path))
        scan = FileScan(path)
        newest = i == len(numbers) - 1
        for item in scan:
            if isinstance(item, Damage):
                kind = "torn tail" if newest and item.resume is None else "damage"
                fr.damage.append(
                    f"{path}: {kind} at offset {item.offset}, {item.dropped_bytes} bytes "
                    f"({item.reason})"
                )
                continue
            fr.records += 1
            if item.offset == 0:
                header = fmt.decode(item.rtype, item.payload)
                if not isinstance(header, fmt.FileHeader) or header.file_no != file_no:
                    fr.damage.append(f"{path}: file header does not match the file name")
                else:
                    store_ids.add(header.store_id)
        fr.data_bytes = scan.end_offset
        report.files.append(fr)
        report.problems.extend(fr.damage)
    if len(store_ids) > 1:
        report.problems.append("data files belong to more than one store")
    _verify_index(cfg, report)
    if numbers:
        _verify_start(cfg, report)
    report.ok = not report.problems
    report.lines = [
        f"{fr.path}: {fr.records} records, {fr.data_bytes} bytes of data" for fr in report.files
    ]
    report.lines.append(f"index: {report.index_messages} messages")
    report.lines.append(_disk_line(cfg, report))
    report.lines.extend(f"start: {line.strip()}" for line in report.start)
    report.lines.extend(report.problems)
    report.lines.append("OK" if report.ok else f"{len(report.problems)} problems")
    return report


def _verify_index(cfg: StoreConfig, report: VerifyReport) -> None:
    """The checks a start makes on the index, read-only, then every message entry read back:
    the record it names must be the intact ADD of that message."""
    index_dir = cfg.data_dir / "index"
    if not (index_dir / "data.mdb").is_file():
        report.problems.append(f"{index_dir}: no index (it is rebuilt at the next open)")
        return
    journal_dir = cfg.data_dir / "journal"
    sizes = {fr.file_no: file_path(journal_dir, fr.file_no).stat().st_size for fr in report.files}
    rebuilt = "it is rebuilt from the journal at the next open"
    try:
        check_structure(index_dir)
    except IndexCorrupt as exc:
        report.problems.append(f"{index_dir}: index damaged, {rebuilt} ({exc})")
        return
    try:
        env = lmdb.open(str(index_dir), max_dbs=8, readonly=True, lock=False)
    except lmdb.Error as exc:
        report.problems.append(f"{index_dir}: LMDB cannot open it ({exc})")
        return
    reader = FileReader(journal_dir)
    try:
        dbs = {name: env.open_db(name, create=False) for name in (*DIGESTED, b"meta")}
        with env.begin() as txn:
            found, result = verify_entries(txn, dbs, sizes)
            damaged = digest_problems(txn, dbs, found)
            report.problems.extend(f"{index_dir}: index damaged, {rebuilt} ({p})" for p in damaged)
            report.index_messages = result.entries[b"msgs"]
            for out in result.outside:
                report.problems.append(
                    f"{file_path(journal_dir, out.loc.file_no)}: the index holds a message at "
                    f"offset {out.loc.offset}: {out.problem}"
                )
            if damaged:
                return
            names = {}
            for _key, value in txn.cursor(db=dbs[b"dests"]):
                name = DestInfo.decode(value).name
                names[dkey(name)] = name
            for key, value in txn.cursor(db=dbs[b"msgs"]):
                loc = MsgLoc.decode(value)
                if loc.file_no not in sizes:
                    continue  # reported above
                where = str(file_path(journal_dir, loc.file_no))
                seq = int.from_bytes(key[16:], "big")
                try:
                    data = reader.read(loc.file_no, loc.offset, loc.length)
                    parse_add(
                        data,
                        where,
                        loc.offset,
                        loc.length,
                        destination=names.get(key[:16]),
                        seq=seq,
                    )
                except CorruptionError as exc:
                    report.problems.append(f"index entry of message {seq}: {exc}")
    except (lmdb.Error, IndexCorrupt) as exc:
        report.problems.append(f"{index_dir}: index damaged, {rebuilt} ({exc})")
    finally:
        reader.close()
        env.close()


def _disk_line(cfg: StoreConfig, report: VerifyReport) -> str:
    """The store's disk against its limits, as the broker counts them (`core/disk.py`)."""
    mib = 1024 * 1024
    journal = sum(Path(fr.path).stat().st_size for fr in report.files)
    index = cfg.data_dir / "index" / "data.mdb"
    held = journal + (index.stat().st_size if index.is_file() else 0)
    free = free_bytes(cfg.data_dir)
    reserve = cfg.disk_reserve_bytes
    limit = f"store.max_bytes {cfg.max_bytes / mib:.1f} MiB" if cfg.max_bytes else "no max_bytes"
    full = " (full: producers wait or are refused)" if free <= reserve else ""
    return (
        f"disk: the store holds {held / mib:.1f} MiB; {free / mib:.1f} MiB free on its "
        f"filesystem, store.reserve_bytes {reserve / mib:.1f} MiB kept; {limit}{full}"
    )


def _verify_start(cfg: StoreConfig, report: VerifyReport) -> None:
    """The start's own checks, dry: a start that would fail is a problem, named as the start
    would name it; what it would do otherwise (cut a torn tail, rebuild the index) is listed."""
    try:
        recovered = recover(cfg, dedup_window=DEFAULT_DEDUP_WINDOW, durable=True, dry_run=True)
    except (StoreError, OSError) as exc:
        report.problems.append(f"a start would fail: {exc}")
        return
    report.start.extend(recovered.report)
    head_file, head_offset = recovered.head_position
    report.start.append(
        f"a start would open at db-{head_file}.log:{head_offset} "
        f"({recovered.replayed_records} records replayed"
        + (", index rebuilt)" if recovered.rebuilt else ")")
    )


def dump(data_dir: Path, out: TextIO, *, archive: bool = False) -> int:
    """Write one line per record of every data file (or archived file); returns the count."""
    base = Path(data_dir) / ("archive" if archive else "journal")
    count = 0
    for file_no in list_files(base):
        path = file_path(base, file_no)
        for item in FileScan(path):
            if isinstance(item, ScannedRecord):
                out.write(f"{path.name} {item.offset:>10} {_describe(item)}\n")
                count += 1
            else:
                out.write(
                    f"{path.name} {item.offset:>10} DAMAGE {item.dropped_bytes} bytes: "
                    f"{item.reason}\n"
                )
    return count


def _describe(item: ScannedRecord) -> str:
    name = fmt.RecordType(item.rtype).name
    if item.rtype == fmt.RecordType.ADD:
        message, meta = fmt.decode_add(item.payload)
        tx = f" tx={meta.txno}#{meta.ordinal}" if meta.txno else ""
        copy = " copy" if meta.copy else ""
        return (
            f"ADD {message.destination} seq={message.seq}{tx}{copy} id={message.message_id} "
            f"ts={message.timestamp_ms} headers={len(message.headers)} body={len(message.body)}B"
        )
    return f"{name} {fmt.decode(item.rtype, item.payload)}"


@dataclass
class RebuildResult:
    """The result of `rebuild_index`."""

    destinations: int
    subscriptions: int
    lines: list[str]


def rebuild_index(data_dir: Path, config: StoreConfig | None = None) -> RebuildResult:
    """Throw the index away and rebuild it from every data file."""
    cfg = _config(data_dir, config)
    recovered = recover(cfg, dedup_window=DEFAULT_DEDUP_WINDOW, durable=True, force_rebuild=True)
    destinations, subscriptions = recovered.state.recovered()
    assert recovered.head is not None
    recovered.head.close()
    recovered.state.index.close(clean=True)
    lines = list(recovered.report)
    lines.append(
        f"index rebuilt: {len(destinations)} destinations, {len(subscriptions)} subscriptions, "
        f"{recovered.replayed_records} records replayed"
    )
    return RebuildResult(len(destinations), len(subscriptions), lines)


def _discard(_handles: Sequence[WriteHandle]) -> None:
    """Offline there is nobody to tell."""


def compact(data_dir: Path, config: StoreConfig | None = None) -> GcResult:
    """Open the store, collect and compact every file worth it, close."""
    cfg = _config(data_dir, config)
    store = JournalStore(cfg)
    store.open(_discard)
    try:
        result = store.gc()
        while True:
            more = store.gc()
            if not (more.compacted or more.deleted or more.archived):
                break
            result.compacted += more.compacted
            result.deleted += more.deleted
            result.archived += more.archived
            result.moved_messages += more.moved_messages
    finally:
        store.close()
    return result
