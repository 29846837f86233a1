"""A subscription: where a consumer's credit and in-flight messages live.

Credit is counted in messages (`prefetch`) and bytes (`prefetch_bytes`, 0 = unlimited). The byte
credit is a cap: a queue sends a message only if it fits in what is left of it (`fits`), except
when nothing is in flight, so that a message larger than the whole credit still moves, alone. So
the bytes in flight to a subscription never exceed its byte credit, or one message. (A topic
subscription stops at its credit too, but may go over it by one message.) Auto-acknowledged
messages are settled when handed to the connection, so their credit is bounded by the connection's
write buffer (`Link.writable`) instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sluice.core.message import AckMode, DestinationKind, Message
from sluice.core.views import ConsumerView

_JMS_IDENTIFIERS: dict[str, Callable[[Message], object]] = {
    "JMSMessageID": lambda m: m.message_id,
    "JMSPriority": lambda m: m.priority,
    "JMSTimestamp": lambda m: m.timestamp_ms,
    "JMSExpiration": lambda m: m.expires_ms,
    "JMSDeliveryMode": lambda m: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSRedelivered": lambda m: m.delivery_count > 0,
    "JMSCorrelationID": lambda m: m.headers.get("correlation-id"),
    "JMSType": lambda m: m.headers.get("type"),
    "JMSReplyTo": lambda m: m.headers.get("reply-to"),
    "JMSDestination": lambda m: m.destination,
}


def message_lookup(message: Message) -> Callable[[str], object | None]:
    """The identifier lookup a selector evaluates against: JMS header names, then properties."""
    headers = message.headers

    def lookup(name: str) -> object | None:
        getter = _JMS_IDENTIFIERS.get(name)
        if getter is not None:
            return getter(message)
        return headers.get(name)

    return lookup


if TYPE_CHECKING:
    from sluice.core.selector import Selector
    from sluice.store.api import WriteHandle


class Source(Protocol):
    """What a subscription's destination answers to (a queue or a topic, `Destination`): the
    subscription's holders settle, requeue and leave through it. Declared here so that
    subscriptions need not import destinations, which hold subscriptions."""

    name: str
    kind: DestinationKind

    def settle(
        self,
        sub: Subscription,
        message: Message,
        *,
        store_removed: bool = False,
        on_removed: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """A delivered message was acknowledged."""
        ...

    def requeue(
        self, sub: Subscription, deliveries: list[tuple[int, Message]], *, redelivered: bool
    ) -> None:
        """Delivered messages (tag, message) come back, in delivery order."""
        ...

    def remove_subscription(self, sub: Subscription) -> None:
        """A consumer left; its in-flight messages were requeued first."""
        ...

    def wakeup(self) -> None:
        """Something changed that may let messages move: dispatch soon."""
        ...


class Link(Protocol):
    """What the core needs from a client connection (the server's session implements it)."""

    @property
    def writable(self) -> bool:
        """False while the connection's outbound buffer is above its high-water mark."""
        ...

    def deliver(self, sub: Subscription, message: Message, tag: int, delivery_count: int) -> None:
        """Queue a MESSAGE frame for this subscription. `tag` identifies the delivery for ACK
        (0 for auto-acknowledged ones); `delivery_count` is 1 on the first delivery."""
        ...


class Durable:
    """A durable topic subscription: a cursor that outlives the connections that consume it."""

    __slots__ = ("active", "client_id", "cursor", "delivered_upto", "name", "selector")

    def __init__(
        self, client_id: str, name: str, selector: str | None, cursor: int, delivered_upto: int
    ) -> None:
        self.client_id = client_id
        self.name = name
        self.selector = selector
        # Every message up to `cursor` has been acknowledged.
        self.cursor = cursor
        # Messages up to here may have been delivered before: they come back marked redelivered.
        self.delivered_upto = delivered_upto
        self.active: Subscription | None = None

    def __repr__(self) -> str:
        return f"<Durable {self.client_id}/{self.name} cursor={self.cursor}>"


class DeliveryTags(dict[int, "Subscription"]):
    """A connection's delivery tags: tag -> the subscription its message went to. Numbers are
    the connection's own, from 1, so brokers and connections in one process never share a
    counter. A delivery takes `tag = tags.next_tag()` and sets `tags[tag] = sub` (the counter is
    C code: no Python call per delivery)."""

    __slots__ = ("next_tag",)

    def __init__(self) -> None:
        super().__init__()
        self.next_tag: Callable[[], int] = itertools.count(1).__next__


class Subscription:
    """One SUBSCRIBE of one connection to one destination (or a durable subscription)."""

    __slots__ = (
        "ack_mode",
        "auto",
        "backlog",
        "client_id",
        "connection_id",
        "destination",
        "durable",
        "durable_name",
        "exclusive",
        "groups",
        "id",
        "inflight",
        "inflight_bytes",
        "inflight_counts",
        "link",
        "link_data",
        "max_open_groups",
        "next_seq",
        "prefetch",
        "prefetch_bytes",
        "redeliver",
        "selector",
        "tags",
    )

    def __init__(
        self,
        link: Link,
        sub_id: str,
        destination: Source,
        ack_mode: AckMode,
        prefetch: int,
        prefetch_bytes: int = 0,
        *,
        selector: Selector | None = None,
        exclusive: bool = False,
        max_open_groups: int = 0,
        durable_name: str | None = None,
        client_id: str | None = None,
        tags: DeliveryTags | None = None,
        connection_id: int = 0,
    ) -> None:
        self.link = link
        # The connection's id (`BrokerConnection.id`), for operators.
        self.connection_id = connection_id
        self.id = sub_id
        self.destination = destination
        self.ack_mode = ack_mode
        self.auto = ack_mode is AckMode.AUTO
        self.prefetch = max(1, prefetch)
        self.prefetch_bytes = prefetch_bytes
        self.selector = selector
        self.exclusive = exclusive
        self.max_open_groups = max_open_groups
        self.durable_name = durable_name
        self.client_id = client_id
        # delivery tag -> message, in delivery order (a cumulative ACK pops from the front).
        self.inflight: dict[int, Message] = {}
        self.inflight_bytes = 0
        # Delivery counts above 1 of in-flight topic messages (a queue message carries its own).
        self.inflight_counts: dict[int, int] = {}
        # The connection's delivery tags (STOMP 1.2 ACK carries only the tag).
        self.tags = DeliveryTags() if tags is None else tags
        # Message groups this subscription owns (group id -> when it last got one of their
        # messages, in ms).
        self.groups: dict[str, int] = {}
        # Topic subscriptions: the next sequence to deliver, and messages put back by NACK.
        self.next_seq = 0
        self.redeliver: list[tuple[Message, int]] = []
        # Topic subscriptions behind the in-memory log read older messages from the store into
        # this buffer, a credit's worth at a time.
        self.backlog: list[Message] = []
        # The durable subscription this one is the active consumer of, if any.
        self.durable: Durable | None = None
        # Opaque to the core: the link caches what it needs per subscription (encoded headers).
        self.link_data: bytes = b""

    def view(self) -> ConsumerView:
        """What an operator sees of it now."""
        in_flight = len(self.inflight)
        return ConsumerView(
            destination=self.destination.name,
            connection_id=self.connection_id,
            subscription_id=self.id,
            ack_mode=self.ack_mode.value,
            selector=self.selector.text if self.selector is not None else None,
            exclusive=self.exclusive,
            durable_name=self.durable_name,
            client_id=self.client_id,
            prefetch=self.prefetch,
            prefetch_bytes=self.prefetch_bytes,
            messages_in_flight=in_flight,
            bytes_in_flight=self.inflight_bytes,
            credit=None if self.auto else max(0, self.prefetch - in_flight),
            credit_bytes=(
                max(0, self.prefetch_bytes - self.inflight_bytes)
                if self.prefetch_bytes and not self.auto
                else None
            ),
            writable=self.link.writable,
        )

    def ready(self) -> bool:
        """May the destination hand this subscription another message now?"""
        if not self.link.writable:
            return False
        if self.auto:
            return True
        inflight = self.inflight
        if not inflight:
            return True
        if len(inflight) >= self.prefetch:
            return False
        return not self.prefetch_bytes or self.inflight_bytes < self.prefetch_bytes

    def resume_offset(self) -> int:
        """A topic subscription: the sequence it would deliver next (what it read back from
        the store but did not deliver yet included), where a reader of the log resumes."""
        return self.backlog[0].seq if self.backlog else self.next_seq

    def fits(self, message: Message) -> bool:
        """Does the message fit in the byte credit left (always, with nothing in flight)?"""
        if not self.prefetch_bytes or self.auto or not self.inflight:
            return True
        return self.inflight_bytes + message.nbytes <= self.prefetch_bytes

    def matches(self, message: Message) -> bool:
        """Does the subscription's selector accept the message (no selector accepts all)?"""
        selector = self.selector
        if selector is None:
            return True
        return selector.matches(message_lookup(message))

    def __repr__(self) -> str:
        return f"<Subscription {self.id} on {self.destination.name} inflight={len(self.inflight)}>"
