"""What streams need from a client, and nothing more: `SendTransport` and `ReadTransport`.

Stream code is written against these protocols, not against `Client`, so the streams package
depends on the client's parts (messages, subscriptions, pipelined receipts) and never on the
client that uses it. `Client` satisfies both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sluice.client.message import AckMode, Message
from sluice.client.pipeline import PipelinedReceipt
from sluice.client.subscription import ClientSubscription

__all__ = ["ReadTransport", "SendTransport"]


class SendTransport(Protocol):
    """What `send_stream` needs: pipelined SENDs and transactions."""

    async def send_pipelined(
        self,
        destination: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = ...,
        persistent: bool = ...,
        transaction: str | None = ...,
        epoch: int | None = ...,
    ) -> PipelinedReceipt:
        """Write a SEND with a receipt; return without waiting for the RECEIPT."""
        ...

    async def begin(self, transaction: str | None = ..., *, receipt: bool = ...) -> str:
        """Begin a transaction and return its id."""
        ...

    async def commit(self, transaction: str) -> None:
        """Commit a transaction and wait for the receipt."""
        ...

    async def abort(self, transaction: str) -> None:
        """Abort a transaction and wait for the receipt."""
        ...


class ReadTransport(Protocol):
    """What `StreamReader` needs: a subscription, acknowledgements, and which connection is up."""

    @property
    def epoch(self) -> int:
        """Number of the newest connection."""
        ...

    @property
    def connected(self) -> bool:
        """Whether a connection is up and usable now."""
        ...

    async def subscribe(
        self,
        destination: str,
        *,
        ack: AckMode | str = ...,
        headers: Mapping[str, str] | None = ...,
        prefetch_bytes: int | None = ...,
        id: str | None = ...,
        max_queued_bytes: int = ...,
    ) -> ClientSubscription:
        """Subscribe and wait for the broker's receipt."""
        ...

    async def ack(self, message: Message, *, receipt: bool = ...) -> None:
        """Acknowledge one message."""
        ...
