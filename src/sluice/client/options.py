"""The client's settings and their defaults, in one place."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from sluice.config import DEFAULT_STOMP_HOST, DEFAULT_STOMP_PORT, MiB
from sluice.errors import ClientError
from sluice.stomp.codec import StompLimits
from sluice.stomp.frames import Version

__all__ = [
    "DEFAULT_BROKERS",
    "DEFAULT_MAX_PENDING_RECEIPTS",
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "ClientOptions",
]

DEFAULT_BROKERS = f"{DEFAULT_STOMP_HOST}:{DEFAULT_STOMP_PORT}"
# A subscription's buffer bounds (see `ClientSubscription`).
DEFAULT_MAX_QUEUED = 1000
DEFAULT_MAX_QUEUED_BYTES = 64 * MiB
# Receipted frames in flight at once; the broker's own default cap is the same number.
DEFAULT_MAX_PENDING_RECEIPTS = 10_000
_VERSIONS = {v.value: v for v in Version}


@dataclass(frozen=True)
class ClientOptions:
    """How a `Client` connects and waits; the keyword arguments of `Client.connect`.

    `heartbeat_ms` is (how often we send, how often we want to hear from the broker); `version`
    the highest STOMP version offered (older ones are offered too). Reconnect rounds wait from
    `initial_reconnect_delay_s` doubling up to `max_reconnect_delay_s`. `receipt_timeout_s`
    bounds each wait for a RECEIPT and for a connection to come back. `ssl_context` dials TLS
    (see `sluice.client.tls.client_context`); the server's certificate must name
    `server_hostname`, or the host dialled when it is None. The passcode stays out of `repr`.
    """

    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    client_id: str | None = None
    heartbeat_ms: tuple[int, int] = (10_000, 10_000)
    version: str = "1.2"
    connect_timeout_s: float = 10.0
    reconnect: bool = True
    initial_reconnect_delay_s: float = 0.1
    max_reconnect_delay_s: float = 30.0
    receipt_timeout_s: float = 30.0
    heartbeat_grace_factor: float = 2.0
    max_pending_receipts: int = DEFAULT_MAX_PENDING_RECEIPTS
    limits: StompLimits = field(default_factory=StompLimits)
    connect_headers: tuple[tuple[str, str], ...] = ()
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)
    server_hostname: str | None = None
    # Send again, on the next connection, a SEND whose RECEIPT a lost connection did not bring
    # (`sluice.client.resend`), at most `max_resends` times.
    resend: bool = False
    max_resends: int = 10

    def __post_init__(self) -> None:
        self.versions()
        for name in ("connect_timeout_s", "receipt_timeout_s", "max_reconnect_delay_s"):
            if getattr(self, name) <= 0:
                raise ClientError(f"{name} must be positive (got {getattr(self, name)})")
        if self.initial_reconnect_delay_s < 0:
            raise ClientError("initial_reconnect_delay_s must not be negative")
        if self.heartbeat_ms[0] < 0 or self.heartbeat_ms[1] < 0:
            raise ClientError(f"heartbeat_ms must not be negative (got {self.heartbeat_ms})")
        if self.heartbeat_grace_factor < 1.0:
            raise ClientError("heartbeat_grace_factor must be at least 1.0")
        if self.max_resends < 0:
            raise ClientError("max_resends must not be negative")
        if self.max_pending_receipts < 1:
            raise ClientError("max_pending_receipts must be at least 1")

    def versions(self) -> tuple[Version, ...]:
        """The versions to offer: every version up to `version`."""
        top = _VERSIONS.get(self.version)
        if top is None:
            raise ClientError(f"unknown STOMP version {self.version!r} (use 1.0, 1.1 or 1.2)")
        order = list(Version)
        return tuple(order[: order.index(top) + 1])
