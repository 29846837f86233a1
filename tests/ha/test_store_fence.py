"""The journal store with a fence: it starts a new data file at open, and once the fence closes
it writes nothing more (the batch fails with `FencedError`, the store takes no more writes)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sluice.config import MiB, StoreConfig
from sluice.errors import FencedError, StoreError
from sluice.store.api import WriteState
from sluice.store.journal.detach import detach_previous_master
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.store import JournalStore
from store.helpers import Sink, msg


class _Fence:
    """A fence a test opens and closes."""

    def __init__(self) -> None:
        self.open = True
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        if not self.open:
            raise FencedError("test fence closed")


def _digests(journal: Path) -> dict[int, str]:
    return {
        n: hashlib.sha256(file_path(journal, n).read_bytes()).hexdigest()
        for n in list_files(journal)
    }


def test_closed_fence_stops_every_write(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path, journal_file_bytes=1 * MiB, gc_interval_s=3600)
    journal = tmp_path / "journal"
    plain = JournalStore(config)
    sink = Sink()
    plain.open(sink)
    handle = plain.add(msg("/queue/q", 1), None)
    sink.wait([handle])
    plain.close()
    assert list_files(journal) == [1]

    fence = _Fence()
    store = JournalStore(config, fence=fence)
    sink = Sink()
    store.open(sink)
    try:
        # A master under a lease never appends to a file an earlier master had open.
        assert list_files(journal) == [1, 2]
        written = store.add(msg("/queue/q", 2), None)
        sink.wait([written])
        assert written.state is WriteState.WRITTEN
        assert fence.checks >= 2  # before the write and before the confirmation
        before = _digests(journal)

        fence.open = False
        refused = store.add(msg("/queue/q", 3), None)
        sink.wait([refused])
        assert refused.state is WriteState.FAILED
        assert isinstance(refused.error, FencedError)
        with pytest.raises(StoreError):
            store.checkpoint()
        assert _digests(journal) == before
    finally:
        store.close()
    assert _digests(journal) == before


def test_a_new_data_file_never_replaces_one_of_its_number(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path, journal_file_bytes=1 * MiB, gc_interval_s=3600)
    journal = tmp_path / "journal"
    store = JournalStore(config)
    sink = Sink()
    store.open(sink)
    try:
        # Another master started data file 2 meanwhile: this one must not write over it.
        other = file_path(journal, 2)
        other.write_bytes(b"the other master's file")
        body = b"x" * (600 * 1024)
        first = store.add(msg("/queue/q", 1, body), None)
        second = store.add(msg("/queue/q", 2, body), None)
        sink.wait([first, second])
        assert WriteState.FAILED in (first.state, second.state)
        assert other.read_bytes() == b"the other master's file"
    finally:
        store.close()


def test_detached_head_takes_no_more_writes_from_the_old_descriptor(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path, journal_file_bytes=1 * MiB, gc_interval_s=3600)
    journal = tmp_path / "journal"
    store = JournalStore(config)
    sink = Sink()
    store.open(sink)
    handle = store.add(msg("/queue/q", 1), None)
    sink.wait([handle])
    store.close()
    head = file_path(journal, list_files(journal)[-1])
    old_fd = os.open(head, os.O_RDWR)  # as the frozen master holds it
    try:
        before = head.read_bytes()
        detach_previous_master(tmp_path)
        assert head.read_bytes() == before
        assert (tmp_path / "index.detached" / "data.mdb").is_file()
        assert (tmp_path / "index" / "data.mdb").is_file()
        os.pwrite(old_fd, b"late write of the old master", 4096)
        assert head.read_bytes() == before
    finally:
        os.close(old_fd)
    reopened = JournalStore(config)
    recovery = reopened.open(Sink())
    try:
        assert [d.name for d in recovery.destinations] == ["/queue/q"]
        assert [m.seq for m in reopened.load("/queue/q", 0, 10, 1 << 20)] == [1]
    finally:
        reopened.close()
