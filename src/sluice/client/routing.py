"""`SubscriptionRegistry`: a client's subscriptions by id, and what happens to all of them at once.

It routes each MESSAGE to its subscription's buffer, sends every SUBSCRIBE again on a new
connection, drops what an old connection delivered, and knows whether some buffer is full (the
client then stops reading the socket). `Client` owns one and answers its connector through it.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from sluice.client.link import ClientLink
from sluice.client.message import message_from_frame
from sluice.client.subscription import ClientSubscription
from sluice.errors import BrokerErrorFrame, ClientError
from sluice.stomp.frames import Command, Frame

__all__ = ["SubscriptionRegistry"]

logger = logging.getLogger(__name__)


class SubscriptionRegistry:
    """The active subscriptions of one client, by id, and which of their buffers are full."""

    def __init__(self) -> None:
        self._by_id: dict[str, ClientSubscription] = {}
        self._full: set[str] = set()

    def snapshot(self) -> dict[str, ClientSubscription]:
        """A copy of the subscriptions by id."""
        return dict(self._by_id)

    def get(self, sub_id: str) -> ClientSubscription | None:
        """The subscription of that id, if active."""
        return self._by_id.get(sub_id)

    def add(self, subscription: ClientSubscription) -> None:
        """Register `subscription`; `ClientError` if its id is taken."""
        if subscription.id in self._by_id:
            raise ClientError(f"subscription id {subscription.id!r} is already in use")
        self._by_id[subscription.id] = subscription

    def remove(self, subscription: ClientSubscription) -> bool:
        """Forget `subscription`; False if it was not the one registered under its id."""
        if self._by_id.get(subscription.id) is not subscription:
            return False
        del self._by_id[subscription.id]
        return True

    def take_all(self) -> list[ClientSubscription]:
        """Forget every subscription and return them."""
        subscriptions = list(self._by_id.values())
        self._by_id.clear()
        return subscriptions

    # Messages.

    def route(self, link: ClientLink, frame: Frame) -> None:
        """Put a MESSAGE in its subscription's buffer."""
        sub_id = frame.headers.get("subscription")
        subscription = self._by_id.get(sub_id) if sub_id is not None else None
        if subscription is None and sub_id is None:
            # STOMP 1.0 brokers may omit it: match on the destination when that is unambiguous.
            destination = frame.headers.get("destination")
            matches = [s for s in self._by_id.values() if s.destination == destination]
            if len(matches) == 1:
                subscription = matches[0]
        if subscription is None:
            logger.debug("%s: MESSAGE for unknown subscription %r dropped", link.label, sub_id)
            return
        message = message_from_frame(frame, link.version, link.epoch, subscription.id)
        if not subscription.deliver(message):
            logger.debug(
                "%s: MESSAGE for closing subscription %s dropped", link.label, subscription.id
            )

    @property
    def blocked(self) -> bool:
        """Whether a subscription buffer is full (the link then pauses reading)."""
        return bool(self._full)

    def mark_full(self, subscription: ClientSubscription) -> None:
        """A subscription buffer reached its bound."""
        self._full.add(subscription.id)

    def mark_drained(self, subscription: ClientSubscription) -> bool:
        """A subscription buffer went below its low mark; True if no buffer is full now."""
        self._full.discard(subscription.id)
        return not self._full

    # Connections.

    def restore(self, link: ClientLink) -> None:
        """Re-send every SUBSCRIBE on a new link, without waiting for the receipts.

        The broker handles frames in order, so whatever is sent after these finds the
        subscriptions in place. An ERROR about one of them ends that subscription alone.
        """
        for subscription in list(self._by_id.values()):
            _, future = link.send_with_receipt(Command.SUBSCRIBE, dict(subscription.headers))
            future.add_done_callback(functools.partial(self._restored, subscription))
        if self._by_id:
            logger.info("%s: %d subscriptions restored", link.label, len(self._by_id))

    def _restored(self, subscription: ClientSubscription, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if isinstance(error, BrokerErrorFrame):
            logger.warning(
                "broker refused to restore subscription %s to %s: %s",
                subscription.id,
                subscription.destination,
                error.message,
            )
            if self._by_id.get(subscription.id) is subscription:
                del self._by_id[subscription.id]
            subscription.close(error)

    def discard_epoch(self, epoch: int) -> None:
        """Drop the unacknowledged messages connection `epoch` delivered: they come again."""
        for subscription in self._by_id.values():
            dropped = subscription.discard_epoch(epoch)
            if dropped:
                logger.info(
                    "subscription %s: %d unacknowledged messages dropped, the broker redelivers",
                    subscription.id,
                    dropped,
                )

    def close_all(self, error: ClientError) -> None:
        """The client will not reconnect: every subscription ends with `error`."""
        for subscription in self._by_id.values():
            subscription.close(error)
