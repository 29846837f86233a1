"""A fault-injecting file layer for the journal store: a stand-in for the `os` module.

The journal modules do their file I/O through their module global `os`. `FaultFS.installed()`
puts a proxy in that global in every module of `sluice.store.journal` but the index's (and routes
the few `Path.unlink` calls of collection and of recovery through it); the proxy delegates to the
real module and, as planned, injects faults. LMDB's own I/O is not under this layer.

Calls come in two kinds:

- gated calls change the disk: `pwritev`, `pwrite`, `write`, `posix_fallocate`, `fsync`,
  `fdatasync`, `rename`, `replace`, `unlink`, `truncate`, `ftruncate` and `open` for writing.
  They are counted, and a crash or a fault is placed by that count ("the 7th gated call from
  now");
- reads (`pread`) can be made to fail with EIO; every other call passes straight through.

Faults (`Fault`, one-shot): ENOSPC or EIO from a call; a short write (part of the bytes written and
their count returned, which is legal and must be handled); a write that lands part of its bytes
before the disk fills (a short write, then ENOSPC from the next write); a failed sync.

Crash (`CrashPlan`): at the chosen gated call the layer copies the data directory as it is at that
instant to an image (the disk a killed process leaves behind; with `torn`, part of that call's
bytes land first), then every gated call fails with EIO, so the store writes nothing more. The
harness then closes the dead store, puts the image in place of the directory and opens it again.
With `power=True` the image also loses what a power cut loses: every byte written to a journal
file since its last successful sync, and the bytes a failed sync covered (Linux marks those pages
clean after the error, so no later sync writes them). Directory entries are taken as durable.
Unsynced bytes are tracked for the current run of the store only (reset by `forget_unsynced`).

Disk: `capacity_bytes` bounds the files under the data directory other than the index; a write
that would grow them past it writes what fits and returns that count, and the next one fails with
ENOSPC; `posix_fallocate` beyond it fails with ENOSPC; `statvfs` reports the room that is left
(the index is not counted: LMDB's writes are not under this layer).

Determinism: the store's preallocator thread would make the order of calls depend on timing, so
`installed()` swaps it for `InlinePreallocator`, the same class without the thread: it prepares
the next file at once on the thread that asks. With a step's writes submitted while the writer is
held, the sequence of gated calls of a life is then the same at every run.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import shutil
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PosixPath
from typing import Any

import sluice.store.journal.tools  # noqa: F401  (imports every journal module the layer patches)
from sluice.errors import StoreError
from sluice.store.journal import files as journal_files

_WRITES = frozenset({"pwritev", "pwrite", "write", "posix_fallocate"})
_SYNCS = frozenset({"fsync", "fdatasync"})
_META = frozenset({"open", "rename", "replace", "unlink", "truncate", "ftruncate"})
_READS = frozenset({"pread"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC

Buffer = bytes | bytearray | memoryview
# LMDB's domain: its one `os` call syncs the clean marker it writes with the builtin `open`.
_UNPATCHED = frozenset({"sluice.store.journal.index"})


class Target(enum.Enum):
    """Which calls a fault aims at."""

    WRITE = "write"
    SYNC = "sync"
    META = "meta"
    READ = "read"

    @property
    def calls(self) -> frozenset[str]:
        """The `os` functions this target covers."""
        return {
            Target.WRITE: _WRITES,
            Target.SYNC: _SYNCS,
            Target.META: _META,
            Target.READ: _READS,
        }[self]


class FaultKind(enum.Enum):
    """What an injected fault does."""

    ENOSPC = "enospc"  # the call fails with ENOSPC, nothing written
    EIO = "eio"  # the call fails with EIO, nothing written
    SHORT = "short"  # a write writes part of its bytes and returns that count
    FILLS = "fills"  # a write writes part of its bytes, the next write fails with ENOSPC


@dataclass(frozen=True)
class Fault:
    """One fault: the `after`-th call of `target` from now (1 = the next one) gets `kind`;
    `fraction` is the share of the bytes a partial write lands."""

    kind: FaultKind
    target: Target
    after: int = 1
    fraction: float = 0.5


@dataclass(frozen=True)
class CrashPlan:
    """A crash at the `after`-th gated call from now. `torn` (0-1, or None) is the share of that
    call's bytes that land when it is a write; `power` loses unsynced bytes as well."""

    after: int
    torn: float | None = None
    power: bool = False


class SimulatedCrash(OSError):
    """What every gated call raises once the simulated process is dead."""

    def __init__(self) -> None:
        super().__init__(errno.EIO, "simulated crash: the process is gone")


@dataclass
class _Undo:
    """What a write replaced: the bytes that were at `offset` and the file size before it."""

    offset: int
    old: bytes
    old_size: int


@dataclass
class FaultStats:
    """Counts over the life of a `FaultFS`."""

    gated_calls: int = 0
    crashes: int = 0
    injected: Counter[str] = field(default_factory=Counter)


class FaultFS:
    """The fault plan and the bookkeeping behind the `os` proxy, for one data directory."""

    def __init__(self, root: Path, image: Path) -> None:
        self.root = root
        self.image = image
        self.capacity_bytes: int | None = None
        self.stats = FaultStats()
        self._crashed = False
        # Whether the last crash was a power cut (its image lost the unsynced bytes).
        self.power_lost = False
        self.dead = False
        # What the journal modules see as `os` while the layer is installed.
        self.proxy = OsProxy(self)
        # Faults that fired since `take_fired()`: (kind, call, path).
        self.fired: list[tuple[FaultKind, str, str]] = []
        # Misuses of descriptors the layer refused (a close of one the store does not hold).
        self.misuses: list[str] = []
        # Descriptors the store left open when the layer was uninstalled.
        self.leaked_fds = 0
        self._lock = threading.RLock()
        self._fds: dict[int, str] = {}
        # Numbers the store closed through the layer and has not opened again.
        self._closed: set[int] = set()
        self._volatile: dict[str, list[_Undo]] = {}
        self._poisoned: dict[str, list[_Undo]] = {}
        self._fault: Fault | None = None
        self._fault_left = 0
        self._crash: CrashPlan | None = None
        self._crash_left = 0
        self._enospc_next = False

    # -- the plan --------------------------------------------------------------------------------

    def arm_fault(self, fault: Fault) -> None:
        """Inject `fault` at its call (replacing any armed fault)."""
        with self._lock:
            self._fault = fault
            self._fault_left = max(1, fault.after)

    def disarm_fault(self) -> None:
        """Forget an armed fault that has not fired."""
        with self._lock:
            self._fault = None
            self._enospc_next = False

    @property
    def fault_armed(self) -> bool:
        """Whether a fault waits for its call."""
        return self._fault is not None

    def arm_crash(self, plan: CrashPlan) -> None:
        """Crash at the planned gated call."""
        with self._lock:
            self._crash = plan
            self._crash_left = max(1, plan.after)

    def crashed(self) -> bool:
        """Whether the simulated process died (until `revive`)."""
        return self._crashed

    @property
    def crash_armed(self) -> bool:
        """Whether a crash waits for its call."""
        return self._crash is not None

    def crash_now(self) -> None:
        """Crash at once (between calls): take the image, and fail every gated call from now."""
        with self._lock:
            plan = self._crash or CrashPlan(1)
            self._crash = None
            self._die(plan.power)

    def revive(self) -> None:
        """After a crash: let calls through again (the dead store's remaining effects land in the
        directory the image replaces), and forget what was unsynced."""
        with self._lock:
            self.dead = False
            self._crashed = False
            self._crash = None
            self._fault = None
            self._enospc_next = False
            self.forget_unsynced()

    def forget_unsynced(self) -> None:
        """A new run of the store starts: bytes written before it count as durable."""
        with self._lock:
            self._volatile.clear()
            self._poisoned.clear()

    def take_fired(self) -> list[tuple[FaultKind, str, str]]:
        """The faults that fired since the last call."""
        with self._lock:
            fired, self.fired = self.fired, []
            return fired

    def used_bytes(self) -> int:
        """Bytes of the files under the data directory, the index excluded."""
        total = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            if dirpath == str(self.root) and "index" in dirnames:
                dirnames.remove("index")
            for name in filenames:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(dirpath, name)).st_size
        return total

    # -- gating ----------------------------------------------------------------------------------

    def _gate(self, call: str) -> tuple[Fault | None, CrashPlan | None]:
        """Count a gated call; returns the fault to inject and the crash to die of at this call.
        Raises once the process is dead."""
        if self.dead:
            raise SimulatedCrash
        self.stats.gated_calls += 1
        crash = None
        if self._crash is not None:
            self._crash_left -= 1
            if self._crash_left <= 0:
                crash, self._crash = self._crash, None
        return self._match(call), crash

    def _match(self, call: str) -> Fault | None:
        fault = self._fault
        if fault is None or call not in fault.target.calls:
            return None
        self._fault_left -= 1
        if self._fault_left > 0:
            return None
        self._fault = None
        return fault

    def _note(self, fault: Fault, call: str, path: str) -> None:
        self.stats.injected[fault.kind.value] += 1
        self.fired.append((fault.kind, call, path))

    def _die(self, power: bool) -> None:
        """Copy the directory as the crash leaves it, then fail every gated call."""
        if self.image.exists():
            shutil.rmtree(self.image)
        if self.root.exists():
            shutil.copytree(self.root, self.image, ignore=shutil.ignore_patterns("lock.mdb"))
        else:
            self.image.mkdir(parents=True)
        if power:
            self._lose_unsynced()
        self.power_lost = power
        self.stats.crashes += 1
        self._crashed = True
        self.dead = True

    def _lose_unsynced(self) -> None:
        for table in (self._volatile, self._poisoned):
            for path, undos in table.items():
                target = self._in_image(path)
                if target is None or not target.is_file():
                    continue
                fd = os.open(target, os.O_RDWR)
                try:
                    for undo in reversed(undos):
                        if undo.old:
                            os.pwrite(fd, undo.old, undo.offset)
                        if os.fstat(fd).st_size > undo.old_size:
                            os.ftruncate(fd, undo.old_size)
                finally:
                    os.close(fd)

    def _in_image(self, path: str) -> Path | None:
        try:
            relative = Path(path).relative_to(self.root)
        except ValueError:
            return None
        return self.image / relative

    def _tracked(self, path: str) -> bool:
        return path.startswith(str(self.root / "journal"))

    # -- the calls -------------------------------------------------------------------------------

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        """`os.open`, gated when it may change the file."""
        name = os.fspath(path)
        if flags & _WRITE_FLAGS:
            with self._lock:
                fault, crash = self._gate("open")
                if crash is not None:
                    self._die(crash.power)
                    raise SimulatedCrash
                if fault is not None:
                    self._note(fault, "open", name)
                    raise _error(fault.kind, name)
        fd = os.open(name, flags, mode)
        with self._lock:
            self._fds[fd] = os.path.abspath(name)
            self._closed.discard(fd)
        return fd

    def close(self, fd: int) -> None:
        """`os.close` of a descriptor the store opened (never fails on purpose). Closing one it
        does not hold (closed already, so its number may now be another file's, LMDB's for one)
        is recorded in `misuses` and not done, so the test process stays sound."""
        with self._lock:
            if self._fds.pop(fd, None) is None:
                self.misuses.append(
                    f"{_caller()}: close of descriptor {fd}, which the store does not hold"
                )
                return
            self._closed.add(fd)
        os.close(fd)

    def _held(self, call: str, fd: int) -> str:
        """The path of a descriptor the store holds ("" for one it never opened through the
        layer). One it closed already (its number maybe another file's now, LMDB's say) is a
        misuse: recorded, and refused with EBADF, as the system refuses a number nobody holds,
        so the store never writes into another file."""
        path = self._fds.get(fd)
        if path is not None:
            return path
        if fd in self._closed:
            self.misuses.append(
                f"{_caller()}: {call} on descriptor {fd}, which the store closed already"
            )
            raise OSError(errno.EBADF, f"Bad file descriptor (closed already: {fd})")
        return ""

    def take_misuses(self) -> list[str]:
        """The misuses recorded since the last call."""
        with self._lock:
            out, self.misuses = self.misuses, []
            return out

    def close_leaked(self) -> int:
        """Close every descriptor the store opened and never closed; returns how many."""
        with self._lock:
            fds, self._fds = list(self._fds), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.leaked_fds += len(fds)
        return len(fds)

    def write_at(self, call: str, fd: int, buffers: Sequence[Buffer], offset: int | None) -> int:
        """`pwritev`, `pwrite` and `write`: faults, crash tears, disk capacity, undo tracking."""
        data = b"".join(bytes(b) for b in buffers)
        with self._lock:
            path = self._held(call, fd)
            fault, crash = self._gate(call)
            if offset is None:
                offset = os.lseek(fd, 0, os.SEEK_CUR)
            if crash is not None:
                if crash.torn is not None and len(data) > 1:
                    self._write(fd, path, data[: int(len(data) * crash.torn)], offset)
                self._die(crash.power)
                raise SimulatedCrash
            if self._enospc_next:
                self._enospc_next = False
                raise OSError(errno.ENOSPC, "No space left on device (simulated)", path)
            if fault is not None:
                if fault.kind in (FaultKind.SHORT, FaultKind.FILLS) and len(data) > 1:
                    self._note(fault, call, path)
                    keep = min(len(data) - 1, max(1, int(len(data) * fault.fraction)))
                    self._enospc_next = fault.kind is FaultKind.FILLS
                    return self._write(fd, path, data[:keep], offset)
                if fault.kind in (FaultKind.ENOSPC, FaultKind.EIO):
                    self._note(fault, call, path)
                    raise _error(fault.kind, path)
            fits = self._fits(fd, offset, len(data))
            if fits < len(data):
                if fits <= 0:
                    raise OSError(errno.ENOSPC, "No space left on device (disk full)", path)
                return self._write(fd, path, data[:fits], offset)
            return self._write(fd, path, data, offset)

    def _fits(self, fd: int, offset: int, nbytes: int) -> int:
        """How many of `nbytes` at `offset` the disk capacity allows."""
        if self.capacity_bytes is None:
            return nbytes
        size = os.fstat(fd).st_size
        grow = offset + nbytes - size
        if grow <= 0:
            return nbytes
        room = self.capacity_bytes - self.used_bytes()
        if grow <= room:
            return nbytes
        return max(0, size - offset) + max(0, room)

    def _write(self, fd: int, path: str, data: bytes, offset: int) -> int:
        if path and self._tracked(path):
            try:
                old_size = os.fstat(fd).st_size
                old = os.pread(fd, len(data), offset) if offset < old_size else b""
            except OSError:
                pass
            else:
                self._volatile.setdefault(path, []).append(_Undo(offset, old, old_size))
        return os.pwrite(fd, data, offset)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        """`posix_fallocate`: claims space, so the disk's capacity applies (all or nothing)."""
        with self._lock:
            path = self._held("posix_fallocate", fd)
            fault, crash = self._gate("posix_fallocate")
            if crash is not None:
                self._die(crash.power)
                raise SimulatedCrash
            if fault is not None and fault.kind is not FaultKind.SHORT:
                self._note(fault, "posix_fallocate", path)
                kind = FaultKind.EIO if fault.kind is FaultKind.EIO else FaultKind.ENOSPC
                raise _error(kind, path)
            size = os.fstat(fd).st_size
            if self._fits(fd, offset, length) < length:
                raise OSError(errno.ENOSPC, "No space left on device (disk full)", path)
            if path and self._tracked(path) and offset + length > size:
                self._volatile.setdefault(path, []).append(_Undo(size, b"", size))
            os.posix_fallocate(fd, offset, length)

    def statvfs(self, path: Any) -> os.statvfs_result:
        """`os.statvfs`, whose free space is what the disk's capacity leaves."""
        real = os.statvfs(path)
        with self._lock:
            if self.capacity_bytes is None:
                return real
            room = max(0, self.capacity_bytes - self.used_bytes())
        blocks = room // real.f_frsize
        fields = list(real)
        fields[3] = fields[4] = blocks  # f_bfree, f_bavail
        return os.statvfs_result(fields)

    def sync(self, call: str, fd: int) -> None:
        """`fsync` and `fdatasync`: a failed sync loses its file's unsynced bytes at power loss."""
        with self._lock:
            path = self._held(call, fd)
            fault, crash = self._gate(call)
            if crash is not None:
                self._die(crash.power)
                raise SimulatedCrash
            if fault is not None and fault.kind in (FaultKind.EIO, FaultKind.ENOSPC):
                self._note(fault, call, path)
                # Power loss then takes the file's unsynced bytes. A directory (`journal/` after
                # a rename) has none: its entries are taken as durable.
                lost = self._volatile.pop(path, [])
                if lost:
                    self._poisoned.setdefault(path, []).extend(lost)
                raise _error(fault.kind, path)
        getattr(os, call)(fd)
        with self._lock:
            self._volatile.pop(path, None)

    def meta(self, call: str, fn: Callable[[], Any], *paths: Any) -> Any:
        """`rename`, `replace`, `unlink`, `truncate`, `ftruncate`."""
        names = [os.path.abspath(os.fspath(p)) if not isinstance(p, int) else "" for p in paths]
        with self._lock:
            fault, crash = self._gate(call)
            if crash is not None:
                self._die(crash.power)
                raise SimulatedCrash
            if fault is not None and fault.kind in (FaultKind.EIO, FaultKind.ENOSPC):
                self._note(fault, call, names[0])
                raise _error(fault.kind, names[0])
        result = fn()
        with self._lock:
            if call in ("rename", "replace"):
                for table in (self._volatile, self._poisoned):
                    moved = table.pop(names[0], None)
                    if moved is not None:
                        table[names[1]] = moved
            elif call == "unlink":
                self._volatile.pop(names[0], None)
                self._poisoned.pop(names[0], None)
        return result

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        """`os.pread`, which a READ fault fails with EIO."""
        with self._lock:
            path = self._held("pread", fd)
            fault = self._match("pread")
            if fault is not None:
                self._note(fault, "pread", path)
                raise _error(FaultKind.EIO, path)
        return os.pread(fd, length, offset)

    # -- installation ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Put the proxy in every journal module that uses `os`, route collection's and
        recovery's `Path.unlink` through it, and use `InlinePreallocator`."""
        proxy = self.proxy
        saved: list[tuple[Any, str, Any]] = []

        def patch(module: Any, name: str, value: Any) -> None:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)

        for name, module in list(sys.modules.items()):
            if (
                name.startswith("sluice.store.journal.")
                and name not in _UNPATCHED
                and getattr(module, "os", None) is os
            ):
                patch(module, "os", proxy)
        gated_path = _gated_path_class(self)
        for name in ("sluice.store.journal.maintenance", "sluice.store.journal.recovery"):
            module = sys.modules[name]
            patch(module, "file_path", _wrap_file_path(gated_path))
        patch(sys.modules["sluice.store.journal.store"], "Preallocator", InlinePreallocator)
        try:
            yield
        finally:
            for module, name, value in reversed(saved):
                setattr(module, name, value)
            self.close_leaked()


def _caller() -> str:
    """The innermost store frame of the current stack, as `module.py:line in function`."""
    for frame in reversed(traceback.extract_stack()):
        if "/sluice/store/" in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "?"


class InlinePreallocator(journal_files.Preallocator):
    """The store's preallocator without its helper thread: the next data file is still prepared
    ahead (a spare is on the disk between rollovers, as in production), but at once, on the
    thread that asks (at open and after each rollover), so the calls come in a fixed order. A
    file that cannot be made is tried again when rollover needs it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ahead"] = False
        super().__init__(*args, **kwargs)

    def prepare(self, file_no: int, *, zero_fill: bool = True) -> None:
        """Make `file_no`'s spare now (its failure is kept in `error`, as the helper keeps it)."""
        super().prepare(file_no, zero_fill=zero_fill)
        with contextlib.suppress(StoreError):
            self.ensure(file_no)


def _error(kind: FaultKind, path: str) -> OSError:
    if kind is FaultKind.ENOSPC:
        return OSError(errno.ENOSPC, "No space left on device (injected)", path)
    return OSError(errno.EIO, "Input/output error (injected)", path)


class OsProxy:
    """Looks like the `os` module; the calls `FaultFS` cares about go through it."""

    def __init__(self, fs: FaultFS) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        """`os.open`."""
        return self._fs.open(path, flags, mode)

    def close(self, fd: int) -> None:
        """`os.close`."""
        self._fs.close(fd)

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int, flags: int = 0) -> int:
        """`os.pwritev` (flags are not used by the store)."""
        assert flags == 0
        return self._fs.write_at("pwritev", fd, buffers, offset)

    def pwrite(self, fd: int, data: Buffer, offset: int) -> int:
        """`os.pwrite`."""
        return self._fs.write_at("pwrite", fd, (data,), offset)

    def write(self, fd: int, data: Buffer) -> int:
        """`os.write` at the current position."""
        written = self._fs.write_at("write", fd, (data,), None)
        os.lseek(fd, written, os.SEEK_CUR)
        return written

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        """`os.posix_fallocate`."""
        self._fs.fallocate(fd, offset, length)

    def statvfs(self, path: Any) -> os.statvfs_result:
        """`os.statvfs`."""
        return self._fs.statvfs(path)

    def fsync(self, fd: int) -> None:
        """`os.fsync`."""
        self._fs.sync("fsync", fd)

    def fdatasync(self, fd: int) -> None:
        """`os.fdatasync`."""
        self._fs.sync("fdatasync", fd)

    def rename(self, src: Any, dst: Any) -> None:
        """`os.rename`."""
        self._fs.meta("rename", lambda: os.rename(src, dst), src, dst)

    def replace(self, src: Any, dst: Any) -> None:
        """`os.replace`."""
        self._fs.meta("replace", lambda: os.replace(src, dst), src, dst)

    def unlink(self, path: Any) -> None:
        """`os.unlink`."""
        self._fs.meta("unlink", lambda: os.unlink(path), path)

    def truncate(self, path: Any, length: int) -> None:
        """`os.truncate`."""
        self._fs.meta("truncate", lambda: os.truncate(path, length), path)

    def ftruncate(self, fd: int, length: int) -> None:
        """`os.ftruncate`."""
        with self._fs._lock:
            self._fs._held("ftruncate", fd)
        self._fs.meta("ftruncate", lambda: os.ftruncate(fd, length), fd)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        """`os.pread`."""
        return self._fs.pread(fd, length, offset)


def _gated_path_class(fs: FaultFS) -> type[PosixPath]:
    class GatedPath(PosixPath):
        """A path whose `unlink` is a gated call."""

        def unlink(self, missing_ok: bool = False) -> None:
            try:
                fs.meta("unlink", lambda: os.unlink(self), self)
            except FileNotFoundError:
                if not missing_ok:
                    raise

    return GatedPath


def _wrap_file_path(path_class: type[PosixPath]) -> Callable[[Path, int], Path]:
    def file_path(journal_dir: Path, file_no: int) -> Path:
        return path_class(journal_files.file_path(journal_dir, file_no))

    return file_path
