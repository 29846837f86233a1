"""A journal cut or corrupted anywhere recovers what its intact records hold, or refuses to start
with CorruptionError naming the file and offset; with repair it always starts, names what was
lost, and leaves a journal that starts without repair."""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import CorruptionError, StoreIOError
from sluice.store.api import StoredMessage
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.scan import FileScan, ScannedRecord
from sluice.store.journal.store import JournalStore

from .helpers import Harness, Sink, copy_running, fields, journal_config, msg

Q = "/queue/r"
QUIET = {"checkpoint_interval_s": 3600.0, "gc_interval_s": 3600.0, "index_write_batch": 10**9}

State = frozenset[tuple[object, ...]]


@dataclass
class Base:
    """A crashed journal (one data file), the end offset of each op's record, and the state
    after each prefix of ops."""

    path: Path
    boundaries: list[int]  # end offset of record i
    first_record: int
    prefix_states: list[State]  # state after 0..n records
    all_messages: dict[tuple[str, int], tuple[object, ...]]
    ops: list[tuple[str, int]]  # record i: ("add", seq) or ("remove", seq)

    def starts(self) -> list[int]:
        """Start offset of record i."""
        return [self.first_record, *self.boundaries[:-1]]

    def state_without(self, skipped: set[int]) -> State:
        """The state the records hold when the records in `skipped` are lost."""
        model: dict[int, tuple[object, ...]] = {}
        for i, (kind, seq) in enumerate(self.ops):
            if i in skipped:
                continue
            if kind == "add":
                model[seq] = self.all_messages[(Q, seq)]
            else:
                model.pop(seq, None)
        return frozenset(model.values())


def frozen(m: StoredMessage) -> tuple[object, ...]:
    values = list(fields(m))
    values[4] = tuple(sorted(m.headers.items()))
    return tuple(values)


def state_of(store: JournalStore) -> State:
    return frozenset(frozen(m) for m in store.load(Q, 0, 10**9, 1 << 62))


@pytest.fixture(scope="module")
def base() -> Iterator[Base]:
    root = Path(tempfile.mkdtemp(prefix="sluice-recovery-"))
    rng = random.Random(5)
    sink = Sink()
    store = JournalStore(journal_config(root / "live", **QUIET))
    store.open(sink)
    model: dict[int, tuple[object, ...]] = {}
    states: list[State] = [frozenset()]
    all_messages: dict[tuple[str, int], tuple[object, ...]] = {}
    ops: list[tuple[str, int]] = []
    handles = []
    for seq in range(1, 41):
        m = msg(Q, seq, os.urandom(rng.randrange(1, 3000)), ts=seq)
        handle = store.add(m, None)
        sink.wait([handle])  # one record per op, in order
        handles.append(handle)
        model[seq] = frozen(m)
        all_messages[(Q, seq)] = frozen(m)
        ops.append(("add", seq))
        states.append(frozenset(model.values()))
        if seq % 4 == 0:
            victim = rng.choice(sorted(model))
            handle = store.remove(Q, victim)
            sink.wait([handle])
            del model[victim]
            ops.append(("remove", victim))
            states.append(frozenset(model.values()))
    copy_running(store, root / "base")
    store.close()
    records = [
        item
        for item in FileScan(file_path(root / "base" / "journal", 1))
        if isinstance(item, ScannedRecord)
    ]
    # Record 0 is the file header; the rest are the ops, one each.
    boundaries = [r.offset + r.length for r in records[1:]]
    assert len(boundaries) == len(states) - 1
    yield Base(root / "base", boundaries, records[1].offset, states, all_messages, ops)
    shutil.rmtree(root)


def reopen(path: Path, *, repair: bool = False) -> tuple[State, list[str]]:
    store = JournalStore(journal_config(path, repair=repair, **QUIET))
    recovery = store.open(Sink())
    try:
        return state_of(store), recovery.report
    finally:
        store.close()


def test_uncut_journal_recovers_everything(base: Base, tmp_path: Path) -> None:
    shutil.copytree(base.path, tmp_path / "d")
    state, report = reopen(tmp_path / "d")
    assert state == base.prefix_states[-1]
    assert report == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_cut_at_any_offset_recovers_the_prefix(base: Base, data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=base.first_record, max_value=base.boundaries[-1]))
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "d"
        shutil.copytree(base.path, target)
        os.truncate(file_path(target / "journal", 1), cut)
        state, report = reopen(target)
        complete = sum(1 for end in base.boundaries if end <= cut)
        assert state == base.prefix_states[complete]
        at_boundary = cut == base.first_record or cut in base.boundaries
        assert any("torn tail" in line for line in report) == (not at_boundary)
        # Recovery cut the tail for good: a second open reports nothing and agrees.
        again, report2 = reopen(target)
        assert again == state
        assert report2 == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_flipped_bytes_keep_every_intact_record(base: Base, data: st.DataObject) -> None:
    end = base.boundaries[-1]
    offsets = data.draw(st.lists(st.integers(0, end + 64), min_size=1, max_size=3, unique=True))
    xor = data.draw(st.integers(1, 255))
    starts = base.starts()
    touched = {
        i
        for i, (lo, hi) in enumerate(zip(starts, base.boundaries, strict=True))
        if any(lo <= o < hi for o in offsets)
    }
    expected = base.state_without(touched)
    header_hit = min(offsets) < base.first_record
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "d"
        shutil.copytree(base.path, target)
        path = file_path(target / "journal", 1)
        raw = bytearray(path.read_bytes())
        for offset in offsets:
            raw[offset] ^= xor
        path.write_bytes(bytes(raw))
        repaired_copy = Path(tmp) / "r"
        shutil.copytree(target, repaired_copy)
        error: CorruptionError | None = None
        try:
            state, report = reopen(target)
        except CorruptionError as exc:
            error = exc
        if error is not None:
            # The error names the first damaged record (or the file header).
            assert error.path == str(path)
            assert error.offset == (0 if header_hit else starts[min(touched)])
        else:
            # It started: the damage was a torn tail, and nothing intact was lost.
            assert state == expected
            assert bool(report) == (bool(touched) or max(offsets) >= end)
        # With repair it always opens and keeps every record the flips did not touch.
        repaired, report = reopen(repaired_copy, repair=True)
        assert repaired == expected
        if touched:
            assert report
        # ... and what it left starts without repair, the same, with nothing to report.
        again, report2 = reopen(repaired_copy)
        assert again == expected
        assert report2 == []


def test_damage_before_the_tail_stops_the_start_and_repair_skips_it(
    base: Base, tmp_path: Path
) -> None:
    target = tmp_path / "d"
    shutil.copytree(base.path, target)
    path = file_path(target / "journal", 1)
    raw = bytearray(path.read_bytes())
    victim = base.boundaries[5] + 20  # inside the 7th op's record
    raw[victim] ^= 0x55
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError) as info:
        reopen(target)
    assert info.value.path == str(path)
    assert info.value.offset == base.boundaries[5]
    state, report = reopen(target, repair=True)
    assert any(
        "skipped by repair" in line and f"offset {base.boundaries[5]}" in line for line in report
    )
    assert state < base.prefix_states[-1] or state == base.prefix_states[-1] - {
        base.all_messages[(Q, 7)]
    }


def _body_byte(base: Base, seq: int) -> int:
    """An offset inside the body of message `seq`'s ADD record (its last bytes are body)."""
    return base.boundaries[base.ops.index(("add", seq))] - 5


def test_damaged_record_read_back_is_dropped_and_the_rest_delivered(
    base: Base, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "d"
    shutil.copytree(base.path, target)
    store = JournalStore(journal_config(target, **QUIET))
    store.open(Sink())
    try:
        store.checkpoint()
        path = file_path(target / "journal", 1)
        live = sorted(int(m[1]) for m in base.prefix_states[-1])  # type: ignore[call-overload]
        victim = live[len(live) // 2]
        raw = bytearray(path.read_bytes())
        raw[_body_byte(base, victim)] ^= 0x01
        path.write_bytes(bytes(raw))
        # Read in pages of 3: the page that meets the damage still holds 3 messages.
        got: list[int] = []
        while True:
            page = store.load(Q, got[-1] if got else 0, 3, 1 << 30)
            if not page:
                break
            assert len(page) == 3 or page[-1].seq == live[-1]
            got.extend(m.seq for m in page)
        assert got == [s for s in live if s != victim]
        assert store.stats().damaged_records == 1
        offset = base.starts()[base.ops.index(("add", victim))]
        assert any(
            str(path) in r.message and f"offset {offset}" in r.message for r in caplog.records
        )
        # Dropped for good: the index no longer holds it.
        assert [m.seq for m in store.load(Q, 0, 10**9, 1 << 62)] == got
    finally:
        store.close()


def test_damage_before_the_checkpoint_stops_the_start(base: Base, tmp_path: Path) -> None:
    target = tmp_path / "d"
    shutil.copytree(base.path, target)
    store = JournalStore(journal_config(target, **QUIET))
    store.open(Sink())
    store.close()  # the checkpoint is now at the end of the journal
    path = file_path(target / "journal", 1)
    live = sorted(int(m[1]) for m in base.prefix_states[-1])  # type: ignore[call-overload]
    victim = live[0]
    raw = bytearray(path.read_bytes())
    raw[_body_byte(base, victim)] ^= 0x01
    path.write_bytes(bytes(raw))
    offset = base.starts()[base.ops.index(("add", victim))]
    with pytest.raises(CorruptionError) as info:
        reopen(target)
    assert (info.value.path, info.value.offset) == (str(path), offset)
    state, report = reopen(target, repair=True)
    assert state == base.prefix_states[-1] - {base.all_messages[(Q, victim)]}
    assert any(f"offset {offset}" in line and "skipped by repair" in line for line in report)
    lost = [line for line in report if "lost message" in line]
    assert lost == [
        f"  lost message: destination '{Q}' seq {victim} message-id "
        f"'{base.all_messages[(Q, victim)][2]}'"
    ]
    again, report = reopen(target)
    assert again == state
    assert report == []


def test_torn_newest_file_header_is_reinitialised(base: Base, tmp_path: Path) -> None:
    target = tmp_path / "d"
    shutil.copytree(base.path, target)
    store = JournalStore(journal_config(target, **QUIET))
    store.open(Sink())
    store.close()
    # A crash while creating file 2: it exists, but only partly zero-filled and headerless.
    (target / "journal" / "db-2.log").write_bytes(b"\0" * 4096)
    state, report = reopen(target)
    assert state == base.prefix_states[-1]
    assert any("re-initialised" in line for line in report)


def _multi_file_store(make_journal: Callable[..., Harness]) -> tuple[Harness, list[int]]:
    """A closed store over several data files, each holding live messages."""
    h = make_journal(**QUIET)
    h.open()
    s = h.s
    for seq in range(1, 1201):
        h.track(s.add(msg(Q, seq, bytes([seq % 251]) * 2500), None))
    h.settle()
    h.close()
    assert isinstance(h.store, JournalStore)
    files = list_files(h.store.journal_dir)
    assert len(files) >= 3
    return h, files


def test_older_file_cut_at_a_record_boundary_is_found(
    make_journal: Callable[..., Harness],
) -> None:
    h, files = _multi_file_store(make_journal)
    assert isinstance(h.store, JournalStore)
    data_dir = h.store.config.data_dir
    path = file_path(h.store.journal_dir, files[0])
    records = [i for i in FileScan(path) if isinstance(i, ScannedRecord)]
    cut = records[-10].offset  # ten whole records go, nothing looks torn
    raw = path.read_bytes()
    path.write_bytes(raw[:cut] + bytes(len(raw) - cut))
    with pytest.raises(CorruptionError) as info:
        h.open()
    assert (info.value.path, info.value.offset) == (str(path), cut)
    repaired = make_journal(data_dir, repair=True)
    report = repaired.open()
    lost = [line for line in report.report if "lost message" in line]
    assert len(lost) == 10
    assert len(repaired.s.load(Q, 0, 10**6, 1 << 62)) == 1190


def test_missing_newest_file_stops_the_start(make_journal: Callable[..., Harness]) -> None:
    h, files = _multi_file_store(make_journal)
    assert isinstance(h.store, JournalStore)
    newest = file_path(h.store.journal_dir, files[-1])
    newest.unlink()
    with pytest.raises(CorruptionError) as info:
        h.open()
    assert info.value.path == str(newest)


def test_a_failed_sync_of_the_abort_records_stops_the_start(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abort records of transactions left open are synced before the index is committed.
    When that sync fails, the start fails: a rebuild would read the unsynced records back from
    the page cache and commit an index claiming bytes the disk may never hold."""
    h = make_journal(**QUIET)
    h.open()
    h.s.begin("open-tx")
    h.track(h.s.add(msg(Q, 0), None, "open-tx"))
    h.settle()
    assert isinstance(h.store, JournalStore)
    head_before = h.store.head_position
    h.s.close()

    def failing_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(StoreIOError) as info:
        h.open()
    assert info.value.operation == "journal sync"
    monkeypatch.undo()

    recovery = h.open()
    assert not any("index rebuilt" in line for line in recovery.report), recovery.report
    assert isinstance(h.store, JournalStore)
    assert h.store.head_position > head_before  # the abort record
    assert list(h.s.load(Q, 0, 10**6, 1 << 62)) == []
