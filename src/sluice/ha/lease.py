"""What a lease offers (`Lease`), and the record a lease file holds (`LeaseRecord`).

A lease has one holder at a time and an epoch that grows by one at every change of holder. The
holder renews it; a waiting broker takes it over once it has gone unrenewed for the lease's time
(as the waiting broker's own clock measures it, so that clocks of different machines need not
agree). The epoch fences writes: a holder checks, before each write batch, that its lease is
still valid by its own clock with a margin, so it stops writing before anyone could take over.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Protocol, TypeVar

from sluice.errors import LeaseError

__all__ = ["MAX_LEASE_FILE_BYTES", "Lease", "LeaseRecord"]

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
