"""A journal cut or corrupted anywhere recovers a prefix of what was acknowledged, or refuses to
start with CorruptionError naming the file and offset; with repair it always starts."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import CorruptionError
from sluice.store.api import StoredMessage
from sluice.store.journal.files import file_path
from sluice.store.journal.scan import FileScan, ScannedRecord
from sluice.store.journal.store import JournalStore

from .helpers import Sink, copy_running, fields, journal_config, msg

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
    handles = []
    for seq in range(1, 41):
        m = msg(Q, seq, os.urandom(rng.randrange(1, 3000)), ts=seq)
        handle = store.add(m, None)
        sink.wait([handle])  # one record per op, in order
        handles.append(handle)
        model[seq] = frozen(m)
        all_messages[(Q, seq)] = frozen(m)
        states.append(frozenset(model.values()))
        if seq % 4 == 0:
            victim = rng.choice(sorted(model))
            handle = store.remove(Q, victim)
            sink.wait([handle])
            del model[victim]
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
    yield Base(root / "base", boundaries, records[1].offset, states, all_messages)
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
def test_flipped_bytes_recover_a_prefix_or_raise_corruption(
    base: Base, data: st.DataObject
) -> None:
    end = base.boundaries[-1]
    offsets = data.draw(st.lists(st.integers(0, end + 64), min_size=1, max_size=3))
    xor = data.draw(st.integers(1, 255))
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
            state, _ = reopen(target)
        except CorruptionError as exc:
            error = exc
        if error is None:
            assert state in base.prefix_states
        else:
            assert error.path is not None
            assert error.path.endswith("db-1.log")
            assert error.offset is not None
            assert error.offset <= max(offsets)
        # With repair it always opens, and holds only messages that were written, intact.
        repaired, _ = reopen(repaired_copy, repair=True)
        for m in repaired:
            assert base.all_messages[(m[0], m[1])] == m  # type: ignore[index]


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


def test_damaged_record_read_by_load_raises_corruption(base: Base, tmp_path: Path) -> None:
    target = tmp_path / "d"
    shutil.copytree(base.path, target)
    store = JournalStore(journal_config(target, **QUIET))
    store.open(Sink())
    try:
        store.checkpoint()
        path = file_path(target / "journal", 1)
        raw = bytearray(path.read_bytes())
        first = min(int(m[1]) for m in base.prefix_states[-1])  # type: ignore[call-overload]
        # Adds and removes alternate 4:1, one record each; flip a byte of that add's body.
        raw[base.boundaries[first - 1 + (first - 1) // 4] - 5] ^= 0x01
        path.write_bytes(bytes(raw))
        with pytest.raises(CorruptionError) as info:
            store.load(Q, 0, 1, 1 << 20)
        assert info.value.path == str(path)
    finally:
        store.close()


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
