"""`FileLease`: the lease on a shared data directory (journal store master/slave).

Three files in the data directory:

- `ha.lock`: an OS lock (`flock`) that the master holds for its whole life. While a broker on a
  local filesystem holds it, nobody else gets it; when the master's process dies, the kernel
  frees it at once, which makes a failover after a crash quick.
- `ha.lease`: the lease record (`LeaseRecord`: holder, epoch, renewals), replaced whole by a
  rename at every change. The master renews it every `lease_s / 3` and re-reads it before it
  trusts its lock: if it shows another holder or another epoch, the master has lost the lease.
- `ha.takeover.lock`: held for the moment of a read-check-write of `ha.lease`, so that two
  brokers never both take the same expired lease.

OS locks alone are not enough: NFS and cluster filesystems have handed one lock to two brokers
(ActiveMQ's AMQ-4378, Artemis' ARTEMIS-4143), and a master frozen (SIGSTOP, a VM paused, a long
stall) keeps its lock while it serves nobody. So a waiting broker takes over when the lease
record has not changed for `lease_s` by its own clock, with or without the OS lock; at once when
the OS lock is free and the holder was a process of this machine that is gone, or when the
holder released the lease. The master's fence (`check`) holds only until `FENCE_FRACTION` of the
lease time after its last renewal began, so it stops writing before a waiting broker could take
over, whatever a frozen process believes when it wakes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.errors import FencedError, LeaseError
from sluice.ha.lease import (
    FENCE_FRACTION,
    MAX_LEASE_FILE_BYTES,
    RENEWALS_PER_LEASE,
    HeldLease,
    Lease,
    LeaseRecord,
)

__all__ = ["FENCE_FRACTION", "LEASE_NAME", "LOCK_NAME", "FileLease"]

log = logging.getLogger(__name__)

LOCK_NAME = "ha.lock"
LEASE_NAME = "ha.lease"
TAKEOVER_NAME = "ha.takeover.lock"
# A waiting broker looks at the lock and the lease this often at most.
MAX_POLL_S = 0.25
# How long one read-check-write waits for the takeover lock before it gives up this round.
TAKEOVER_WAIT_S = 1.0


class FileLease(HeldLease):
    """The lease on `directory`, valid `lease_s` unrenewed. `on_lost(reason)` is called once,
    from whichever thread finds the lease lost (the broker exits there); `holder` names this
    process in the lease file (host, pid and a random token by default)."""

    def __init__(
        self,
        directory: Path,
        lease_s: float,
        *,
        on_lost: Callable[[str], None] | None = None,
        holder: str | None = None,
    ) -> None:
        super().__init__(lease_s, on_lost=on_lost, holder=holder)
        self.directory = directory
        self._renewals = 0
        self._lock_fd: int | None = None
        self._has_os_lock = False
        # What took the lease over from whom, for the log line and the tests; whether that
        # holder may still be alive (it stopped renewing, but nothing says its process ended:
        # frozen, or on another machine), so that the store cuts it off before it opens.
        self.took_over_from: LeaseRecord | None = None
        self.previous_may_be_alive = False

    @property
    def lease_path(self) -> Path:
        """The lease file."""
        return self.directory / LEASE_NAME

    @property
    def where(self) -> str:
        """The lease as messages name it."""
        return f"on {self.directory}"

    @property
    def has_os_lock(self) -> bool:
        """Whether this process holds the OS lock on `ha.lock` too (a master that took over a
        frozen holder's lease gets it once that process is gone)."""
        return self._has_os_lock

    # -- taking the lease ------------------------------------------------------------------------

    def acquire(self, stop: object | None = None, *, wait: bool = True) -> int | None:
        """Take the lease: see the module docstring for when. Returns the new epoch; None when
        `stop` (a `threading.Event`) is set while waiting, or without `wait` when another
        broker holds it. Raises `LeaseError` when the files cannot be used."""
        stop_event = stop if isinstance(stop, threading.Event) else threading.Event()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LeaseError(f"cannot open {self.directory / LOCK_NAME}: {exc.strerror}") from None
        poll_s = min(MAX_POLL_S, self.lease_s / RENEWALS_PER_LEASE)
        seen: tuple[str, int, int] | None = None
        seen_since = time.monotonic()
        announced: tuple[str, int] | None = None
        current: LeaseRecord | None = None
        while True:
            self._try_os_lock()
            started = time.monotonic()
            with self._takeover_lock() as locked:
                if locked:
                    current = self._read()
                    key = None if current is None else current.key
                    if key != seen:
                        seen, seen_since = key, started
                    why = self._free(current, started - seen_since)
                    if why is not None:
                        return self._take(current, why, started)
            if not wait:
                self._close_lock()
                return None
            if locked and current is not None and announced != (current.holder, current.epoch):
                announced = (current.holder, current.epoch)
                log.warning(
                    "waiting for the lease on %s: held by %s (epoch %d); taking over once it "
                    "goes %g s without a renewal",
                    self.directory,
                    current.holder,
                    current.epoch,
                    self.lease_s,
                )
            if stop_event.wait(poll_s):
                self._close_lock()
                return None

    def _free(self, current: LeaseRecord | None, unchanged_s: float) -> tuple[str, bool] | None:
        """Why the lease may be taken now, and whether its holder may still be alive; None
        while its holder keeps it."""
        if current is None:
            return "no lease yet", False
        if current.released:
            return f"released by {current.holder}", False
        if current.holder == self.holder:
            return "held by this process already", False
        if self._has_os_lock and current.host == self.host and not _pid_alive(current.pid):
            return f"its holder {current.holder} is gone (its process ended)", False
        if unchanged_s >= self.lease_s:
            return f"{current.holder} did not renew it for {unchanged_s:.1f} s", True
        return None

    def _take(self, current: LeaseRecord | None, why: tuple[str, bool], started: float) -> int:
        reason, may_be_alive = why
        epoch = (current.epoch if current is not None else 0) + 1
        self._renewals = 0
        self._write(self._record(epoch))
        written = self._read()
        if written is None or written.holder != self.holder or written.epoch != epoch:
            raise LeaseError(f"{self.lease_path}: the lease written did not read back")
        self._epoch = epoch
        self._valid_until = started + self.lease_s * FENCE_FRACTION
        self.took_over_from = current
        self.previous_may_be_alive = may_be_alive
        log.warning(
            "took the lease on %s at epoch %d (%s)%s",
            self.directory,
            epoch,
            reason,
            "" if self._has_os_lock else "; its OS lock is still held by the frozen holder",
        )
        return epoch

    def _record(self, epoch: int) -> LeaseRecord:
        return LeaseRecord(
            holder=self.holder,
            epoch=epoch,
            renewals=self._renewals,
            host=self.host,
            pid=self.pid,
            written_unix=time.time(),
        )

    # -- holding it ------------------------------------------------------------------------------

    def _renew_round(self) -> None:
        try:
            self.renew()
        except (OSError, LeaseError) as exc:
            # Tried again next round; the fence ends writes if it never succeeds.
            log.warning("renewing the lease on %s failed: %s", self.directory, exc)
        if not self._has_os_lock:
            self._try_os_lock()

    def renew(self) -> None:
        """Re-read the lease and, if it is still this process's, write it renewed. Raises
        `FencedError` (after `on_lost`) when it shows another holder or epoch."""
        started = time.monotonic()
        with self._takeover_lock() as locked:
            if not locked:
                raise LeaseError(f"{self.directory / TAKEOVER_NAME} stayed locked")
            current = self._read()
            if current is None or current.holder != self.holder or current.epoch != self._epoch:
                shown = (
                    "no lease" if current is None else f"{current.holder} at epoch {current.epoch}"
                )
                self._lose(f"the lease file shows {shown}")
                raise FencedError(f"the lease on {self.directory} was taken over")
            self._renewals += 1
            self._write(self._record(self._epoch))
        self._renewed(started)

    def release(self) -> None:
        """Stop renewing; mark the lease released (when still this process's) so that a waiting
        broker takes it at once; free the OS lock."""
        self._stop_renewing()
        if self._epoch and self._lost is None:
            try:
                with self._takeover_lock() as locked:
                    current = self._read() if locked else None
                    if current is not None and current.holder == self.holder:
                        self._write(dataclasses.replace(current, released=True))
            except (OSError, LeaseError) as exc:
                log.warning("releasing the lease on %s: %s", self.directory, exc)
        self._valid_until = float("-inf")
        self._close_lock()

    # -- files -----------------------------------------------------------------------------------

    def _try_os_lock(self) -> None:
        if self._has_os_lock or self._lock_fd is None:
            return
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LeaseError(
                    f"cannot lock {self.directory / LOCK_NAME}: {exc.strerror}"
                ) from None
            return
        self._has_os_lock = True

    def _close_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        self._has_os_lock = False
        if fd is not None:
            os.close(fd)  # frees the flock with it

    @contextlib.contextmanager
    def _takeover_lock(self) -> Iterator[bool]:
        """Hold `ha.takeover.lock` for one read-check-write; yields False if it stayed busy."""
        path = self.directory / TAKEOVER_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LeaseError(f"cannot open {path}: {exc.strerror}") from None
        try:
            deadline = time.monotonic() + TAKEOVER_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    # Held for a read and a write by another broker: a moment.
                    time.sleep(0.01)
            yield True
        finally:
            os.close(fd)

    def _read(self) -> LeaseRecord | None:
        path = self.lease_path
        try:
            with path.open("rb") as file:
                data = file.read(MAX_LEASE_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LeaseError(f"cannot read {path}: {exc.strerror}") from None
        return LeaseRecord.decode(data, str(path))

    def _write(self, record: LeaseRecord) -> None:
        """Replace the lease file whole: a reader sees the old record or the new, never half."""
        path = self.lease_path
        temp = self.directory / f"{LEASE_NAME}.{self.pid}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, record.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise LeaseError(f"cannot write {path}: {exc.strerror}") from None


if TYPE_CHECKING:
    # FileLease is a Lease (checked by the type checker, at no cost at run time).
    _IS_A_LEASE: type[Lease] = FileLease


def _describe(record: LeaseRecord | None) -> str:
    return "no lease" if record is None else f"{record.holder} at epoch {record.epoch}"


def _pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
