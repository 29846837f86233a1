"""What every session of a broker shares, handed to each session by the listener: the broker,
its configuration, the STOMP limits, how to check credentials and permissions (`Guard`), the
set of live sessions and the budget of their inbound bytes; and why a session closes
(`CloseReason`), the words its log and counters use.

A session reads what it needs here and never reaches into the listener, so the listener and the
session do not import each other.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from sluice.auth.acl import AccessControl
from sluice.auth.identity import ANONYMOUS, Identity, Refusal
from sluice.config import Config
from sluice.core.broker import Broker
from sluice.core.views import ConnectionView
from sluice.server.inbound import InboundBudget, MemoryTrim
from sluice.stomp.codec import StompLimits

# CONNECT's `login` and `passcode`, the client's address (host) and the subject CN of its
# verified TLS client certificate (None without one) in; who it is, or why it is refused, out.
# May be slow (a password hash): it runs on `Guard.executor` when there is one.
Authenticator = Callable[[str | None, str | None, str, str | None], Identity | Refusal]


class LiveSession(Protocol):
    """What the listener asks of a session it tracks."""

    # Who the client logged in as; None until its CONNECT is accepted.
    identity: Identity | None

    def shutdown(self) -> None:
        """Close the connection because the broker stops."""
        ...

    def revoke(self, reason: str) -> None:
        """Close the connection because its user may no longer connect (a reload)."""
        ...

    def update_identity(self, identity: Identity) -> None:
        """The user is still there with other groups (a reload)."""
        ...

    def recheck_subscriptions(self) -> bool:
        """Close the connection if new rules took `read` away from one of its subscriptions (a
        reload); returns whether it was closed."""
        ...

    def check_deadlines(self, now: float) -> None:
        """Close the connection if a frame or the connection itself is past its deadline."""
        ...

    def describe(self) -> ConnectionView | None:
        """What an operator sees of the connection (None before its CONNECT is accepted)."""
        ...

    def close_by_operator(self, reason: str) -> None:
        """An operator closes the connection: ERROR with `reason`, then close."""
        ...


class CloseReason(enum.Enum):
    """Why the broker closed (or saw the end of) a connection. Logged and counted."""

    CLIENT_DISCONNECT = "client_disconnect"
    PEER_CLOSED = "peer_closed"
    PROTOCOL_ERROR = "protocol_error"
    REQUEST_ERROR = "request_error"
    LIMIT = "limit"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    CONNECT_TIMEOUT = "connect_timeout"
    FRAME_TIMEOUT = "frame_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CONSUMER = "slow_consumer"
    SHUTDOWN = "shutdown"
    INTERNAL_ERROR = "internal_error"
    STORE_FAILURE = "store_failure"
    STORE_FULL = "store_full"
    AUTH_FAILED = "auth_failed"
    ACCESS_DENIED = "access_denied"
    USER_REMOVED = "user_removed"
    OPERATOR = "operator"


def _everyone(
    login: str | None, passcode: str | None, address: str, certificate: str | None
) -> Identity | Refusal:
    return ANONYMOUS


@dataclass
class Guard:
    """Who may connect and what they may do. Mutable on purpose: a reload (SIGHUP) replaces
    `access`, and every session sees the new rules at its next frame."""

    authenticate: Authenticator = _everyone
    access: AccessControl = field(default_factory=lambda: AccessControl(()))
    # Where `authenticate` runs (None: inline, for authenticators that are quick).
    executor: Executor | None = None


@dataclass(frozen=True)
class SessionContext:
    """The shared, unchanging part of every session (the session set changes, not the field)."""

    broker: Broker
    config: Config
    loop: asyncio.AbstractEventLoop
    stomp_limits: StompLimits
    # What CONNECTED says: `server` header, and the prefix of the `session` header.
    server_name: str
    broker_name: str
    sessions: set[LiveSession]
    # Inbound bytes of every session against `max_inbound_buffered_bytes`; memory given back.
    inbound: InboundBudget
    trim: MemoryTrim
    # The frame bounds before CONNECTED (`max_frame_bytes_unauthenticated`).
    stomp_limits_before_connected: StompLimits
    guard: Guard = field(default_factory=Guard)
    # Open connections by user name (`max_connections_per_user`).
    user_connections: collections.Counter[str] = field(default_factory=collections.Counter)
