"""What a lease offers (`Lease`), and the record a lease file holds (`LeaseRecord`).

A lease has one holder at a time and an epoch that grows by one at every change of holder. The
holder renews it; a waiting broker takes it over once it has gone unrenewed for the lease's time
(as the waiting broker's own clock measures it, so that clocks of different machines need not
agree). The epoch fences writes: a holder checks, before each write batch, that its lease is
still valid by its own clock with a margin, so it stops writing before anyone could take over.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol, TypeVar

from sluice.errors import FencedError, LeaseError

__all__ = [
    "FENCE_FRACTION",
    "MAX_LEASE_FILE_BYTES",
    "RENEWALS_PER_LEASE",
    "HeldLease",
    "Lease",
    "LeaseRecord",
]

log = logging.getLogger(__name__)

# The master renews this many times per lease time.
RENEWALS_PER_LEASE = 3
# The master writes only until this fraction of the lease time after its last renewal began: a
# waiting broker takes over a full lease time after it last saw the lease unrenewed, so the
# difference is the margin for clocks running at slightly different rates.
FENCE_FRACTION = 0.75

# A lease file is a few hundred bytes; anything longer is not one, and is not read further.
MAX_LEASE_FILE_BYTES = 4096

_T = TypeVar("_T")


class Lease(Protocol):
    """A lease on a store, held by one broker at a time. A lease is the store's `Fence`
    (`check`). Every kind of store has its own (`FileLease` for a shared data directory); the
    broker's start takes it, renews it, hands it to the store, and releases it at a clean stop.
    `on_lost(reason)`, given when it is made, is called once when it is found lost."""

    @property
    def holder(self) -> str:
        """Who this process is in the lease (host, process and a random token)."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch this process holds (0 before `acquire`)."""
        ...

    @property
    def previous_may_be_alive(self) -> bool:
        """Whether the previous holder may still be alive (it stopped renewing; nothing says
        its process ended), so that the store cuts it off before it opens (files it may still
        write to). False for a lease whose store fences writes itself, such as a database."""
        ...

    def acquire(self, stop: object | None = None, *, wait: bool = True) -> int | None:
        """Take the lease, waiting while another holder keeps it renewed (unless not `wait`).
        Returns the new epoch, or None when `stop` (a `threading.Event`) was set meanwhile or,
        without `wait`, when another broker holds the lease."""
        ...

    def start_renewing(self) -> None:
        """Renew the lease in the background every lease time / 3 until `release`."""
        ...

    def is_held(self) -> bool:
        """Whether the lease is held and valid now."""
        ...

    def check(self) -> None:
        """The fence: raise `FencedError` unless the lease is held and valid now. Cheap."""
        ...

    def release(self) -> None:
        """Give the lease up (a waiting broker takes it at once) and stop renewing."""
        ...


@dataclass(frozen=True)
class LeaseRecord:
    """What a lease file holds: who holds the lease (`holder`, and its `host` and `pid` so that a
    broker on the same machine can tell a holder that is gone), the `epoch`, how many times it
    was renewed in this epoch (`renewals`: a waiting broker watches it change), whether the
    holder gave it up (`released`), and when it was written (`written_unix`, for people)."""

    holder: str
    epoch: int
    renewals: int
    host: str
    pid: int
    released: bool = False
    written_unix: float = 0.0

    @property
    def key(self) -> tuple[str, int, int]:
        """What changes at every renewal: a waiting broker times how long it stays the same."""
        return (self.holder, self.epoch, self.renewals)

    def encode(self) -> bytes:
        """The file's bytes: one JSON object and a newline."""
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def decode(cls, data: bytes, where: str) -> LeaseRecord:
        """Parse a lease file's bytes; `LeaseError` naming `where` if they are not a lease."""
        if len(data) > MAX_LEASE_FILE_BYTES:
            raise LeaseError(f"{where}: longer than {MAX_LEASE_FILE_BYTES} bytes: not a lease")
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise LeaseError(f"{where}: not a lease file (not a JSON object)") from None
        if not isinstance(raw, dict):
            raise LeaseError(f"{where}: not a lease file (not a JSON object)")
        try:
            record = cls(
                holder=_typed(raw, "holder", str),
                epoch=_typed(raw, "epoch", int),
                renewals=_typed(raw, "renewals", int),
                host=_typed(raw, "host", str),
                pid=_typed(raw, "pid", int),
                released=_typed(raw, "released", bool),
                written_unix=_number(raw, "written_unix"),
            )
        except KeyError as exc:
            raise LeaseError(f"{where}: not a lease file ({exc.args[0]})") from None
        if record.epoch < 1 or record.renewals < 0:
            raise LeaseError(f"{where}: not a lease file (epoch {record.epoch})")
        return record


def _typed(raw: dict[str, object], name: str, kind: type[_T]) -> _T:
    value = raw.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise KeyError(f"{name} missing or of the wrong type")
    return value


def _number(raw: dict[str, object], name: str) -> float:
    value = raw.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise KeyError(f"{name} missing or of the wrong type")
    return float(value)


class HeldLease:
    """What every kind of lease does once taken: renew it on a thread every `lease_s / 3`, the
    fence on this process's clock (`check`), and the loss, told once to `on_lost(reason)` from
    whichever thread finds it. A kind of lease gives `acquire`, `release`, `where` (how messages
    name it) and `_renew_round` (one renewal: `FencedError` once another broker holds the lease,
    its own failures logged and left to the fence)."""

    thread_name = "sluice-lease"

    def __init__(
        self,
        lease_s: float,
        *,
        on_lost: Callable[[str], None] | None = None,
        holder: str | None = None,
    ) -> None:
        if lease_s <= 0:
            raise LeaseError(f"lease_s must be positive (got {lease_s})")
        self.lease_s = lease_s
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.holder = holder or f"{self.host}:{self.pid}:{secrets.token_hex(4)}"
        self._on_lost = on_lost
        self._epoch = 0
        # Monotonic time until which writes are allowed (-inf: not held).
        self._valid_until = float("-inf")
        self._lost: str | None = None
        self._lost_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        """The lease as messages name it."""
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch this process holds (0 before `acquire`)."""
        return self._epoch

    def start_renewing(self) -> None:
        """Renew every `lease_s / 3` on a thread of its own until `release` (or the loss)."""
        if self._epoch == 0:
            raise LeaseError("the lease is not held")
        self._thread = threading.Thread(target=self._renew_loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        interval_s = self.lease_s / RENEWALS_PER_LEASE
        while not self._stop.wait(interval_s):
            if self._lost is not None:
                return
            if time.monotonic() >= self._valid_until:
                self._lose(f"it was not renewed within {self.lease_s * FENCE_FRACTION:g} s")
                return
            try:
                self._renew_round()
            except FencedError:
                return

    def _renew_round(self) -> None:
        raise NotImplementedError

    def _renewed(self, started: float) -> None:
        """A renewal begun at `started` (monotonic) succeeded: writes are allowed until
        `FENCE_FRACTION` of the lease after it."""
        if self._lost is None:
            self._valid_until = started + self.lease_s * FENCE_FRACTION

    def is_held(self) -> bool:
        """Whether the lease is held and valid now."""
        return self._lost is None and time.monotonic() < self._valid_until

    def check(self) -> None:
        """The fence (`sluice.store.api.Fence`): return while the lease is valid by this
        process's clock, else call `on_lost` (once) and raise `FencedError`."""
        if self._lost is None and time.monotonic() < self._valid_until:
            return
        if self._lost is None and self._epoch:
            self._lose(f"it was not renewed within {self.lease_s * FENCE_FRACTION:g} s")
        raise FencedError(f"this broker does not hold the lease {self.where}")

    def _lose(self, reason: str) -> None:
        with self._lost_lock:
            if self._lost is not None:
                return
            self._lost = reason
            self._valid_until = float("-inf")
        log.critical("lost the lease %s at epoch %d: %s", self.where, self._epoch, reason)
        if self._on_lost is not None:
            self._on_lost(reason)

    def _stop_renewing(self) -> None:
        """End the renewing thread (not waiting for itself), for `release`."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.lease_s)
