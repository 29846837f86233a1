"""The journal store without disk space, and the writer's waits.

Preparing a data file that finds no room is tried again later, never in a loop; a batch refused
for lack of space fails its writes and keeps the store (when every one of them can simply fail),
or fails the store (when it carries records that cannot); every cross-thread wait on the writer
is bounded and ends when the writer stops or fails.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import lmdb
import pytest

from sluice.errors import DiskFullError, StoreError
from sluice.store.api import WriteState
from sluice.store.journal import files
from sluice.store.journal.files import Preallocator
from sluice.store.journal.store import JournalStore
from sluice.store.journal.tools import rebuild_index

from .helpers import FailingCommit, Harness, msg
from .test_journal import journal, seqs

Q = "/queue/room"
BODY = b"x" * (100 * 1024)  # a dozen fill a 1 MiB data file


def _no_space(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_that_finds_no_room_is_tried_again_later_not_in_a_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[float] = []

    def create_file(*args: object, **kwargs: object) -> None:
        attempts.append(time.monotonic())
        _no_space()

    monkeypatch.setattr(files, "create_file", create_file)
    prealloc = Preallocator(tmp_path, b"s" * 16, 1 << 20)
    prealloc.prepare(2)
    started = time.monotonic()
    time.sleep(1.5)
    prealloc.stop()
    assert time.monotonic() - started < 2.0  # stopping did not wait for anything
    # Once at once, once after PREPARE_RETRY_S: a spinning helper made thousands.
    assert 1 <= len(attempts) <= 3, len(attempts)
    assert all(b - a >= files.PREPARE_RETRY_S * 0.9 for a, b in itertools.pairwise(attempts))
    assert isinstance(prealloc.error, DiskFullError)
    assert not prealloc.ready_for(2)
    with pytest.raises(StoreError, match="closing"):
        prealloc.ensure(2)


def test_a_file_cut_short_by_a_full_disk_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev
    calls = 0

    def pwritev(fd: int, buffers: Sequence[bytes], offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls > 3:
            _no_space()
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    path = tmp_path / "db-1.log"
    with pytest.raises(OSError) as info:
        files.create_file(path, 1, b"s" * 16, 8 << 20)
    assert info.value.errno == errno.ENOSPC
    assert not path.exists()


def test_a_write_that_writes_nothing_raises_instead_of_spinning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pwritev", lambda fd, buffers, offset: 0)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError) as info:
            files.write_all(fd, [b"abc"], 0)
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _refuse_new_files(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """A switch: while on, no data file can be made (as on a full disk)."""
    refusing = {"on": True}
    real = files.create_file

    def create_file(*args: object, **kwargs: object) -> None:
        if refusing["on"]:
            _no_space()
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(files, "create_file", create_file)

    def switch(on: bool) -> None:
        refusing["on"] = on

    return switch


def _fill_head(h: Harness, first_seq: int) -> int:
    """Add messages one by one while they fit in the head file; returns the next sequence."""
    s = journal(h)
    head = s.head_position[0]
    seq = first_seq
    while s.head_position[1] + 2 * len(BODY) < 1 << 20:
        h.track(s.add(msg(Q, seq, BODY), None))
        h.settle()
        seq += 1
    assert s.head_position[0] == head
    return seq


def test_a_batch_with_no_room_fails_its_writes_and_keeps_the_store(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make_journal(gc_interval_s=3600)
    refuse = _refuse_new_files(monkeypatch)  # no spare for the next file either
    h.open()
    s = journal(h)
    seq = _fill_head(h, 1)
    kept = list(range(1, seq))
    head = s.head_position
    # Two that need the next data file: refused, nothing of them written.
    with s.writes_paused():
        refused = [h.track(s.add(msg(Q, n, BODY), None)) for n in (seq, seq + 1)]
    h.settle()
    assert [x.state for x in refused] == [WriteState.FAILED] * 2
    assert all(isinstance(x.error, DiskFullError) for x in refused)
    assert s.head_position == head
    stats = s.stats()
    assert stats.no_space_errors == 1
    assert stats.no_space
    assert stats.write_errors == 0
    assert seqs(s, Q) == kept
    # What fits in the head file is still written (acks, small messages).
    small = h.track(s.add(msg(Q, seq + 2), None))
    removed = h.track(s.remove(Q, 1))
    h.settle()
    assert small.state is WriteState.WRITTEN
    assert removed.state is WriteState.WRITTEN
    kept = [*kept[1:], seq + 2]
    # Space is back: the next batch rolls over and is written.
    refuse(False)
    later = [h.track(s.add(msg(Q, n, BODY), None)) for n in range(seq + 3, seq + 6)]
    h.settle()
    assert all(x.state is WriteState.WRITTEN for x in later)
    assert s.head_position[0] == head[0] + 1
    h.reopen()
    assert seqs(journal(h), Q) == [*kept, *range(seq + 3, seq + 6)]


def test_a_refused_batch_that_cannot_simply_fail_fails_the_store(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make_journal(gc_interval_s=3600)
    refuse = _refuse_new_files(monkeypatch)
    h.open()
    s = journal(h)
    seq = _fill_head(h, 1)
    # A transaction's records cannot simply fail: the store does, and a restart recovers.
    with s.writes_paused():
        s.begin("tx")
        adds = [h.track(s.add(msg(Q, 0, BODY), None, "tx")) for _ in range(2)]
    h.settle()
    assert all(x.state is WriteState.FAILED for x in adds)
    assert s.stats().write_errors == 1
    refuse(False)
    after = h.track(s.add(msg(Q, seq), None))
    h.settle()
    assert after.state is WriteState.FAILED  # a failed store takes nothing more
    h.reopen()
    assert seqs(journal(h), Q) == list(range(1, seq))


def test_a_rollover_that_fails_once_the_next_file_is_named_fails_the_store(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the lifecycle simulation (seed 1729680961). The spare was renamed to the next
    data file, then syncing the directory (or opening the file) failed with ENOSPC: the batch
    was refused as if nothing had changed and the store went on appending to the old head,
    behind a newer file. A crash tearing one of those appends left damage in a file that is no
    longer the newest, which recovery may not cut off: the next start stopped on it."""
    h = make_journal(gc_interval_s=3600)
    h.open()
    s = journal(h)
    seq = _fill_head(h, 1)
    head_no, offset = s.head_position
    # Leave the head less room than one more BODY: the next batch goes to the next file only.
    h.track(s.add(msg(Q, seq, b"f" * ((1 << 20) - offset - 4096)), None))
    h.settle()
    seq += 1
    assert s.head_position[0] == head_no
    old_head = files.file_path(s.journal_dir, head_no)
    sealed = old_head.read_bytes()
    real_fsync_dir = files.fsync_dir
    monkeypatch.setattr(files, "fsync_dir", _no_space)
    with s.writes_paused():
        rolled = h.track(s.add(msg(Q, seq, BODY), None))
    h.settle()
    monkeypatch.setattr(files, "fsync_dir", real_fsync_dir)
    assert rolled.state is WriteState.FAILED
    assert not isinstance(rolled.error, DiskFullError)
    assert files.file_path(s.journal_dir, head_no + 1).exists()
    assert s.stats().write_errors == 1
    # A small record fits in the old head, but that file is sealed: nothing more goes there.
    small = h.track(s.add(msg(Q, seq + 1), None))
    h.settle()
    assert small.state is WriteState.FAILED
    assert old_head.read_bytes() == sealed
    h.reopen()
    s = journal(h)
    assert seqs(s, Q) == list(range(1, seq))
    assert s.head_position[0] == head_no + 1


def test_waits_on_a_failed_writer_end_at_once(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    monkeypatch.setattr(os, "fdatasync", _no_space)
    h.track(s.add(msg(Q, 1), None))
    h.settle()
    started = time.monotonic()
    with s.writes_paused():  # used to poll for ever: a failed writer never parks
        pass
    with pytest.raises(StoreError, match="failed"):
        s.checkpoint()
    with pytest.raises(StoreError, match="failed"):
        s.gc()
    assert time.monotonic() - started < 1.0
    s.close()
    with pytest.raises(StoreError):
        s.checkpoint()


def test_a_request_to_a_stopping_writer_is_refused(make_journal: Callable[..., Harness]) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    writer = s._w
    writer.stop()
    started = time.monotonic()
    with pytest.raises(StoreError, match="not running"):
        s.checkpoint()
    with pytest.raises(StoreError, match="not running"):
        s.gc()
    assert time.monotonic() - started < 1.0


def test_a_cancelled_sequence_survives_a_close_on_a_full_disk(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled add used its sequence; the DEST_SEQ that records it goes with a checkpoint.
    When the journal has no room for it (the head file is full, no next file can be made), the
    close still keeps the sequence (in the index), and a later checkpoint with room writes it
    to the journal. Before, the last checkpoint was skipped and the sequence handed out again."""
    h = make_journal(checkpoint_interval_s=3600, gc_interval_s=3600)
    refuse = _refuse_new_files(monkeypatch)
    h.open()
    s = journal(h)
    # A record bigger than a data file fills the head file by itself.
    h.track(s.add(msg(Q, 1, b"x" * (s.config.journal_file_bytes + 1024)), None))
    h.settle()
    with s.writes_paused():
        add = h.track(s.add(msg(Q, 2), None))
        h.track(s.remove(Q, 2))
    h.settle()
    assert add.state is WriteState.CANCELLED
    recovery = h.reopen()
    assert [(d.name, d.last_seq) for d in recovery.destinations] == [(Q, 2)]
    assert seqs(journal(h), Q) == [1]
    # Room again: the next checkpoint puts the sequence in the journal, so a rebuild finds it.
    refuse(False)
    h.reopen()
    h.close()
    shutil.rmtree(journal(h).config.data_dir / "index")
    recovery = h.open()
    assert [(d.name, d.last_seq) for d in recovery.destinations] == [(Q, 2)]


def _cancelled_on_a_full_disk(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> tuple[Harness, JournalStore]:
    """A journal whose head file is full and that may make no next file, with the add of
    sequence 2 of `Q` cancelled before it was written (its sequence used all the same)."""
    h = make_journal(checkpoint_interval_s=3600, gc_interval_s=3600)
    _refuse_new_files(monkeypatch)
    h.open()
    s = journal(h)
    # A record bigger than a data file fills the head file by itself.
    h.track(s.add(msg(Q, 1, b"x" * (s.config.journal_file_bytes + 1024)), None))
    h.settle()
    with s.writes_paused():
        add = h.track(s.add(msg(Q, 2), None))
        h.track(s.remove(Q, 2))
    h.settle()
    assert add.state is WriteState.CANCELLED
    return h, s


def test_a_held_sequence_survives_an_index_commit_that_found_no_room(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint that holds a cancelled sequence in the index (no room for its DEST_SEQ)
    meets a full disk in the index commit too: the state comes back from the last commit and
    the journal, and the sequence is held again by the next checkpoint, not lost."""
    h, s = _cancelled_on_a_full_disk(make_journal, monkeypatch)
    index = s._index
    assert index is not None
    with s.writes_paused():
        index.txn = FailingCommit(
            index.txn, lmdb.DiskError("mdb_txn_commit: No space left on device")
        )
    with pytest.raises(DiskFullError, match="committing the index"):
        s.checkpoint()
    s.checkpoint()  # the index has room now; the journal still has none
    recovery = h.reopen()
    assert [(d.name, d.last_seq) for d in recovery.destinations] == [(Q, 2)]


def test_a_rebuild_keeps_a_sequence_the_index_held_alone(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the store simulation (seed 2072828600): a cancelled sequence that no DEST_SEQ
    could record for lack of room lives in the index alone. `rebuild-index` threw that index
    away, so the sequence was handed out again after it; the rebuild now takes it over from
    the old index when that one can be read."""
    h, s = _cancelled_on_a_full_disk(make_journal, monkeypatch)
    h.s.close()
    h.store = None
    config = s.config
    rebuild_index(config.data_dir, config)
    recovery = h.open()
    assert [(d.name, d.last_seq) for d in recovery.destinations] == [(Q, 2)]
    assert seqs(journal(h), Q) == [1]


def test_a_rebuild_keeps_a_destination_known_only_by_its_held_sequence(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the store simulation (seed 12233716): a destination whose every add was
    cancelled while the disk was full has no record in the journal, only the sequence the index
    holds. The rebuild kept held sequences only for destinations the journal had, so this one
    vanished and its sequences would have been handed out again."""
    h, s = _cancelled_on_a_full_disk(make_journal, monkeypatch)
    other = "/topic/only-cancelled"
    with s.writes_paused():
        add = h.track(s.add(msg(other, 1), None))
        h.track(s.remove(other, 1))
    h.settle()
    assert add.state is WriteState.CANCELLED
    h.s.close()
    h.store = None
    config = s.config
    rebuild_index(config.data_dir, config)
    recovery = h.open()
    assert sorted((d.name, d.last_seq) for d in recovery.destinations) == [(Q, 2), (other, 1)]
