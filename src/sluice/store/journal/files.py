"""Journal data files: naming, zero-filled preallocation, appending batches, rollover, reading.

Files are preallocated by writing zeros rather than with `posix_fallocate`: on ext4 an fdatasync
after overwriting written zeros only flushes data, while the first write into a fallocated
(unwritten) extent also commits an extent conversion to the filesystem journal. Measured on the
target machine: about 8,000-9,700 fdatasync/s after zero-filling against 5,000/s with fallocate
(and 5,000/s on a growing file). Zero-filling 32 MiB costs about 0.1 s of disk, so a helper thread
prepares the next file ahead of time (`Preallocator`) and rollover is a rename.

Crash safety of rollover: the full file is fsynced before the next one exists, and a new file is
complete (zeros, header record, fsync) before its name appears, then the directory is fsynced before
the first record is written to it. A crash in between leaves at most an incomplete newest file that
recovery re-initialises.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sluice.errors import CorruptionError, StoreError
from sluice.store.journal import format as fmt

_NAME = re.compile(r"^db-([1-9][0-9]*)\.log$")
_SPARE_SUFFIX = ".spare"
_ZERO_CHUNK = b"\0" * (1024 * 1024)
try:
    _IOV_MAX = int(os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError, AttributeError):
    _IOV_MAX = 1024


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


def write_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> int:
    """Write buffers at `offset` with as few `pwritev` calls as IOV_MAX allows; returns the end."""
    pending = list(buffers)
    while pending:
        chunk = pending[:_IOV_MAX]
        written = os.pwritev(fd, chunk, offset)
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


def _zero_fill(fd: int, file_bytes: int) -> None:
    done = 0
    while done < file_bytes:
        n = min(len(_ZERO_CHUNK), file_bytes - done)
        done = write_all(fd, (_ZERO_CHUNK[:n],), done)


def create_file(
    path: Path, file_no: int, store_id: bytes, file_bytes: int, *, sync: bool = True
) -> None:
    """Create a complete data file at `path` (zeros, header record), durable when `sync`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _zero_fill(fd, file_bytes)
        header = fmt.encode_file_header(file_no, store_id, int(time.time() * 1000))
        write_all(fd, (header,), 0)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


class Preallocator:
    """Prepares the next data file on its own thread so rollover does not wait for the disk."""

    def __init__(self, journal_dir: Path, store_id: bytes, file_bytes: int) -> None:
        self._dir = journal_dir
        self._store_id = store_id
        self._file_bytes = file_bytes
        self._cond = threading.Condition()
        self._wanted = 0
        self._ready = 0
        self._busy = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sluice-prealloc", daemon=True)
        self._thread.start()

    def _spare(self, file_no: int) -> Path:
        return self._dir / f"db-{file_no}.log{_SPARE_SUFFIX}"

    def prepare(self, file_no: int) -> None:
        """Ask for `file_no` to be made ready."""
        with self._cond:
            self._wanted = file_no
            self._cond.notify_all()

    def take(self, file_no: int, target: Path) -> bool:
        """Rename the prepared spare to `target` if it is `file_no`'s (waiting if it is being
        written). Returns False when there is none; the caller creates the file itself."""
        with self._cond:
            while self._busy == file_no:
                self._cond.wait()
            if self._ready != file_no:
                return False
            self._ready = 0
        os.rename(self._spare(file_no), target)
        return True

    def stop(self) -> None:
        """Stop the thread and delete an unused spare."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        remove_spares(self._dir)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and self._wanted in (0, self._ready):
                    self._cond.wait()
                if self._stopping:
                    return
                file_no = self._busy = self._wanted
            ok = False
            try:
                create_file(self._spare(file_no), file_no, self._store_id, self._file_bytes)
                ok = True
            except OSError:
                # The writer then creates the file itself and reports any error it gets.
                pass
            with self._cond:
                self._busy = 0
                if ok:
                    self._ready = file_no
                self._cond.notify_all()


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

    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Append at the current offset (the caller has checked `fits` and advanced nothing)."""
        try:
            self.offset = write_all(self.fd, buffers, self.offset)
        except OSError as exc:
            raise StoreError(
                f"journal write failed: {exc.strerror}", str(self.path), self.offset
            ) from exc
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
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise StoreError(f"journal sync failed: {exc.strerror}", str(self.path)) from exc
        self.unsynced = False
        self.syncs += 1

    def rollover(self) -> int:
        """Seal the head file and start the next one; returns the new file number."""
        if self.sync_on_rollover:
            self.sync()
        os.close(self.fd)
        next_no = self.file_no + 1
        target = file_path(self.journal_dir, next_no)
        try:
            taken = self._prealloc is not None and self._prealloc.take(next_no, target)
            if not taken:
                create_file(
                    target, next_no, self.store_id, self.file_bytes, sync=self.sync_on_rollover
                )
            if self.sync_on_rollover:
                fsync_dir(self.journal_dir)
            self.fd = os.open(target, os.O_RDWR)
        except OSError as exc:
            raise StoreError(f"cannot start data file: {exc.strerror}", str(target)) from exc
        self.file_no = next_no
        self.offset = fmt.FILE_HEADER_RECORD_BYTES
        self.unsynced = False
        if self._prealloc is not None:
            self._prealloc.prepare(next_no + 1)
        return next_no

    def close(self) -> None:
        """Release the descriptor (after a final sync when data is pending)."""
        if self.fd >= 0:
            try:
                if self.unsynced and self.sync_on_rollover:
                    os.fdatasync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = -1


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

    def read(self, file_no: int, offset: int, length: int) -> bytes:
        """The `length` bytes at `offset` of file `file_no` (a whole record)."""
        fd = self._fds.get(file_no)
        path = file_path(self.journal_dir, file_no)
        if not fmt.HEADER_BYTES <= length <= MAX_RECORD_BYTES or offset < 0:
            raise CorruptionError(
                f"record location of {length} bytes is impossible", str(path), offset
            )
        try:
            if fd is None:
                fd = self._fds[file_no] = os.open(path, os.O_RDONLY)
            size = self._sizes.get(file_no, -1)
            if offset + length > size:
                # Files only grow while open (a record larger than the file size): look again.
                size = self._sizes[file_no] = os.fstat(fd).st_size
            if offset + length > size:
                raise CorruptionError(
                    f"record of {length} bytes runs past the end of the file ({size} bytes)",
                    str(path),
                    offset,
                )
            data = os.pread(fd, length, offset)
        except FileNotFoundError as exc:
            raise CorruptionError("data file is missing", str(path), offset) from exc
        except OSError as exc:
            raise StoreError(f"journal read failed: {exc.strerror}", str(path), offset) from exc
        if len(data) != length:
            raise CorruptionError("record is truncated", str(path), offset)
        return data

    def forget(self, file_no: int) -> None:
        """Close the descriptor of a file that is about to go."""
        fd = self._fds.pop(file_no, None)
        self._sizes.pop(file_no, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every descriptor."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._sizes.clear()
