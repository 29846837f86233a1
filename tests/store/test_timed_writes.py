"""A journal store asked to time its writes (`time_writes=True`, the broker's per-hop latency):
what its handles carry, in which order, and what an untimed store does instead."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.config import SyncPolicy
from sluice.store.api import TimedWriteHandle, WriteHandle, WriteState
from sluice.store.journal.store import JournalStore

from .helpers import Sink, journal_config, msg

Q = "/queue/timed"


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[JournalStore, Sink]]:
    sink = Sink()
    store = JournalStore(journal_config(tmp_path / "data"), time_writes=True)
    store.open(sink)
    try:
        yield store, sink
    finally:
        store.close()


def _stamps(handle: TimedWriteHandle) -> list[int]:
    batch = handle.batch
    assert batch is not None
    return [
        handle.added_ns,
        handle.queued_ns,
        batch.taken_ns,
        batch.write_ns,
        batch.written_ns,
        batch.synced_ns,
    ]


def test_written_handles_carry_their_stamps_in_order(
    opened: tuple[JournalStore, Sink],
) -> None:
    store, sink = opened
    with store.writes_paused():
        # Held: all three go in one batch, which they share.
        handles = [store.add(msg(Q, seq), None) for seq in (1, 2, 3)]
    sink.wait(handles)
    assert all(isinstance(handle, TimedWriteHandle) for handle in handles)
    timed = [handle for handle in handles if isinstance(handle, TimedWriteHandle)]
    assert len({id(handle.batch) for handle in timed}) == 1
    for handle in timed:
        stamps = _stamps(handle)
        assert stamps == sorted(stamps)
        assert stamps[1] > stamps[0]
        # The sync policy is `always`: a real fdatasync between written and synced.
        assert stamps[5] > stamps[4]
    # Queued in order, all before the writer took them.
    queued = [handle.queued_ns for handle in timed]
    assert queued == sorted(queued)
    assert queued[-1] <= _stamps(timed[0])[2]


def test_without_syncs_the_batch_is_synced_when_written(tmp_path: Path) -> None:
    sink = Sink()
    config = journal_config(tmp_path / "data", sync=SyncPolicy.NEVER)
    store = JournalStore(config, time_writes=True)
    store.open(sink)
    try:
        handle = store.add(msg(Q, 1), None)
        sink.wait([handle])
        assert isinstance(handle, TimedWriteHandle)
        batch = handle.batch
        assert batch is not None
        assert batch.synced_ns == batch.written_ns
    finally:
        store.close()


def test_a_cancelled_write_has_no_batch(opened: tuple[JournalStore, Sink]) -> None:
    store, sink = opened
    with store.writes_paused():
        add = store.add(msg(Q, 1), None)
        remove = store.remove(Q, 1)
    sink.wait([add, remove])
    assert add.state is WriteState.CANCELLED
    assert isinstance(add, TimedWriteHandle)
    assert add.batch is None


def test_an_untimed_store_hands_out_plain_handles(tmp_path: Path) -> None:
    sink = Sink()
    store = JournalStore(journal_config(tmp_path / "data"))
    store.open(sink)
    try:
        handle = store.add(msg(Q, 1), None)
        sink.wait([handle])
        assert type(handle) is WriteHandle
        assert handle.state is WriteState.WRITTEN
    finally:
        store.close()
