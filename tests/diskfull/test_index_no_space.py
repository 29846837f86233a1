"""An index checkpoint on a full disk (a real small tmpfs): LMDB's commit meets ENOSPC.

LMDB aborts a write transaction whose commit fails and keeps the state of the last commit, so
the index on disk stays consistent, at the previous checkpoint. The journal holds everything
since: the store takes the episode as a full disk (the checkpoint is put off, nothing fails,
writes go on into the head file) and checkpoints again once there is room. Any other error of
the index commit (EIO) still fails the store.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from sluice.errors import DiskFullError, StoreIOError
from sluice.store.api import WriteState
from sluice.store.journal.store import JournalStore
from sluice.store.journal.tools import verify
from store.helpers import FailingCommit, Harness, journal_config, msg

Q = "/queue/index-room"
MESSAGES = 3000  # their index entries need fresh LMDB pages at the next commit
CHUNK = 64 * 1024


def _store(data: Path) -> Harness:
    # Checkpoints only when the test asks: the disk fills between two of them.
    config = journal_config(
        data, checkpoint_interval_s=3600.0, index_write_batch=10**9, gc_interval_s=3600.0
    )
    return Harness("journal", lambda: JournalStore(config))


def _journal(h: Harness) -> JournalStore:
    assert isinstance(h.store, JournalStore)
    return h.store


def _seqs(store: JournalStore) -> list[int]:
    return [m.seq for m in store.load(Q, 0, 10**9, 1 << 62)]


def _fill(mount: Path) -> Path:
    """Take every free byte of the filesystem."""
    ballast = mount / "ballast"
    chunk = b"\xff" * CHUNK
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = CHUNK
        while size:
            try:
                os.write(fd, chunk[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2
    finally:
        os.close(fd)
    assert os.statvfs(mount).f_bavail == 0
    return ballast


def _add_many(h: Harness, first: int, count: int) -> None:
    s = _journal(h)
    handles = [h.track(s.add(msg(Q, n, b"m%d" % n), None)) for n in range(first, first + count)]
    h.settle()
    assert all(x.state is WriteState.WRITTEN for x in handles)


def test_an_index_checkpoint_on_a_full_disk_is_put_off_and_the_store_goes_on(
    small_fs: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    mount = small_fs(8)
    h = _store(mount / "data")
    h.open()
    s = _journal(h)
    _add_many(h, 1, MESSAGES)
    ballast = _fill(mount)
    caplog.set_level(logging.INFO, logger="sluice.store.journal")
    for _ in range(2):  # tried again, and put off again: logged once
        with pytest.raises(DiskFullError):
            s.checkpoint()
    stats = s.stats()
    assert stats.write_errors == 0
    assert stats.no_space
    put_off = [r for r in caplog.records if "index checkpoint put off" in r.getMessage()]
    assert len(put_off) == 1, caplog.text
    assert not any(r.exc_info for r in caplog.records), caplog.text
    # The store goes on: acknowledgements and small messages fit in its head file, and
    # what it holds reads back (the index of the last commit and the changes since).
    removed = h.track(s.remove(Q, 1))
    _add_many(h, MESSAGES + 1, 10)
    assert removed.state is WriteState.WRITTEN
    assert _seqs(s) == list(range(2, MESSAGES + 11))
    # Room again: the checkpoint is taken, the store leaves its full state by itself.
    ballast.unlink()
    s.checkpoint()
    assert not s.stats().no_space
    assert any("index checkpoint taken again" in r.getMessage() for r in caplog.records)
    _add_many(h, MESSAGES + 11, 10)
    h.reopen()
    assert _seqs(_journal(h)) == list(range(2, MESSAGES + 21))
    assert h.recovery is not None
    assert not any("rebuilt" in line for line in h.recovery.report), h.recovery.report
    h.close()
    report = verify(mount / "data", journal_config(mount / "data"))
    assert report.ok, report


def test_an_index_commit_that_meets_an_io_error_fails_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = _store(tmp_path / "data")
    h.open()
    s = _journal(h)
    _add_many(h, 1, 10)
    index = s._index  # the error is injected into the index's write transaction
    assert index is not None
    with s.writes_paused():
        index.txn = FailingCommit(index.txn, lmdb.Error("mdb_txn_commit: Input/output error"))
    with pytest.raises(StoreIOError, match="committing the index"):
        s.checkpoint()
    stats = s.stats()
    assert stats.write_errors == 1
    assert not stats.no_space
    assert "index checkpoint put off" not in caplog.text
    refused = h.track(s.add(msg(Q, 11), None))
    h.settle()
    assert refused.state is WriteState.FAILED
    h.reopen()
    assert _seqs(_journal(h)) == list(range(1, 11))
    h.close()


def test_an_index_commit_cut_short_on_a_full_disk_is_a_full_disk(
    small_fs: Callable[..., Path],
) -> None:
    """LMDB reports a page write the disk cut short as EIO: on a filesystem with nothing free,
    that is the full disk, put off like ENOSPC, not a failed store."""
    mount = small_fs(8)
    h = _store(mount / "data")
    h.open()
    s = _journal(h)
    _add_many(h, 1, 10)
    ballast = _fill(mount)
    index = s._index  # the error is injected into the index's write transaction
    assert index is not None
    with s.writes_paused():
        index.txn = FailingCommit(index.txn, lmdb.Error("mdb_txn_commit: Input/output error"))
    with pytest.raises(DiskFullError, match="committing the index"):
        s.checkpoint()
    stats = s.stats()
    assert stats.write_errors == 0
    assert stats.no_space
    ballast.unlink()
    s.checkpoint()
    assert not s.stats().no_space
    h.reopen()
    assert _seqs(_journal(h)) == list(range(1, 11))
    h.close()
