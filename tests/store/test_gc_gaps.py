"""A journal whose collection left a gap (an old file pinned, later files gone) opens again, is
rebuilt from the journal alone, and a gap that collection did not make is found, by a start and
by `verify` alike."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.config import JournalVerify
from sluice.errors import CorruptionError
from sluice.store.journal import format as fmt
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.scan import FileScan, ScannedRecord
from sluice.store.journal.store import JournalStore
from sluice.store.journal.tools import rebuild_index, verify

from .helpers import Harness, journal_config, msg

PENDING = "/queue/pending"
BIG = "/queue/big"
PENDING_COUNT = 50
SMALL_FILES = {
    "journal_file_bytes": 256 * 1024,
    "checkpoint_interval_s": 3600.0,
    "gc_interval_s": 3600.0,
    "compaction_live_ratio": 0.0,
}


def _pinned_then_collected(h: Harness) -> list[int]:
    """Unconsumed messages pin db-1.log; the files after it fill, drain and are collected."""
    h.open()
    s = h.s
    assert isinstance(s, JournalStore)
    for seq in range(1, PENDING_COUNT + 1):
        h.track(s.add(msg(PENDING, seq, os.urandom(1024)), None))
    h.settle()
    for seq in range(1, 200):
        h.track(s.add(msg(BIG, seq, os.urandom(16 * 1024)), None))
    h.settle()
    for seq in range(1, 200):
        h.track(s.remove(BIG, seq))
    h.settle()
    s.gc()
    files = list_files(s.journal_dir)
    assert files[0] == 1
    assert files[1] > 2, f"no gap after the pinned file: {files}"
    return files


def _pending(h: Harness) -> list[int]:
    return [m.seq for m in h.s.load(PENDING, 0, 10**9, 1 << 62)]


@pytest.mark.parametrize("mode", list(JournalVerify))
def test_reopens_after_gc_left_a_gap(
    make_journal: Callable[..., Harness], mode: JournalVerify
) -> None:
    h = make_journal(verify_journal=mode, **SMALL_FILES)
    _pinned_then_collected(h)
    h.reopen()
    assert _pending(h) == list(range(1, PENDING_COUNT + 1))


def test_a_rebuild_trusts_the_retired_record(
    tmp_path: Path, make_journal: Callable[..., Harness]
) -> None:
    data = tmp_path / "data"
    h = make_journal(data, **SMALL_FILES)
    files = _pinned_then_collected(h)
    h.s.close()
    h.store = None
    result = rebuild_index(data, journal_config(data, **SMALL_FILES))
    assert any("index rebuilt" in line for line in result.lines)
    assert list_files(data / "journal") == files
    h.open()
    assert _pending(h) == list(range(1, PENDING_COUNT + 1))


def _retired_records(journal_dir: Path) -> list[fmt.FilesRetired]:
    found = []
    for file_no in list_files(journal_dir):
        for item in FileScan(file_path(journal_dir, file_no)):
            if isinstance(item, ScannedRecord) and item.rtype == fmt.RecordType.FILES_RETIRED:
                record = fmt.decode(item.rtype, item.payload)
                assert isinstance(record, fmt.FilesRetired)
                found.append(record)
    return found


def test_the_retired_record_names_every_collected_file(
    tmp_path: Path, make_journal: Callable[..., Harness]
) -> None:
    data = tmp_path / "data"
    h = make_journal(data, **SMALL_FILES)
    files = _pinned_then_collected(h)
    newest = _retired_records(data / "journal")[-1]
    gone = [n for n in range(1, files[-1]) if n not in files]
    assert [n for n in range(1, files[-1]) if newest.covers(n)] == gone


def test_a_lost_file_stops_a_rebuild_and_verify_says_so(
    tmp_path: Path, make_journal: Callable[..., Harness]
) -> None:
    data = tmp_path / "data"
    h = make_journal(data, **SMALL_FILES)
    h.open()
    s = h.s
    for seq in range(1, 120):
        h.track(s.add(msg(PENDING, seq, os.urandom(8 * 1024)), None))
    h.settle()
    h.s.close()
    h.store = None
    files = list_files(data / "journal")
    assert len(files) >= 3, files
    file_path(data / "journal", files[1]).unlink()

    report = verify(data, journal_config(data, **SMALL_FILES))
    assert not report.ok
    problems = "\n".join(report.problems)
    assert "a start would fail" in problems
    assert f"db-{files[1]}.log" in problems

    config = journal_config(data, **SMALL_FILES)
    with pytest.raises(CorruptionError, match=f"db-{files[1]}.log"):
        JournalStore(config).open(lambda _h: None)
    # Without its index, a start has only the journal: the gap is not one collection made.
    (data / "index" / "data.mdb").unlink()
    with pytest.raises(CorruptionError, match="collection did not remove"):
        rebuild_index(data, config)


def test_repair_starts_a_journal_with_a_gap_nobody_recorded(
    tmp_path: Path, make_journal: Callable[..., Harness]
) -> None:
    """A journal from before FILES_RETIRED existed (or a lost file): repair opens it and says
    which files are missing."""
    data = tmp_path / "data"
    h = make_journal(data, **SMALL_FILES)
    h.open()
    for seq in range(1, 120):
        h.track(h.s.add(msg(PENDING, seq, os.urandom(8 * 1024)), None))
    h.settle()
    h.s.close()
    h.store = None
    files = list_files(data / "journal")
    file_path(data / "journal", files[1]).unlink()
    (data / "index" / "data.mdb").unlink()
    repaired = make_journal(data, repair=True, **SMALL_FILES)
    recovery = repaired.open()
    assert any(f"db-{files[1]}.log" in line for line in recovery.report), recovery.report
    repaired.s.close()
    repaired.store = None
    assert verify(data, journal_config(data, **SMALL_FILES)).ok


def test_verify_agrees_with_a_start_on_a_gap_collection_made(
    tmp_path: Path, make_journal: Callable[..., Harness]
) -> None:
    data = tmp_path / "data"
    h = make_journal(data, **SMALL_FILES)
    _pinned_then_collected(h)
    h.s.close()
    h.store = None
    report = verify(data, journal_config(data, **SMALL_FILES))
    assert report.ok, report.lines
    assert any(line.startswith("start: a start would open at") for line in report.lines)
    (disk,) = [line for line in report.lines if line.startswith("disk: ")]
    assert "MiB free on its filesystem" in disk
