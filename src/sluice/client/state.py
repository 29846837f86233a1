"""The client's connection states."""

from __future__ import annotations

import enum

__all__ = ["ClientState"]


class ClientState(enum.Enum):
    """Where a `Client` stands."""

    # Dialling the brokers for the first time.
    CONNECTING = "connecting"
    CONNECTED = "connected"
    # The connection dropped; a task is dialling again. Operations wait for it.
    RECONNECTING = "reconnecting"
    CLOSING = "closing"
    CLOSED = "closed"
    # The connection dropped without reconnect, or a broker refused the CONNECT. Terminal.
    FAILED = "failed"
