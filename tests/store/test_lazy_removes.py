"""Removes nobody waits for are written without a sync of their own (`[store] sync_acks`), and
the writer's requests (checkpoint, collection) come after every write queued before them."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sluice.store.api import WriteState
from sluice.store.journal import writer as writer_mod
from sluice.store.journal.store import JournalStore

from .helpers import Harness, msg

Q = "/queue/lazy"
# No timer of the store's own in these tests unless one sets it.
QUIET = {"checkpoint_interval_s": 3600, "gc_interval_s": 3600, "sync_interval_ms": 3_600_000}


def _open(
    make_journal: Callable[..., Harness], **overrides: object
) -> tuple[Harness, JournalStore]:
    h = make_journal(**{**QUIET, **overrides})
    h.open()
    assert isinstance(h.store, JournalStore)
    for seq in range(1, 4):
        h.track(h.store.add(msg(Q, seq), None))
    h.settle()
    return h, h.store


def _seqs(store: JournalStore) -> list[int]:
    return [m.seq for m in store.load(Q, 0, 1000, 1 << 30)]


def test_a_remove_nobody_waits_for_is_written_but_not_synced(
    make_journal: Callable[..., Harness],
) -> None:
    h, s = _open(make_journal)
    syncs = s.stats().syncs
    written = s.stats().written_records
    removed = h.track(s.remove(Q, 1))
    h.settle()
    assert removed.state is WriteState.WRITTEN
    assert s.stats().written_records == written + 1
    assert s.stats().syncs == syncs
    assert _seqs(s) == [2, 3]
    # The next add's sync covers it: one sync for both.
    h.track(s.add(msg(Q, 4), None))
    h.settle()
    assert s.stats().syncs == syncs + 1


def test_a_remove_someone_waits_for_is_synced(make_journal: Callable[..., Harness]) -> None:
    h, s = _open(make_journal)
    syncs = s.stats().syncs
    # The core passes a callback when a RECEIPT waits for the remove (the sink runs it).
    removed = h.track(s.remove(Q, 2, lambda handle: None))
    h.settle()
    assert removed.state is WriteState.WRITTEN
    assert s.stats().syncs == syncs + 1


def test_sync_acks_syncs_every_remove(make_journal: Callable[..., Harness]) -> None:
    h, s = _open(make_journal, sync_acks=True)
    syncs = s.stats().syncs
    h.track(s.remove(Q, 1))
    h.settle()
    assert s.stats().syncs == syncs + 1


def test_lazy_removes_are_synced_within_sync_interval(
    make_journal: Callable[..., Harness],
) -> None:
    h, s = _open(make_journal, sync_interval_ms=20)
    syncs = s.stats().syncs
    h.track(s.remove(Q, 1))
    h.settle()
    synced = threading.Event()

    def poll() -> None:
        # The timer's sync is the only one this store makes from here on.
        while not synced.is_set():
            if s.stats().syncs > syncs:
                synced.set()
            else:
                synced.wait(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    assert synced.wait(30), "the lazy remove was never synced"
    poller.join(5)
    assert s.stats().syncs == syncs + 1


def test_a_checkpoint_and_the_close_sync_lazy_removes(
    make_journal: Callable[..., Harness],
) -> None:
    h, s = _open(make_journal)
    syncs = s.stats().syncs
    h.track(s.remove(Q, 1))
    h.settle()
    s.checkpoint()
    assert s.stats().syncs == syncs + 1
    h.track(s.remove(Q, 2))
    h.settle()
    h.reopen()
    assert isinstance(h.store, JournalStore)
    assert _seqs(h.store) == [3]


def test_a_rollover_syncs_the_lazy_removes_of_the_file_it_seals(
    make_journal: Callable[..., Harness],
) -> None:
    file_bytes = 1024 * 1024
    h, s = _open(make_journal, journal_file_bytes=file_bytes)
    seq = 3
    while s.head_position[1] < file_bytes - 4096:
        seq += 1
        h.track(s.add(msg(Q, seq, b"x" * 2000), None))
        h.settle()
    file_no = s.head_position[0]
    syncs = s.stats().syncs
    removed = 0
    while s.head_position[0] == file_no:
        removed += 1
        h.track(s.remove(Q, removed))
        h.settle()
    # Only removes nobody waits for: the one sync is the rollover's, of the file it sealed.
    assert s.stats().syncs == syncs + 1
    assert removed > 10


def test_a_checkpoint_comes_after_every_write_queued_before_it(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_mod, "MAX_BATCH_OPS", 10)
    h = make_journal(**QUIET)
    h.open()
    assert isinstance(h.store, JournalStore)
    s = h.store
    writer = s._w
    finished = threading.Event()
    with s.writes_paused():
        for seq in range(1, 101):
            h.track(s.add(msg(Q, seq), None))
        asking = threading.Thread(target=lambda: (s.checkpoint(), finished.set()), daemon=True)
        asking.start()
        # Queued behind the 100 adds, which take ten batches.
        with writer.cond:
            while not writer._requests:
                assert writer.cond.wait(30)
    assert finished.wait(60)
    asking.join(5)
    view = s.inspect(10**6)
    assert sum(f.live_by_destination.get(Q, 0) for f in view.files) == 100
    h.settle()
