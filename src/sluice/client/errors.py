"""Errors the client raises besides those of `sluice.errors`.

Both are `ClientError`s, so a caller that only cares that an operation failed catches that; a
caller that retries can tell a lost connection (the outcome of a frame already written is unknown)
from a broker that did not answer in time.
"""

from __future__ import annotations

from sluice.errors import ClientError

__all__ = ["ConnectionLost", "ReceiptTimeout"]


class ConnectionLost(ClientError):
    """The connection to the broker dropped (or was closed) before the operation completed."""


class ReceiptTimeout(ClientError):
    """The broker did not answer a frame's `receipt` within the client's receipt timeout."""
