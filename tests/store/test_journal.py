"""Journal store behaviour beyond the contract: group commit, cancellation, rollover, sync
policies, failures, temporary mode, crashes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from sluice.config import MiB, SyncPolicy
from sluice.errors import CorruptionError, StoreError
from sluice.store.api import RecoveredSubscription, WriteState
from sluice.store.journal import files, scan
from sluice.store.journal import format as fmt
from sluice.store.journal import store as store_mod
from sluice.store.journal.files import list_files
from sluice.store.journal.store import JournalStore

from .helpers import Harness, Sink, copy_running, journal_config, msg

Q = "/queue/j"


def journal(h: Harness) -> JournalStore:
    assert isinstance(h.store, JournalStore)
    return h.store


def seqs(store: JournalStore, destination: str = Q) -> list[int]:
    return [m.seq for m in store.load(destination, 0, 10**9, 1 << 62)]


def test_group_commit_batches_many_adds(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(journal_file_bytes=32 * MiB)
    h.open()
    s = journal(h)
    before = s.stats().syncs
    for seq in range(1, 3001):
        h.track(s.add(msg(Q, seq, b"x" * 1024), None))
    h.settle()
    stats = s.stats()
    syncs = stats.syncs - before
    assert len(h.handles) == 3000
    assert all(x.state is WriteState.WRITTEN for x in h.handles)
    assert 1 <= syncs < 3000 // 10, syncs
    assert stats.batches < 3000 // 10
    assert h.sink.calls == stats.batches


def test_group_commit_from_several_threads(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(journal_file_bytes=32 * MiB)
    h.open()
    s = journal(h)
    lock = threading.Lock()  # the store's methods are called from one thread at a time

    def produce(dest: str) -> None:
        for seq in range(1, 301):
            with lock:
                h.track(s.add(msg(dest, seq, b"y" * 1024), None))

    threads = [threading.Thread(target=produce, args=(f"/queue/t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    h.settle()
    assert s.stats().syncs < 2400 // 2
    for i in range(8):
        assert seqs(s, f"/queue/t{i}") == list(range(1, 301))


def test_cancelled_add_and_remove_write_nothing(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(checkpoint_interval_s=3600, gc_interval_s=3600)
    h.open()
    s = journal(h)
    h.track(s.add(msg(Q, 1), None))
    h.settle()
    position = s.head_position
    written = s.stats().written_records
    with s.writes_paused():
        add = h.track(s.add(msg(Q, 2, b"z" * 5000), None))
        rem = h.track(s.remove(Q, 2))
        assert add.state is WriteState.CANCELLED
        assert rem.state is WriteState.CANCELLED
        assert s.stats().pending_writes == 2
    h.settle()
    assert s.head_position == position
    assert s.stats().written_records == written
    assert s.stats().cancelled_writes == 1
    assert h.sink.count(add) == 1
    assert h.sink.count(rem) == 1
    assert seqs(s) == [1]
    h.reopen()
    assert seqs(journal(h)) == [1]


def test_taken_add_is_not_cancelled_and_dedup_adds_are_kept(
    make_journal: Callable[..., Harness],
) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    add = h.track(s.add(msg(Q, 1), None))
    h.settle()
    rem = h.track(s.remove(Q, 1))
    with s.writes_paused():
        dedup_add = h.track(s.add(msg(Q, 2, headers={"x-dedup-id": "keep"}), None))
        h.track(s.remove(Q, 2))
        assert dedup_add.state is WriteState.PENDING
    h.settle()
    assert add.state is WriteState.WRITTEN
    assert rem.state is WriteState.WRITTEN
    assert dedup_add.state is WriteState.WRITTEN
    recovery = h.reopen()
    assert recovery.destinations[0].dedup_ids == ["keep"]
    assert seqs(journal(h)) == []


def test_direct_try_cancel_is_delivered(make_journal: Callable[..., Harness]) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    with s.writes_paused():
        add = h.track(s.add(msg(Q, 1), None))
        assert add.try_cancel()
    h.settle()
    assert add.state is WriteState.CANCELLED
    h.reopen()
    assert seqs(journal(h)) == []


def test_load_sees_pending_and_written_messages(make_journal: Callable[..., Harness]) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    h.track(s.add(msg(Q, 1, b"written"), None))
    h.settle()
    with s.writes_paused():
        h.track(s.add(msg(Q, 2, b"pending"), None))
        assert [m.body for m in s.load(Q, 0, 10, 1 << 20)] == [b"written", b"pending"]
    h.settle()
    s.checkpoint()
    assert [m.body for m in s.load(Q, 0, 10, 1 << 20)] == [b"written", b"pending"]


def test_load_while_a_batch_is_being_written_reads_the_records_not_the_file(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that looks while the writer is between placing a batch and writing it gets the
    records from memory: the file at their place still holds what was there before."""
    h = make_journal()
    h.open()
    s = journal(h)
    seen: list[list[bytes]] = []
    write = files.HeadFile.write

    def looking_write(self: files.HeadFile, buffers: Sequence[bytes | memoryview]) -> None:
        seen.append([m.body for m in s.load(Q, 0, 10, 1 << 20)])
        write(self, buffers)

    monkeypatch.setattr(files.HeadFile, "write", looking_write)
    h.track(s.add(msg(Q, 1, b"first"), None))
    h.settle()
    h.track(s.add(msg(Q, 2, b"second"), None))
    h.settle()
    assert seen == [[b"first"], [b"first", b"second"]]
    assert s.stats().damaged_records == 0


def test_rollover_and_record_larger_than_a_file(make_journal: Callable[..., Harness]) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    big = os.urandom(3 * MiB)
    for seq in range(1, 401):
        h.track(s.add(msg(Q, seq, os.urandom(8 * 1024)), None))
    h.track(s.add(msg(Q, 401, big), None))
    h.track(s.add(msg(Q, 402, b"after"), None))
    h.settle()
    files = list_files(s.journal_dir)
    assert len(files) >= 5
    assert s.stats().files == len(files)
    h.reopen()
    s = journal(h)
    assert seqs(s) == list(range(1, 403))
    assert s.load(Q, 400, 1, 1)[0].body == big
    assert s.load(Q, 401, 1, 1)[0].body == b"after"


def test_files_after_large_synced_batches_are_fallocated_not_zero_filled(
    make_journal: Callable[..., Harness],
) -> None:
    """Small synced writes keep zero-filled files; once a head file's syncs averaged large
    batches, the files prepared after it are taken with fallocate alone, and read back alike."""
    h = make_journal()
    h.open()
    s = journal(h)
    prealloc = s._prealloc
    assert prealloc is not None
    seq = 0
    while prealloc.zero_filled < 3:  # small messages, each synced on its own
        seq += 1
        h.track(s.add(msg(Q, seq, os.urandom(4 * 1024)), None))
        h.settle()
    assert prealloc.fallocated == 0
    small = seq
    while prealloc.fallocated < 2:  # large messages, each synced on its own
        seq += 1
        h.track(s.add(msg(Q, seq, os.urandom(384 * 1024)), None))
        h.settle()
        assert seq < small + 100, "no file was made without zeros"
    h.reopen()
    s = journal(h)
    assert seqs(s) == list(range(1, seq + 1))
    assert len(s.load(Q, seq - 1, 1, 1)[0].body) == 384 * 1024


def test_load_reads_neighbouring_records_in_pages_and_drops_a_damaged_one(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load` reads a run of records of one file with one pread; a damaged record in the page
    costs that message alone."""
    h = make_journal()
    h.open()
    s = journal(h)
    for seq in range(1, 301):
        h.track(s.add(msg(Q, seq, b"body-%03d" % seq), None))
    h.settle()
    h.reopen()
    s = journal(h)
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(files.os, "pread", counting_pread)
    assert [m.seq for m in s.load(Q, 0, 1000, 1 << 30)] == list(range(1, 301))
    assert len(reads) <= 2, reads  # 300 records, in one or two data files
    monkeypatch.undo()

    record = next(
        item
        for item in scan.FileScan(files.file_path(s.journal_dir, list_files(s.journal_dir)[0]))
        if isinstance(item, scan.ScannedRecord)
        and item.rtype == fmt.RecordType.ADD
        and fmt.decode_add(item.payload)[0].body == b"body-150"
    )
    path = files.file_path(s.journal_dir, list_files(s.journal_dir)[0])
    with open(path, "r+b") as f:
        f.seek(record.offset + record.length - 2)
        byte = f.read(1)
        f.seek(record.offset + record.length - 2)
        f.write(bytes([byte[0] ^ 0x20]))
    s._reader.forget(list_files(s.journal_dir)[0])
    assert [m.seq for m in s.load(Q, 0, 1000, 1 << 30)] == [n for n in range(1, 301) if n != 150]
    assert s.stats().damaged_records == 1


@pytest.mark.parametrize("policy", [SyncPolicy.PERIODIC, SyncPolicy.NEVER])
def test_relaxed_sync_policies(make_journal: Callable[..., Harness], policy: SyncPolicy) -> None:
    h = make_journal(sync=policy, sync_interval_ms=50)
    h.open()
    s = journal(h)
    for seq in range(1, 501):
        h.track(s.add(msg(Q, seq), None))
    h.settle()
    assert s.stats().syncs <= 5
    h.reopen()
    assert seqs(journal(h)) == list(range(1, 501))


def test_write_error_fails_handles_and_stops_writes(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make_journal()
    h.open()
    s = journal(h)
    h.track(s.add(msg(Q, 1), None))
    h.settle()

    def no_space(*_args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", no_space)
    failed = h.track(s.add(msg(Q, 2), None))
    h.settle()
    monkeypatch.undo()
    assert failed.state is WriteState.FAILED
    assert isinstance(failed.error, StoreError)
    assert "No space" in str(failed.error)
    assert s.stats().write_errors == 1
    assert seqs(s) == [1]
    later = h.track(s.add(msg(Q, 3), None))
    h.settle()
    assert later.state is WriteState.FAILED
    s.close()
    h.open()
    assert seqs(journal(h)) == [1]


def test_temporary_store_is_cleared_and_never_synced(tmp_path: Path) -> None:
    config = journal_config(tmp_path / "tmp", sync=SyncPolicy.ALWAYS)
    sink = Sink()
    store = JournalStore(config, temporary=True)
    store.open(sink)
    handles = [store.add(msg(Q, seq), None) for seq in range(1, 101)]
    sink.wait(handles)
    assert store.stats().syncs == 0
    store.close()
    again = JournalStore(config, temporary=True)
    recovery = again.open(sink)
    assert recovery.destinations == []
    assert again.load(Q, 0, 10, 1 << 20) == []
    again.close()


def test_cursor_is_coalesced_and_persisted_at_close(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(checkpoint_interval_s=3600, gc_interval_s=3600)
    h.open()
    s = journal(h)
    h.track(s.put_subscription(RecoveredSubscription("c", "n", "/topic/t", None, 0)))
    h.settle()
    written = s.stats().written_records
    for seq in range(1, 1001):
        s.set_cursor("c", "n", seq)
    recovery = h.reopen()
    assert recovery.subscriptions[0].cursor == 1000
    assert written <= 3  # nothing was written per set_cursor call before close


def test_crash_without_close_keeps_acknowledged_messages(tmp_path: Path) -> None:
    data = tmp_path / "crash"
    script = textwrap.dedent(
        f"""
        import os, threading
        from pathlib import Path
        from sluice.config import StoreConfig
        from sluice.store.api import StoredMessage, RecoveredSubscription
        from sluice.store.journal.store import JournalStore
        done = threading.Event()
        count = [0]
        def sink(handles):
            count[0] += len(handles)
            if count[0] >= 2002:
                done.set()
        store = JournalStore(StoreConfig(data_dir=Path({str(data)!r}), journal_file_bytes=1 << 20))
        store.open(sink)
        for i in range(1, 2001):
            store.add(StoredMessage("/queue/c", i, f"m{{i}}", i, {{}}, b"p" * 700), None)
        store.begin("open-tx")
        store.add(StoredMessage("/queue/c", 0, "tx", 1, {{}}, b"t"), None, "open-tx")
        store.put_subscription(RecoveredSubscription("c", "s", "/topic/x", None, 4))
        assert done.wait(30)
        os._exit(0)
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    sink = Sink()
    store = JournalStore(journal_config(data))
    recovery = store.open(sink)
    try:
        assert [m.seq for m in store.load("/queue/c", 0, 10**6, 1 << 62)] == list(range(1, 2001))
        assert recovery.subscriptions[0].cursor == 4
        assert any("1 uncommitted transactions dropped" in line for line in recovery.report)
    finally:
        store.close()


def test_open_transaction_at_crash_is_dropped(
    make_journal: Callable[..., Harness], tmp_path: Path
) -> None:
    h = make_journal(checkpoint_interval_s=3600, gc_interval_s=3600)
    h.open()
    s = journal(h)
    s.begin("t")
    for _ in range(3):
        h.track(s.add(msg(Q, 0), None, "t"))
    h.track(s.add(msg(Q, 1), None))
    h.settle()
    copy_running(s, tmp_path / "copy")
    again = make_journal(tmp_path / "copy")
    recovery = again.open()
    assert seqs(journal(again)) == [1]
    assert any("1 uncommitted" in line for line in recovery.report)


def test_rollover_syncs_the_full_file_the_new_file_and_the_directory(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    # With SyncPolicy.NEVER the writer syncs nothing per batch: every sync seen is rollover's.
    events: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def name_of(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).removesuffix(".spare")

    def note(kind: str, name: str, offset: int = 0) -> None:
        with lock:
            events.append((kind, name, offset))

    real_fdatasync, real_fsync, real_rename = os.fdatasync, os.fsync, os.rename
    real_dir, real_write = files.fsync_dir, files.write_all

    def fdatasync(fd: int) -> None:
        note("sync", name_of(fd))
        real_fdatasync(fd)

    def fsync(fd: int) -> None:
        note("sync", name_of(fd))
        real_fsync(fd)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_rename(src, dst)
        note("rename", os.path.basename(dst))

    def fsync_dir(path: Path) -> None:
        note("dirsync", path.name)
        real_dir(path)

    def write_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> int:
        note("write", name_of(fd), offset)
        return real_write(fd, buffers, offset)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(files, "fsync_dir", fsync_dir)
    monkeypatch.setattr(files, "write_all", write_all)
    h = make_journal(sync=SyncPolicy.NEVER)
    h.open()
    s = journal(h)
    for seq in range(1, 500):
        h.track(s.add(msg(Q, seq, os.urandom(8 * 1024)), None))
    h.settle()
    with lock:
        seen = list(events)
    rolled = [n for n in list_files(s.journal_dir) if n > 1]
    assert len(rolled) >= 3
    header = fmt.FILE_HEADER_RECORD_BYTES
    for n in rolled:
        new, old = f"db-{n}.log", f"db-{n - 1}.log"
        first_append = seen.index(("write", new, header))
        before = seen[:first_append]
        last_old_write = max(i for i, e in enumerate(before) if e[:2] == ("write", old))
        assert ("sync", old, 0) in before[last_old_write:], f"{old} not synced before {new}"
        created = max(i for i, e in enumerate(before) if e[:2] == ("write", new))
        assert ("sync", new, 0) in before[created:], f"{new} not synced once complete"
        named = max([i for i, e in enumerate(before) if e == ("rename", new, 0)] + [created])
        assert ("dirsync", "journal", 0) in before[named:], f"directory not synced for {new}"


def test_reader_bounds_a_location_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files.create_file(tmp_path / "db-1.log", 1, b"s" * 16, MiB)
    reader = files.FileReader(tmp_path)
    asked: list[int] = []
    real = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        asked.append(length)
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", pread)
    header = fmt.FILE_HEADER_RECORD_BYTES
    bad = [
        (1, header, 0xFFFF_FFFF),  # a length read from a damaged index: 4 GiB
        (1, header, files.MAX_RECORD_BYTES + 1),
        (1, header, 3),  # shorter than a record header
        (1, MiB - 10, 100),  # runs past the end of the file
        (2, header, 100),  # no such file
    ]
    for file_no, offset, length in bad:
        with pytest.raises(CorruptionError) as info:
            reader.read(file_no, offset, length)
        assert info.value.path == str(tmp_path / f"db-{file_no}.log")
        assert info.value.offset == offset
    assert asked == []  # nothing was read, nothing allocated
    assert len(reader.read(1, 0, header)) == header
    reader.close()


def test_an_older_remove_committed_keeps_a_newer_remove_of_the_same_key_hidden(
    tmp_path: Path,
) -> None:
    """Found by the store simulation (seed 2226366891): a remove's overlay entry stays until an
    index commit holds the remove. A destination deleted and filled again reuses sequences, so
    an old remove of a sequence and a new remove of the same sequence can both wait in the
    overlay; the commit that holds only the old one must not drop the new one's entry, or the
    acknowledged message shows again until the next commit."""
    reached = threading.Event()
    go = threading.Event()
    removed = threading.Event()
    gate: list[object] = []
    watched: list[object] = []

    def sink(handles: Sequence[object]) -> None:
        if any(h is g for h in handles for g in gate):
            reached.set()
            assert go.wait(20.0)
        if any(h is w for h in handles for w in watched):
            removed.set()

    config = journal_config(
        tmp_path, checkpoint_interval_s=3600, gc_interval_s=3600, index_write_batch=3
    )
    store = JournalStore(config)
    store.open(sink)
    try:
        store.add(msg(Q, 1, b"old"), None)
        store.checkpoint()
        store.remove(Q, 1)
        store.delete_destination(Q)
        add = store.add(msg(Q, 1, b"new", headers={"x-dedup-id": "d1"}), None)
        gate.append(add)
        # The writer has written the new add (the third update, so the index commits next):
        # the new remove is queued before that commit.
        assert reached.wait(20.0)
        remove = store.remove(Q, 1)
        watched.append(remove)
        go.set()
        # Written, and the index committed the old remove but not this one yet.
        assert removed.wait(20.0)
        assert remove.state is WriteState.WRITTEN
        assert seqs(store) == []
        store.checkpoint()
        assert seqs(store) == []
    finally:
        go.set()
        store.close()


class _CountingLock:
    """A lock that counts how often it is taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_first_seq_by_time_scans_in_chunks_and_finds_across_them(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan by time lets go of the store's lock every FIRST_SEQ_CHUNK entries (the writer
    takes it for each batch), and finds the same answer on either side of a chunk boundary,
    in the index and in the overlay of writes not yet checkpointed."""
    monkeypatch.setattr(store_mod, "FIRST_SEQ_CHUNK", 10)
    h = make_journal(index_write_batch=10**9, checkpoint_interval_s=3600.0)
    h.open()
    for seq in range(1, 46):
        h.track(h.s.add(msg("/topic/t", seq, ts=1_000 + seq), None))
    h.settle()
    store = h.s
    assert isinstance(store, JournalStore)
    store.checkpoint()  # the first 45 in the index
    for seq in range(46, 61):
        h.track(h.s.add(msg("/topic/t", seq, ts=1_000 + seq), None))
    h.settle()  # 15 more in the overlay
    counting = _CountingLock()
    monkeypatch.setattr(store, "_lock", counting)
    assert store.first_seq("/topic/t", 1_010) == 10
    assert store.first_seq("/topic/t", 1_011) == 11
    assert store.first_seq("/topic/t", 1_055) == 55
    counting.taken = 0
    assert store.first_seq("/topic/t", 2_000) == 0
    assert counting.taken == 7  # 60 entries, 10 at a time, and the empty look that ends it
