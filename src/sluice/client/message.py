"""What a subscription hands out: `Message`, and the acknowledgement modes."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sluice.stomp.frames import Frame, Version

__all__ = ["AckMode", "Message", "message_from_frame"]


class AckMode(enum.StrEnum):
    """A subscription's `ack` header."""

    AUTO = "auto"
    CLIENT = "client"
    CLIENT_INDIVIDUAL = "client-individual"


@dataclass(frozen=True, slots=True)
class Message:
    """One MESSAGE frame delivered to a subscription.

    `ack_id` is what an ACK or NACK names: the `ack` header in STOMP 1.2, the `message-id` in 1.0
    and 1.1. `delivery_count` comes from `x-delivery-count`; a broker that does not send it gets 1
    (2 when `redelivered`). `offset` is the message's sequence in its destination (`x-offset`),
    when the broker says. `connection_epoch` numbers the connection that delivered the message:
    an acknowledgement is only meaningful on that same connection.
    """

    destination: str
    message_id: str
    subscription: str
    ack_id: str
    headers: dict[str, str] = field(hash=False)
    body: bytes
    redelivered: bool = False
    delivery_count: int = 1
    offset: int | None = None
    connection_epoch: int = field(default=0, compare=False)

    @property
    def text(self) -> str:
        """The body decoded as UTF-8."""
        return self.body.decode("utf-8")


def _int_header(value: str | None) -> int | None:
    if value is None or not value.isascii():
        return None
    text = value.strip()
    if not text.lstrip("-").isdigit():
        return None
    return int(text)


def message_from_frame(
    frame: Frame, version: Version, epoch: int, subscription: str | None = None
) -> Message:
    """Build a `Message` from a MESSAGE frame received with `version` on connection `epoch`.

    `subscription` stands in for a missing `subscription` header (STOMP 1.0).
    """
    headers = frame.headers
    message_id = headers.get("message-id", "")
    if version is Version.V1_2:
        ack_id = headers.get("ack", message_id)
    else:
        ack_id = message_id
    redelivered = headers.get("redelivered") == "true"
    count = _int_header(headers.get("x-delivery-count"))
    if count is None:
        count = 2 if redelivered else 1
    return Message(
        destination=headers.get("destination", ""),
        message_id=message_id,
        subscription=headers.get("subscription", subscription or ""),
        ack_id=ack_id,
        headers=headers,
        body=frame.body,
        redelivered=redelivered,
        delivery_count=count,
        offset=_int_header(headers.get("x-offset")),
        connection_epoch=epoch,
    )
