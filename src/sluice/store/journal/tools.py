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

from sluice.config import StoreConfig
from sluice.store.api import WriteHandle
from sluice.store.journal import format as fmt
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.gc import GcResult
from sluice.store.journal.index import MsgLoc
from sluice.store.journal.recovery import recover
from sluice.store.journal.scan import Damage, FileScan, ScannedRecord
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
    lines: list[str] = field(default_factory=list)


def _config(data_dir: Path, config: StoreConfig | None) -> StoreConfig:
    base = config or StoreConfig()
    return dataclasses.replace(base, data_dir=Path(data_dir))


def verify(data_dir: Path, config: StoreConfig | None = None) -> VerifyReport:
    """Check every data file record by record (checksums, layout, headers, file sequence), and
    that every index entry points at a valid ADD record. Changes nothing."""
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
    report.ok = not report.problems
    report.lines = [
        f"{fr.path}: {fr.records} records, {fr.data_bytes} bytes of data" for fr in report.files
    ]
    report.lines.append(f"index: {report.index_messages} messages")
    report.lines.extend(report.problems)
    report.lines.append("OK" if report.ok else f"{len(report.problems)} problems")
    return report


def _verify_index(cfg: StoreConfig, report: VerifyReport) -> None:
    index_dir = cfg.data_dir / "index"
    if not (index_dir / "data.mdb").is_file():
        report.problems.append(f"{index_dir}: no index (it is rebuilt at the next open)")
        return
    journal_dir = cfg.data_dir / "journal"
    valid = {fr.file_no: fr for fr in report.files}
    try:
        env = lmdb.open(str(index_dir), max_dbs=8, readonly=True, lock=False)
    except lmdb.Error as exc:
        report.problems.append(f"{index_dir}: LMDB cannot open it ({exc})")
        return
    try:
        msgs = env.open_db(b"msgs", create=False)
        with env.begin() as txn:
            for key, value in txn.cursor(db=msgs):
                report.index_messages += 1
                loc = MsgLoc.decode(value)
                path = file_path(journal_dir, loc.file_no)
                if loc.file_no not in valid:
                    report.problems.append(f"index entry {key.hex()} points to missing {path}")
                    continue
                with open(path, "rb") as f:
                    f.seek(loc.offset)
                    data = f.read(loc.length)
                if len(data) != loc.length:
                    report.problems.append(f"{path}: index entry past the end at {loc.offset}")
                    continue
                length, crc, rtype = fmt.HEADER.unpack_from(data, 0)
                payload = data[fmt.HEADER_BYTES :]
                if (
                    rtype != fmt.RecordType.ADD
                    or length != len(payload)
                    or fmt.payload_crc(rtype, payload) != crc
                ):
                    report.problems.append(
                        f"{path}: index points at an invalid record at offset {loc.offset}"
                    )
    except lmdb.Error as exc:
        report.problems.append(f"{index_dir}: LMDB error ({exc})")
    finally:
        env.close()


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
    recovered = recover(cfg, dedup_window=10_000, durable=True, force_rebuild=True)
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
