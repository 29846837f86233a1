"""What every session of a broker shares, handed to each session by the listener: the broker,
its configuration, the STOMP limits, how to check credentials, the set of live sessions and the
budget of their inbound bytes;
and why a session closes (`CloseReason`), the words its log and counters use.

A session reads what it needs here and never reaches into the listener, so the listener and the
session do not import each other.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sluice.config import Config
from sluice.core.broker import Broker
from sluice.server.inbound import InboundBudget, MemoryTrim
from sluice.stomp.codec import StompLimits

# A client that has not sent CONNECT by then is closed.
CONNECT_TIMEOUT_S = 30.0

Authenticator = Callable[[str | None, str | None], bool]


class LiveSession(Protocol):
    """What the listener asks of a session it tracks."""

    def shutdown(self) -> None:
        """Close the connection because the broker stops."""
        ...

    def check_deadlines(self, now: float) -> None:
        """Close the connection if a frame or the connection itself is past its deadline."""
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


def _everyone(login: str | None, passcode: str | None) -> bool:
    return True


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
    authenticate: Authenticator = _everyone
    connect_timeout_s: float = CONNECT_TIMEOUT_S
