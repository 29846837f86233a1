"""Journal data files: naming, zero-filled preallocation, appending batches, rollover, reading.

Files are preallocated by writing zeros, not with `posix_fallocate` alone: on ext4 an fdatasync
after overwriting written zeros only flushes data, while the first write into a fallocated
(unwritten) extent also commits an extent conversion to the filesystem journal. Measured on the
target machine: about 8,000-9,700 fdatasync/s after zero-filling against 5,000/s with fallocate
(and 5,000/s on a growing file). (`posix_fallocate` does go first, to claim the space at once;
the zeros then leave no unwritten extent behind, as `filefrag -v` shows.) Zero-filling 32 MiB
costs about 0.1 s of disk, so a helper thread prepares the next file ahead of time
(`Preallocator`) and rollover is a rename.

Crash safety of rollover: the full file is fsynced before the next one exists, and a new file is
complete (zeros, header record, fsync) before its name appears, then the directory is fsynced before
the first record is written to it. A crash in between leaves at most an incomplete newest file that
recovery re-initialises.

A full disk: a file is only started when the filesystem reports room for all of it, and its space
is claimed with `posix_fallocate` before the zeros go in, so running out shows at once as
`DiskFullError` and never as a half-written file (a partial one is deleted). The head file stays
the head until its successor is complete and open, so a rollover that fails before its successor
has a name changes nothing; once the name is there, the head file is sealed and a failure fails
the store (the newest file is the only one recovery may cut a torn tail off). A data
file that could not be prepared ahead is tried again after `PREPARE_RETRY_S`, never in a loop.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sluice.errors import CorruptionError, DiskFullError, StoreError, StoreIOError
from sluice.store.api import SYNC_BUCKETS_S
from sluice.store.journal import format as fmt

log = logging.getLogger(__name__)

_NAME = re.compile(r"^db-([1-9][0-9]*)\.log$")
_SPARE_SUFFIX = ".spare"
_ZERO_CHUNK = b"\0" * (1024 * 1024)
try:
    _IOV_MAX = int(os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError, AttributeError):
    _IOV_MAX = 1024
# After a data file could not be prepared (no space), wait this long before trying again.
PREPARE_RETRY_S = 1.0
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
# posix_fallocate is not supported everywhere; zero-filling alone still claims the space.
_NO_FALLOCATE = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})
# A head file whose syncs carried this many bytes on average has its successor's successor made
# with fallocate alone, not zero filled (`HeadFile.rollover`).
LARGE_SYNC_BYTES = 256 * 1024


def file_path(journal_dir: Path, file_no: int) -> Path:
    """Where data file `file_no` lives."""
    return journal_dir / f"db-{file_no}.log"


def list_files(journal_dir: Path) -> list[int]:
    """Numbers of the data files present, ascending."""
    if not journal_dir.is_dir():
        return []
    numbers = []
    for entry in os.scandir(journal_dir):
        match = _NAME.match(entry.name)
        if match:
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def remove_spares(journal_dir: Path) -> None:
    """Delete preallocated files that never became part of the journal."""
    if journal_dir.is_dir():
        for entry in os.scandir(journal_dir):
            if entry.name.endswith(_SPARE_SUFFIX):
                os.unlink(entry.path)


def fsync_dir(path: Path) -> None:
    """Make renames, creations and deletions in a directory durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (or its
    nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def is_no_space(exc: OSError) -> bool:
    """Whether an OS error means the disk (or the quota) is full."""
    return exc.errno in _NO_SPACE


def io_error(operation: str, exc: OSError, path: Path, offset: int | None = None) -> StoreIOError:
    """The store's error for a failed OS call: `DiskFullError` when it was a lack of space."""
    cls = DiskFullError if is_no_space(exc) else StoreIOError
    return cls(operation, exc.strerror or str(exc), str(path), offset)


def write_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> int:
    """Write buffers at `offset` with as few `pwritev` calls as IOV_MAX allows; returns the end.

    A call that writes nothing raises (ENOSPC) rather than being tried again."""
    pending = list(buffers)
    while pending:
        chunk = pending[:_IOV_MAX]
        written = os.pwritev(fd, chunk, offset)
        if written == 0 and any(len(buf) for buf in chunk):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        offset += written
        # A short write: drop what went out and go on with the rest.
        consumed = 0
        for i, buf in enumerate(chunk):
            size = len(buf)
            if written >= size:
                written -= size
                consumed = i + 1
                continue
            if written:
                pending[i] = memoryview(buf)[written:]
            break
        del pending[:consumed]
    return offset


class Cancelled(Exception):
    """Preparing a file was given up because the store is closing."""


def _zero_fill(fd: int, file_bytes: int, cancelled: Callable[[], bool] | None) -> None:
    done = 0
    while done < file_bytes:
        if cancelled is not None and cancelled():
            raise Cancelled
        n = min(len(_ZERO_CHUNK), file_bytes - done)
        done = write_all(fd, (_ZERO_CHUNK[:n],), done)


def create_file(
    path: Path,
    file_no: int,
    store_id: bytes,
    file_bytes: int,
    *,
    sync: bool = True,
    zero_fill: bool = True,
    cancelled: Callable[[], bool] | None = None,
) -> bool:
    """Create a complete data file at `path` (its space taken, a header record), durable when
    `sync`. Returns whether its bytes were written as zeros.

    The space is taken with fallocate and, when `zero_fill` or where the filesystem cannot
    fallocate, by writing zeros over the whole file. Zeros cost a second write of every byte, but
    make each later small append's fdatasync a flush of data alone (an append into fallocated
    space also converts its extent, a metadata change that sync has to commit). Both read back as
    zeros, so recovery sees the same file either way.

    Raises OSError (ENOSPC before anything is written when the filesystem reports too little
    room) or `Cancelled`; either way no partial file is left behind."""
    if free_bytes(path.parent) < file_bytes:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.posix_fallocate(fd, 0, file_bytes)
        except OSError as exc:
            if exc.errno not in _NO_FALLOCATE:
                raise
            zero_fill = True
        if zero_fill:
            _zero_fill(fd, file_bytes, cancelled)
        header = fmt.encode_file_header(file_no, store_id, int(time.time() * 1000))
        write_all(fd, (header,), 0)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    return zero_fill


class Preallocator:
    """Prepares data files before the writer needs them.

    With `ahead` a helper thread makes the next file as soon as the writer names it (`prepare`),
    so rollover is a rename. `ensure` makes the file on the caller's thread when the helper has
    not (or with `ahead=False`, always: the temp store does not hold a spare file on the disk).
    Files are synced once complete unless not `durable` (the temp store).

    A file that cannot be made is deleted, and its error kept in `error` until a file is made
    again: the store reports it (`StoreStats.no_space`). The helper tries again after
    `PREPARE_RETRY_S`, not before; every wait here ends when the store closes."""

    def __init__(
        self,
        journal_dir: Path,
        store_id: bytes,
        file_bytes: int,
        *,
        ahead: bool = True,
        durable: bool = True,
    ) -> None:
        self._dir = journal_dir
        self._durable = durable
        self._store_id = store_id
        self._file_bytes = file_bytes
        self._cond = threading.Condition()
        self._wanted = 0
        self._zero_fill = True
        # Files made, by how: written as zeros, or taken with fallocate alone.
        self.zero_filled = 0
        self.fallocated = 0
        self._ready = 0
        self._busy = 0
        self._stopping = False
        self._retry_at = 0.0
        self.error: StoreIOError | None = None
        self._thread: threading.Thread | None = None
        if ahead:
            self._thread = threading.Thread(target=self._run, name="sluice-prealloc", daemon=True)
            self._thread.start()

    def _spare(self, file_no: int) -> Path:
        return self._dir / f"db-{file_no}.log{_SPARE_SUFFIX}"

    @property
    def file_bytes(self) -> int:
        """Size of each data file."""
        return self._file_bytes

    def ready_for(self, file_no: int) -> bool:
        """Whether `file_no` is prepared (its space already taken on the disk)."""
        return self._ready == file_no

    def prepare(self, file_no: int, *, zero_fill: bool = True) -> None:
        """Ask for `file_no` to be made ready ahead (a no-op without the helper); `zero_fill`
        as `create_file` takes it, for this file and those made after it until told again."""
        self._zero_fill = zero_fill
        if self._thread is None:
            return
        with self._cond:
            if self._wanted != file_no:
                self._wanted = file_no
                self._retry_at = 0.0
            self._cond.notify_all()

    def ensure(self, file_no: int) -> None:
        """Make sure `file_no` is prepared, making it now if it is not. Raises `DiskFullError`
        (nothing was written) or `StoreIOError`."""
        with self._cond:
            while self._busy and not self._stopping:
                self._cond.wait(0.1)
            if self._ready == file_no:
                return
            if self._stopping:
                raise StoreError("the journal store is closing", str(self._spare(file_no)))
            self._busy = file_no
        try:
            self._make(file_no)
        finally:
            with self._cond:
                self._busy = 0
                self._cond.notify_all()

    def take(self, file_no: int, target: Path) -> bool:
        """Rename the prepared spare to `target` if it is `file_no`'s (waiting if it is being
        written). Returns False when there is none."""
        with self._cond:
            while self._busy == file_no and not self._stopping:
                self._cond.wait(0.1)
            if self._ready != file_no:
                return False
            self._ready = 0
        spare = self._spare(file_no)
        # Never over an existing data file: a master that lost its lease while it was about to
        # start one (high availability) must not replace the new master's file of that number.
        try:
            os.link(spare, target)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise StoreError("a data file of that number exists already", str(target)) from None
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # A filesystem without hard links: the check and the rename are two steps.
            if os.path.lexists(target):
                raise StoreError("a data file of that number exists already", str(target)) from None
            os.rename(spare, target)
            return True
        os.unlink(spare)
        return True

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the helper (a file being written is given up) and delete an unused spare."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("the journal preallocator did not stop within %.0f s", timeout_s)
                return
        remove_spares(self._dir)

    def _make(self, file_no: int) -> None:
        """Write the spare of `file_no` (the caller has set `_busy` to it)."""
        with self._cond:
            stale, self._ready = self._ready, 0
        if stale and stale != file_no:
            # Prepared for a file number that has passed: it will never be used.
            with contextlib.suppress(OSError):
                os.unlink(self._spare(stale))
        path = self._spare(file_no)
        try:
            zeros = create_file(
                path,
                file_no,
                self._store_id,
                self._file_bytes,
                sync=self._durable,
                zero_fill=self._zero_fill,
                cancelled=lambda: self._stopping,
            )
        except Cancelled:
            raise StoreError("the journal store is closing", str(path)) from None
        except OSError as exc:
            error = io_error("preparing a data file", exc, path)
            with self._cond:
                first = self.error is None
                self.error = error
                self._retry_at = time.monotonic() + PREPARE_RETRY_S
            if first:
                log.warning("journal: cannot prepare %s: %s (trying again)", path.name, error)
            raise error from exc
        with self._cond:
            self._ready = file_no
            if zeros:
                self.zero_filled += 1
            else:
                self.fallocated += 1
            if self.error is not None:
                log.info("journal: %s prepared; space is back", path.name)
            self.error = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    wanted = self._wanted
                    if wanted and wanted != self._ready and not self._busy:
                        delay = self._retry_at - time.monotonic()
                        if delay <= 0:
                            break
                        self._cond.wait(delay)
                        continue
                    self._cond.wait()
                self._busy = wanted
            try:
                self._make(wanted)
            except StoreError:
                pass  # kept in `error` (and logged once); the writer reports what it gets
            finally:
                with self._cond:
                    self._busy = 0
                    self._cond.notify_all()


_SYNC_BOUNDS_NS = tuple(int(bound * 1e9) for bound in SYNC_BUCKETS_S)


class HeadFile:
    """The newest data file, where the writer appends. Used by the writer thread only."""

    def __init__(
        self,
        journal_dir: Path,
        store_id: bytes,
        file_bytes: int,
        file_no: int,
        offset: int,
        *,
        sync_on_rollover: bool,
        preallocator: Preallocator | None,
    ) -> None:
        self.journal_dir = journal_dir
        self.store_id = store_id
        self.file_bytes = file_bytes
        self.file_no = file_no
        self.offset = offset
        self.sync_on_rollover = sync_on_rollover
        self._prealloc = preallocator
        self.fd = os.open(file_path(journal_dir, file_no), os.O_RDWR)
        self.unsynced = False
        self.syncs = 0
        # Since the head file started: bytes appended and syncs, for how to make the next files.
        self._file_bytes_written = 0
        self._file_syncs = 0
        # Every sync's duration, always counted (two clock readings per sync): per bucket of
        # SYNC_BUCKETS_S and beyond, and in all.
        self.sync_counts = [0] * (len(SYNC_BUCKETS_S) + 1)
        self.sync_ns = 0
        if preallocator is not None:
            preallocator.prepare(file_no + 1)

    def attach(self, preallocator: Preallocator, *, sync_on_rollover: bool) -> None:
        """Use a preallocator from now on (recovery writes without one)."""
        self._prealloc = preallocator
        self.sync_on_rollover = sync_on_rollover
        preallocator.prepare(self.file_no + 1)

    def fits(self, record_bytes: int) -> bool:
        """Whether a record fits, or goes anyway because the file holds only its header."""
        return (
            self.offset + record_bytes <= self.file_bytes
            or self.offset <= fmt.FILE_HEADER_RECORD_BYTES
        )

    @property
    def free_in_file(self) -> int:
        """Bytes of the head file not written yet (its space is already taken on the disk)."""
        return max(0, self.file_bytes - self.offset)

    def next_ready(self) -> bool:
        """Whether the next data file is prepared already."""
        return self._prealloc is not None and self._prealloc.ready_for(self.file_no + 1)

    def prepare_next(self) -> None:
        """Make sure the next rollover will not need new space: prepare the next file now if it
        is not ready. Raises `DiskFullError` with nothing written."""
        if self._prealloc is not None:
            self._prealloc.ensure(self.file_no + 1)

    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Append at the current offset (the caller has checked `fits` and advanced nothing).

        Any failure, ENOSPC included, raises `StoreIOError`: bytes may be half written."""
        try:
            end = write_all(self.fd, buffers, self.offset)
        except OSError as exc:
            raise StoreIOError(
                "journal write", exc.strerror or str(exc), str(self.path), self.offset
            ) from exc
        self._file_bytes_written += end - self.offset
        self.offset = end
        self.unsynced = True

    @property
    def path(self) -> Path:
        """Path of the head file."""
        return file_path(self.journal_dir, self.file_no)

    def sync(self) -> None:
        """fdatasync the head file (the size only changes for oversized records, which
        fdatasync covers too)."""
        if not self.unsynced:
            return
        started = time.perf_counter_ns()
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            # Never tried again: after a failed sync the kernel may have dropped the dirty pages
            # and a second sync can succeed without them.
            raise StoreIOError("journal sync", exc.strerror or str(exc), str(self.path)) from exc
        self.unsynced = False
        self.syncs += 1
        self._file_syncs += 1
        elapsed = time.perf_counter_ns() - started
        self.sync_counts[bisect.bisect_left(_SYNC_BOUNDS_NS, elapsed)] += 1
        self.sync_ns += elapsed

    def rollover(self) -> int:
        """Seal the head file and start the next one; returns the new file number.

        The head changes only once the next file is complete and open. A failure before the
        next file has its name (`DiskFullError` for a lack of space) leaves the head as it was;
        one after (syncing the directory, opening the file) is a `StoreIOError` whatever its
        cause, as the head must take no more records: recovery takes the newest file for the
        only one whose tail may be torn, so a record torn in this one would stop the next
        start."""
        if self.sync_on_rollover:
            self.sync()
        next_no = self.file_no + 1
        target = file_path(self.journal_dir, next_no)
        prealloc = self._prealloc
        named = False
        try:
            if prealloc is not None:
                prealloc.ensure(next_no)
                if not prealloc.take(next_no, target):
                    raise StoreError("the prepared data file went missing", str(target))
            else:
                create_file(
                    target, next_no, self.store_id, self.file_bytes, sync=self.sync_on_rollover
                )
            named = True
            if self.sync_on_rollover:
                fsync_dir(self.journal_dir)
            fd = os.open(target, os.O_RDWR)
        except OSError as exc:
            if named or os.path.lexists(target):
                raise StoreIOError(
                    "starting a data file", exc.strerror or str(exc), str(target)
                ) from exc
            raise io_error("starting a data file", exc, target) from exc
        os.close(self.fd)
        self.fd = fd
        self.file_no = next_no
        self.offset = fmt.FILE_HEADER_RECORD_BYTES
        self.unsynced = False
        # Syncs of large batches (large messages) gain nothing from zeros: make the files after
        # this one with fallocate alone, not writing every byte of the journal twice.
        large = self._file_bytes_written >= LARGE_SYNC_BYTES * max(1, self._file_syncs)
        self._file_bytes_written = self._file_syncs = 0
        if prealloc is not None:
            prealloc.prepare(next_no + 1, zero_fill=not large)
        return next_no

    def close(self, *, sync: bool = True) -> None:
        """Release the descriptor, after a final sync when data is pending and `sync` (False
        after a failure: a sync is never tried again)."""
        if self.fd >= 0:
            try:
                if sync and self.unsynced and self.sync_on_rollover:
                    os.fdatasync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = -1


# Paths of files read kept at most (a cache: files come and go over a store's life).
_MAX_PATHS = 256
# The largest whole record a location may name.
MAX_RECORD_BYTES = fmt.HEADER_BYTES + fmt.MAX_PAYLOAD_BYTES


class FileReader:
    """Reads records back by location; one descriptor per file, opened on first use.

    A location comes from the index, so its length is bounded (a whole record, at most
    `MAX_RECORD_BYTES`, within the file) before anything is allocated; a location that fails
    raises `CorruptionError` naming the file and offset.

    Not thread-safe: each thread that reads owns a reader, or holds a lock around it."""

    def __init__(self, journal_dir: Path) -> None:
        self.journal_dir = journal_dir
        self._fds: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._paths: dict[int, str] = {}

    def path(self, file_no: int) -> str:
        """The path of file `file_no`, as errors name it (made once per file)."""
        path = self._paths.get(file_no)
        if path is None:
            if len(self._paths) >= _MAX_PATHS:
                self._paths.clear()
            path = self._paths[file_no] = str(file_path(self.journal_dir, file_no))
        return path

    def read(
        self, file_no: int, offset: int, length: int, max_length: int = MAX_RECORD_BYTES
    ) -> bytes:
        """The `length` bytes at `offset` of file `file_no`: a whole record, or with a larger
        `max_length` several neighbouring ones (a page)."""
        fd = self._fds.get(file_no)
        if not fmt.HEADER_BYTES <= length <= max_length or offset < 0:
            raise CorruptionError(
                f"record location of {length} bytes is impossible", self.path(file_no), offset
            )
        try:
            if fd is None:
                fd = self._fds[file_no] = os.open(self.path(file_no), os.O_RDONLY)
            size = self._sizes.get(file_no, -1)
            if offset + length > size:
                # Files only grow while open (a record larger than the file size): look again.
                size = self._sizes[file_no] = os.fstat(fd).st_size
            if offset + length > size:
                raise CorruptionError(
                    f"record of {length} bytes runs past the end of the file ({size} bytes)",
                    self.path(file_no),
                    offset,
                )
            data = os.pread(fd, length, offset)
        except FileNotFoundError as exc:
            raise CorruptionError("data file is missing", self.path(file_no), offset) from exc
        except OSError as exc:
            raise StoreError(
                f"journal read failed: {exc.strerror}", self.path(file_no), offset
            ) from exc
        if len(data) != length:
            raise CorruptionError("record is truncated", self.path(file_no), offset)
        return data

    def forget(self, file_no: int) -> None:
        """Close the descriptor of a file that is about to go."""
        fd = self._fds.pop(file_no, None)
        self._sizes.pop(file_no, None)
        self._paths.pop(file_no, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every descriptor (all of them, whatever fails; the first error is raised)."""
        fds = list(self._fds.values())
        self._fds.clear()
        self._sizes.clear()
        failure: OSError | None = None
        for fd in fds:
            try:
                os.close(fd)
            except OSError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
