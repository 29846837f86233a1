"""The fault-injecting file layer on its own: faults, crash images, power loss, disk capacity,
descriptor ownership, all through the journal's `files` module as the store uses it."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.config import KiB, StoreConfig
from sluice.errors import DiskFullError
from sluice.store.api import StoredMessage, WriteHandle, WriteState
from sluice.store.journal import files
from sluice.store.journal.store import JournalStore

from .faultfs import (
    CrashPlan,
    Fault,
    FaultFS,
    FaultKind,
    SimulatedCrash,
    Target,
)


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FaultFS]:
    root = tmp_path / "data"
    (root / "journal").mkdir(parents=True)
    layer = FaultFS(root, tmp_path / "image")
    with layer.installed():
        yield layer


def journal_file(fs: FaultFS, name: str = "db-1.log") -> tuple[int, Path]:
    path = fs.root / "journal" / name
    return fs.proxy.open(path, os.O_RDWR | os.O_CREAT, 0o644), path


def image_bytes(fs: FaultFS, path: Path) -> bytes:
    return (fs.image / path.relative_to(fs.root)).read_bytes()


def test_the_journal_modules_use_the_proxy_while_installed(tmp_path: Path) -> None:
    layer = FaultFS(tmp_path, tmp_path / "image")
    assert vars(files)["os"] is os
    with layer.installed():
        assert vars(files)["os"] is layer.proxy
        assert layer.proxy.O_RDWR == os.O_RDWR  # everything else is the real module's
    assert vars(files)["os"] is os


def test_a_short_write_is_counted_and_write_all_finishes_it(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    fs.arm_fault(Fault(FaultKind.SHORT, Target.WRITE, after=1, fraction=0.25))
    assert files.write_all(fd, [b"a" * 100, b"b" * 100], 0) == 200
    fs.proxy.close(fd)
    assert path.read_bytes() == b"a" * 100 + b"b" * 100
    assert fs.stats.injected == {"short": 1}
    assert [(kind, call) for kind, call, _ in fs.take_fired()] == [(FaultKind.SHORT, "pwritev")]


def test_a_write_that_fills_the_disk_lands_part_then_fails(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    fs.arm_fault(Fault(FaultKind.FILLS, Target.WRITE, after=2, fraction=0.5))
    files.write_all(fd, [b"x" * 10], 0)
    with pytest.raises(OSError) as raised:
        files.write_all(fd, [b"y" * 10], 10)
    fs.proxy.close(fd)
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"x" * 10 + b"y" * 5


def test_sync_and_meta_faults_raise_their_errno(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    fs.arm_fault(Fault(FaultKind.EIO, Target.SYNC))
    with pytest.raises(OSError) as raised:
        fs.proxy.fdatasync(fd)
    assert raised.value.errno == errno.EIO
    fs.proxy.fdatasync(fd)  # one-shot
    fs.proxy.close(fd)
    fs.arm_fault(Fault(FaultKind.ENOSPC, Target.META))
    with pytest.raises(OSError) as raised:
        fs.proxy.rename(path, path.with_suffix(".moved"))
    assert raised.value.errno == errno.ENOSPC
    assert path.exists()


def test_a_crash_images_the_disk_at_its_call_and_kills_every_later_one(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    fs.arm_crash(CrashPlan(after=2))
    files.write_all(fd, [b"first"], 0)
    with pytest.raises(SimulatedCrash):
        files.write_all(fd, [b"second"], 5)
    assert fs.crashed()
    assert image_bytes(fs, path) == b"first"
    with pytest.raises(SimulatedCrash):
        fs.proxy.fsync(fd)
    fs.revive()
    files.write_all(fd, [b"after"], 5)
    fs.proxy.close(fd)
    assert path.read_bytes() == b"firstafter"
    assert fs.stats.crashes == 1


def test_a_torn_crash_lands_part_of_its_write(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    fs.arm_crash(CrashPlan(after=1, torn=0.5))
    with pytest.raises(SimulatedCrash):
        files.write_all(fd, [b"0123456789"], 0)
    fs.revive()
    fs.proxy.close(fd)
    assert image_bytes(fs, path) == b"01234"


def test_power_loss_drops_what_was_not_synced(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    files.write_all(fd, [b"synced.."], 0)
    fs.proxy.fdatasync(fd)
    files.write_all(fd, [b"lost"], 8)
    files.write_all(fd, [b"S"], 0)  # an unsynced overwrite is undone too
    fs.arm_crash(CrashPlan(after=1, power=True))
    with pytest.raises(SimulatedCrash):
        fs.proxy.fdatasync(fd)
    fs.revive()
    fs.proxy.close(fd)
    assert image_bytes(fs, path) == b"synced.."
    assert path.read_bytes() == b"Synced..lost"


def test_bytes_a_failed_sync_covered_stay_lost_after_a_later_sync(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    files.write_all(fd, [b"kept"], 0)
    fs.proxy.fdatasync(fd)
    files.write_all(fd, [b"gone"], 4)
    fs.arm_fault(Fault(FaultKind.EIO, Target.SYNC))
    with pytest.raises(OSError):
        fs.proxy.fdatasync(fd)
    fs.proxy.fdatasync(fd)  # succeeds, but the kernel has dropped those pages already
    fs.arm_crash(CrashPlan(after=1_000, power=True))
    fs.crash_now()
    fs.revive()
    fs.proxy.close(fd)
    assert image_bytes(fs, path) == b"kept"


def test_power_loss_after_a_failed_directory_sync_images_the_files(fs: FaultFS) -> None:
    """Seed 3612451224: a failed fsync of `journal/` (after an archive's rename) was kept as a
    path whose bytes a power loss drops, and taking the image opened the directory to write."""
    fd, path = journal_file(fs)
    files.write_all(fd, [b"kept"], 0)
    fs.proxy.fdatasync(fd)
    fs.arm_fault(Fault(FaultKind.EIO, Target.SYNC))
    with pytest.raises(OSError):
        files.fsync_dir(fs.root / "journal")
    fs.arm_crash(CrashPlan(after=1_000, power=True))
    fs.crash_now()
    fs.revive()
    fs.proxy.close(fd)
    assert image_bytes(fs, path) == b"kept"


def test_a_full_disk_writes_what_fits_then_refuses(fs: FaultFS) -> None:
    fd, path = journal_file(fs)
    files.write_all(fd, [b"z" * 100], 0)
    fs.capacity_bytes = fs.used_bytes() + 30
    with pytest.raises(OSError) as raised:
        files.write_all(fd, [b"w" * 50], 100)
    assert raised.value.errno == errno.ENOSPC
    assert path.stat().st_size == 130
    files.write_all(fd, [b"o" * 50], 0)  # overwriting needs no room
    fs.capacity_bytes = None
    files.write_all(fd, [b"w" * 50], 130)
    fs.proxy.close(fd)


def test_closing_a_descriptor_not_held_is_refused_and_recorded(fs: FaultFS) -> None:
    fd, _path = journal_file(fs)
    fs.proxy.close(fd)
    reused = os.open(fs.root / "journal" / "other", os.O_RDWR | os.O_CREAT, 0o644)
    fs.proxy.close(fd)  # the store's stale number: maybe `reused` by now
    assert len(fs.take_misuses()) == 1
    with pytest.raises(OSError) as raised:
        files.write_all(fd, [b"into someone else's file?"], 0)
    assert raised.value.errno == errno.EBADF
    assert len(fs.take_misuses()) == 1
    os.fstat(reused)  # still open, and untouched: the layer refused both
    assert os.pread(reused, 100, 0) == b""
    os.close(reused)


def test_descriptors_left_open_are_closed_and_counted(tmp_path: Path) -> None:
    layer = FaultFS(tmp_path, tmp_path / "image")
    with layer.installed():
        fd = layer.proxy.open(tmp_path / "x", os.O_RDWR | os.O_CREAT, 0o644)
    assert layer.leaked_fds == 1
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_store_prepares_files_inline_and_a_full_disk_refuses_them(fs: FaultFS) -> None:
    """Installed, the store's preallocator has no thread: the next file is made at once,
    through the layer. With no room left `statvfs` says so: the spare after that cannot be
    made, and the batch that needs it is refused before anything is written."""
    config = StoreConfig(data_dir=fs.root, journal_file_bytes=16 * KiB)
    store = JournalStore(config)
    sink: list[WriteHandle] = []
    store.open(sink.extend)
    journal = fs.root / "journal"

    def add(seq: int, nbytes: int) -> WriteHandle:
        handle = store.add(StoredMessage("/queue/q", seq, f"m{seq}", 1, {}, b"x" * nbytes), None)
        store.checkpoint()  # served after the batch that holds the add
        return handle

    try:
        assert not [t for t in threading.enumerate() if t.name == "sluice-prealloc"]
        assert (journal / "db-2.log.spare").exists()
        fs.capacity_bytes = fs.used_bytes() + 4 * KiB
        assert files.free_bytes(fs.root) == 4 * KiB
        assert add(1, 12 * KiB).state is WriteState.WRITTEN
        assert add(2, 8 * KiB).state is WriteState.WRITTEN  # into the spare made at open
        assert files.list_files(journal) == [1, 2]
        assert not (journal / "db-3.log.spare").exists()  # no room for the next one
        assert store.stats().no_space
        used = fs.used_bytes()
        refused = add(3, 12 * KiB)
        assert refused.state is WriteState.FAILED
        assert isinstance(refused.error, DiskFullError)
        assert store.stats().write_errors == 0  # refused, not failed
        assert fs.used_bytes() == used
        fs.capacity_bytes = None
        assert add(3, 12 * KiB).state is WriteState.WRITTEN
        assert files.list_files(journal) == [1, 2, 3]
    finally:
        store.close()
