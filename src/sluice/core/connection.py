"""One client connection as the core sees it: its subscriptions, deliveries and transactions.

The server's session turns STOMP frames into calls here; every error a client can cause is raised
as `RequestError` (or `LimitExceeded`) with a message fit to send back in an ERROR frame.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sluice.config import StoreFullPolicy
from sluice.core.broker import Broker
from sluice.core.destination import Destination
from sluice.core.message import (
    DEDUP_ID,
    STREAM_ID,
    TOPIC_PREFIX,
    AckMode,
    DestinationKind,
    DestinationNameError,
    Message,
    closes_group,
)
from sluice.core.producers import ProducerMarks
from sluice.core.selector import Selector, SelectorError, compile_selector
from sluice.core.services import FlowReason
from sluice.core.subscription import DeliveryTags, Link, Subscription
from sluice.core.topic import Topic
from sluice.core.transaction import Transaction
from sluice.core.usage import Usage
from sluice.core.wildcard import WildcardError, compile_pattern, is_wildcard
from sluice.errors import LimitExceeded, RequestError, StoreUnavailableError
from sluice.store.api import WriteHandle

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)


class ClientLink(Link, Protocol):
    """A link that is also a producer the broker can pause."""

    def pause_producer(self, reason: FlowReason) -> None:
        """Stop reading the connection's socket."""
        ...

    def resume_producer(self, reason: FlowReason) -> None:
        """Read again."""
        ...

    @property
    def reading_paused(self) -> bool:
        """Is the broker holding this connection's input back (for whatever reason)?"""
        ...


class WildcardSubscription:
    """A subscription to every topic a pattern matches, now and later: one child subscription
    per matching topic, all with the same id, sharing the connection's delivery tags. Credit is
    counted per topic."""

    def __init__(self, pattern: str, attach: Callable[[Topic], None]) -> None:
        self.pattern = compile_pattern(pattern)
        self.attach = attach
        self.children: list[Subscription] = []
        self.link_data = b""


@dataclass(frozen=True, slots=True)
class SubscribeOptions:
    """What a SUBSCRIBE asks for beyond its id, destination and ack mode."""

    # Credit in messages (None: the destination policy's default) and in bytes (0: none).
    prefetch: int | None = None
    prefetch_bytes: int = 0
    selector: str | None = None
    exclusive: bool = False
    # Message groups this consumer may hold at once (0: no bound of its own).
    max_open_groups: int = 0
    # A durable topic subscription's name (needs the connection's client id).
    durable_name: str | None = None
    # Where a topic cursor starts (`x-offset`).
    offset: str | None = None


_NO_OPTIONS = SubscribeOptions()


def _compile(selector: str | None) -> Selector | None:
    if selector is None or not selector.strip():
        return None
    try:
        return compile_selector(selector)
    except SelectorError as exc:
        raise RequestError(str(exc)) from None


def _prefetch(destination: Destination, options: SubscribeOptions) -> int:
    if options.prefetch is not None:
        return options.prefetch
    policy = destination.policy
    if destination.kind is DestinationKind.QUEUE:
        return policy.queue_prefetch
    if options.durable_name is not None:
        return policy.durable_prefetch
    return policy.topic_prefetch


class BrokerConnection:
    """The core's side of one client connection."""

    def __init__(self, broker: Broker, link: ClientLink, client_id: str | None = None) -> None:
        self.broker = broker
        self.link = link
        self.client_id = client_id
        self.id = next(_connection_ids)
        self.subs: dict[str, Subscription] = {}
        self.wildcard_subs: dict[str, WildcardSubscription] = {}
        self.tags = DeliveryTags()
        self.txs: dict[str, Transaction] = {}
        # The memory usages this connection waits on to drain (at most a few).
        self._waiting_on: set[Usage] = set()
        # Live streams being sent: (destination, stream id).
        self.open_streams: set[tuple[str, str]] = set()
        # The destinations it counts as a producer of.
        self.producing = ProducerMarks()
        self.closed = False

    # -- producing ------------------------------------------------------------------------------

    def destination(self, name: str) -> Destination:
        """The destination `name`, created on first use (checked and counted as a SUBSCRIBE's
        or SEND's would be)."""
        return self._destination(name)

    def _destination(self, name: str) -> Destination:
        existing = self.broker.destinations.get(name)
        if existing is not None:
            return existing  # its name passed the checks when it was created
        self._check_name(name)
        try:
            return self.broker.destination(name, self.id)
        except DestinationNameError as exc:
            raise RequestError(str(exc)) from None

    def _check_name(self, name: str) -> None:
        limit = self.broker.limits.max_destination_name_bytes
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > limit:
            self.broker.count("limit_max_destination_name_bytes")
            raise LimitExceeded(
                "max_destination_name_bytes", limit, f"a destination name of {size} bytes"
            )

    def send(
        self,
        message: Message,
        on_stored: Callable[[WriteHandle | None], None],
        txid: str | None = None,
    ) -> None:
        """Accept a message. `on_stored` runs once it may be receipted, with the store's handle
        (whose `error` says the write failed). May pause the producer."""
        destination = self._destination(message.destination)
        if destination is not self.producing.last:
            self.producing.note(destination)
        broker = self.broker
        persistent = message.persistent
        if persistent and broker.store_failed:
            broker.count("sends_refused_store_failed")
            cause = f" ({broker.store_failure})" if broker.store_failure else ""
            raise StoreUnavailableError(
                f"persistent messages are refused: the message store failed{cause}; "
                "see the broker log"
            )
        if persistent:
            full = broker.disk_full(persistent=True)
        else:
            # Only a queue over its memory spools to the temp store's disk.
            full = (
                destination.kind is DestinationKind.QUEUE
                and destination.usage.full
                and broker.disk_full(persistent=False)
            )
        if full:
            # At the limit: this message is taken (there is a reserve for it) and the producer
            # waits; or, with store_full = "error", it is refused with the limit named.
            if broker.config.store.store_full is StoreFullPolicy.ERROR:
                raise broker.disk_budget(persistent=persistent).refusal()
            broker.wait_for_disk(self, self.link, persistent=persistent)
        headers = message.headers
        dedup_id = headers.get(DEDUP_ID)
        if dedup_id is not None and dedup_id in destination.dedup:
            # Seen within the window: acknowledged to the producer and dropped.
            broker.count("duplicates_dropped")
            on_stored(None)
            return None
        if txid is not None:
            held_whole = self._tx(txid).add(destination, message)
            on_stored(None)
            if held_whole:
                # Only the memory store: memory is all there is, and it bounds the producer.
                return self._check_flow(destination, message)
            # The body is in a store: memory does not bound the producer (a paused producer
            # could not send the COMMIT); the pending writes and the transaction limits do.
            if broker.writes_backed_up():
                broker.wait_for_writes(self, self.link)
            return None
        stream_id = headers.get(STREAM_ID)
        if stream_id is not None:
            # First: a chunk refused at a limit must not leave its dedup id behind.
            self._track_stream(destination, stream_id, closes_group(headers))
        if dedup_id is not None:
            destination.dedup.add(dedup_id)
        if persistent:
            broker.accept(destination, message, on_stored)
        else:
            # Nothing to count nor to withdraw (Broker.accept's work is for persistent ones).
            destination.accept(message, on_stored)
        return self._check_flow(destination, message)

    def _track_stream(self, destination: Destination, stream_id: str, ends: bool) -> None:
        """Remember live (non-transacted) streams this connection is sending, here and at their
        destination, to abort them if it dies or goes quiet."""
        key = (destination.name, stream_id)
        streams = self.open_streams
        tracked = destination.open_streams
        if ends:
            streams.discard(key)
            tracked.end(stream_id)
            return
        limits = self.broker.limits
        if key not in streams and len(streams) >= limits.max_open_streams_per_connection:
            streams.difference_update([k for k in streams if not self._sending(*k)])
        if key not in streams and len(streams) >= limits.max_open_streams_per_connection:
            self.broker.count("limit_max_open_streams_per_connection")
            raise LimitExceeded(
                "max_open_streams_per_connection", limits.max_open_streams_per_connection, stream_id
            )
        if tracked.full_for(stream_id):
            self.broker.count("limit_max_open_streams_per_destination")
            raise LimitExceeded("max_open_streams_per_destination", tracked.limit, stream_id)
        streams.add(key)
        tracked.chunk(stream_id, self.broker.now_ms(), self.link)

    def abort_streams(self, reason: str) -> None:
        """Send an abort marker into each live stream this connection was the last to send a
        chunk of, so readers fail clearly instead of waiting for ever."""
        for name, stream_id in self.open_streams:
            if self._sending(name, stream_id):
                self.broker.abort_stream(name, stream_id, reason)
        self.open_streams.clear()

    def _sending(self, name: str, stream_id: str) -> bool:
        """Is this connection still the one sending the stream (not ended, aborted as idle, or
        taken over by another producer)?"""
        destination = self.broker.destinations.get(name)
        return destination is not None and destination.open_streams.producer(stream_id) is (
            self.link
        )

    def _check_flow(self, destination: Destination, message: Message) -> None:
        broker = self.broker
        usage = destination.usage
        if usage.full and not self._pages(destination, message):
            broker.count("flow_paused_memory")
            if not usage.waiting:
                log.info(
                    "%s is over its memory limit (%d of %d bytes, broker %d of %d): "
                    "pausing its producers",
                    destination.name,
                    usage.used,
                    usage.limit_bytes,
                    broker.usage.used,
                    broker.usage.limit_bytes,
                )
            usage.wait(self, self._resume_memory)
            self._waiting_on.add(usage)
            self.link.pause_producer(FlowReason.MEMORY)
        if broker.writes_backed_up():
            broker.wait_for_writes(self, self.link)

    def _pages(self, destination: Destination, message: Message) -> bool:
        """Can the destination keep this message out of memory (a queue whose store pages, or a
        temp store for non-persistent messages)? Then memory does not bound its producers; the
        pending writes and the disk limits do."""
        if destination.kind is not DestinationKind.QUEUE:
            return False
        if message.persistent:
            return self.broker.store_pages
        return self.broker.temp_store is not None

    def _resume_memory(self) -> None:
        self._waiting_on.clear()
        if not self.closed:
            self.link.resume_producer(FlowReason.MEMORY)

    # -- consuming ------------------------------------------------------------------------------

    def subscribe(
        self,
        sub_id: str,
        destination_name: str,
        ack_mode: AckMode,
        options: SubscribeOptions = _NO_OPTIONS,
    ) -> Subscription | None:
        """Start a subscription (a durable one with `options.durable_name`; a topic cursor at
        `options.offset`; a wildcard topic pattern attaches to every matching topic, returning
        None)."""
        self._check_new_subscription(sub_id)
        selector = _compile(options.selector)
        if destination_name.startswith(TOPIC_PREFIX) and is_wildcard(
            destination_name[len(TOPIC_PREFIX) :]
        ):
            if options.durable_name is not None or options.offset is not None:
                raise RequestError(
                    "a wildcard subscription cannot be durable or start at an x-offset"
                )
            self._check_name(destination_name)
            pattern = destination_name[len(TOPIC_PREFIX) :]
            self._subscribe_wildcard(sub_id, pattern, ack_mode, options, selector)
            return None
        destination = self._destination(destination_name)
        durable_name = options.durable_name
        if (durable_name is not None or options.offset is not None) and not isinstance(
            destination, Topic
        ):
            raise RequestError(
                "activemq.subscriptionName and x-offset apply to topics, not to " + destination_name
            )
        if durable_name is not None and self.client_id is None:
            raise RequestError("a durable subscription needs a client-id header on CONNECT")
        sub = Subscription(
            self.link,
            sub_id,
            destination,
            ack_mode,
            _prefetch(destination, options),
            options.prefetch_bytes,
            selector=selector,
            exclusive=options.exclusive,
            max_open_groups=options.max_open_groups,
            durable_name=durable_name,
            client_id=self.client_id,
            tags=self.tags,
            connection_id=self.id,
        )
        if not isinstance(destination, Topic):
            destination.add_subscription(sub)
        elif durable_name is not None:
            assert self.client_id is not None
            text = options.selector if selector is not None else None
            destination.subscribe_durable(sub, self.client_id, durable_name, text, options.offset)
        else:
            destination.add_subscription(sub, options.offset)
        self.subs[sub_id] = sub
        return sub

    def _check_new_subscription(self, sub_id: str) -> None:
        if sub_id in self.subs or sub_id in self.wildcard_subs:
            raise RequestError(f"subscription id {sub_id!r} is already in use on this connection")
        limit = self.broker.limits.max_subscriptions_per_connection
        # A wildcard subscription counts as one, whatever number of topics it attaches to.
        if len(self.subs) + len(self.wildcard_subs) >= limit:
            self.broker.count("limit_max_subscriptions_per_connection")
            raise LimitExceeded("max_subscriptions_per_connection", limit)

    def _subscribe_wildcard(
        self,
        sub_id: str,
        pattern: str,
        ack_mode: AckMode,
        options: SubscribeOptions,
        selector: Selector | None,
    ) -> None:
        prefetch, prefetch_bytes = options.prefetch, options.prefetch_bytes

        def attach(topic: Topic) -> None:
            child = Subscription(
                self.link,
                sub_id,
                topic,
                ack_mode,
                prefetch if prefetch is not None else topic.policy.topic_prefetch,
                prefetch_bytes,
                selector=selector,
                client_id=self.client_id,
                tags=self.tags,
                connection_id=self.id,
            )
            child.link_data = wildcard.link_data
            wildcard.children.append(child)
            topic.add_subscription(child)

        try:
            wildcard = WildcardSubscription(pattern, attach)
        except WildcardError as exc:
            raise RequestError(str(exc)) from None
        self.wildcard_subs[sub_id] = wildcard
        self.broker.wildcards.add(pattern, wildcard)
        for destination in list(self.broker.destinations.values()):
            if isinstance(destination, Topic) and wildcard.pattern.matches(
                destination.name[len(TOPIC_PREFIX) :]
            ):
                attach(destination)

    def set_link_data(self, sub_id: str, data: bytes) -> None:
        """Store the link's per-subscription cache on a subscription (and wildcard children)."""
        sub = self.subs.get(sub_id)
        if sub is not None:
            sub.link_data = data
            return
        wildcard = self.wildcard_subs.get(sub_id)
        if wildcard is not None:
            wildcard.link_data = data
            for child in wildcard.children:
                child.link_data = data

    def unsubscribe(self, sub_id: str | None, durable_name: str | None = None) -> None:
        """End a subscription; its unacknowledged messages are redelivered to others. With
        `durable_name`, the durable subscription itself is deleted."""
        if sub_id is not None:
            wildcard = self.wildcard_subs.pop(sub_id, None)
            if wildcard is not None:
                self._drop_wildcard(wildcard)
                return
            sub = self.subs.pop(sub_id, None)
            if sub is None and durable_name is None:
                raise RequestError(f"no subscription with id {sub_id!r}")
            if sub is not None:
                topic = sub.destination
                self._drop_subscription(sub)
                if durable_name is not None and isinstance(topic, Topic):
                    assert self.client_id is not None
                    topic.delete_durable(self.client_id, durable_name)
                return
        if durable_name is None or self.client_id is None:
            raise RequestError("UNSUBSCRIBE needs an id (or a durable subscription name)")
        for destination in self.broker.destinations.values():
            if isinstance(destination, Topic) and (
                (self.client_id, durable_name) in destination.durables
            ):
                destination.delete_durable(self.client_id, durable_name)
                return
        raise RequestError(
            f"no durable subscription {durable_name!r} for client {self.client_id!r}"
        )

    def _drop_wildcard(self, wildcard: WildcardSubscription) -> None:
        self.broker.wildcards.remove(wildcard.pattern.text, wildcard)
        for child in wildcard.children:
            self._drop_subscription(child)
        wildcard.children.clear()

    def subscribed_names(self) -> list[str]:
        """The destinations this connection reads: one name per subscription, a wildcard one as
        its pattern (`/topic/orders.>`), which is how SUBSCRIBE named them when it was checked."""
        names = [sub.destination.name for sub in self.subs.values()]
        names.extend(TOPIC_PREFIX + wild.pattern.text for wild in self.wildcard_subs.values())
        return names

    def find_subscription_by_destination(self, destination: str) -> str | None:
        """The id of this connection's subscription to a destination (STOMP 1.0 UNSUBSCRIBE)."""
        for sub_id, sub in self.subs.items():
            if sub.destination.name == destination:
                return sub_id
        return None

    def _drop_subscription(self, sub: Subscription) -> None:
        deliveries = list(sub.inflight.items())
        for tag in sub.inflight:
            self.tags.pop(tag, None)
        sub.inflight.clear()
        sub.inflight_bytes = 0
        if deliveries:
            sub.destination.requeue(sub, deliveries, redelivered=True)
        sub.destination.remove_subscription(sub)

    # -- acknowledgements -----------------------------------------------------------------------

    def _take(self, sub: Subscription, tag: int) -> list[tuple[int, Message]]:
        inflight = sub.inflight
        if sub.ack_mode is AckMode.CLIENT:
            # Cumulative: everything delivered on this subscription up to and including `tag`.
            taken: list[tuple[int, Message]] = []
            for t in list(inflight):
                if t > tag:
                    break
                taken.append((t, inflight.pop(t)))
        else:
            taken = [(tag, inflight.pop(tag))]
        tags = self.tags
        released = 0
        for t, message in taken:
            tags.pop(t, None)
            released += message.nbytes
        sub.inflight_bytes -= released
        return taken

    def _lookup(self, tag: int) -> Subscription:
        sub = self.tags.get(tag)
        if sub is None or tag not in sub.inflight:
            raise RequestError(f"no message awaiting acknowledgement with ack id {tag}")
        return sub

    def ack(
        self,
        tag: int,
        txid: str | None = None,
        on_durable: Callable[[], None] | None = None,
    ) -> None:
        """Acknowledge a delivery (cumulatively for `client` subscriptions). `on_durable` runs
        once the acknowledgement is on disk (the removals written), or at COMMIT's write."""
        sub = self._lookup(tag)
        tx = self._tx(txid) if txid is not None else None
        taken = self._take(sub, tag)
        destination = sub.destination
        if tx is None:
            on_removed = None
            if on_durable is not None:
                remaining = len(taken)

                def on_removed(handle: WriteHandle | None) -> None:
                    nonlocal remaining
                    remaining -= 1
                    if remaining == 0:
                        on_durable()

            for t, message in taken:
                sub.inflight_counts.pop(t, None)
                destination.settle(sub, message, on_removed=on_removed)
            return
        store = self.broker.store
        for t, message in taken:
            tx.acks.append((sub, t, message))
            if message.in_store and destination.kind is DestinationKind.QUEUE:
                store.remove(destination.name, message.seq, None, tx.store_id)
        destination.wakeup()
        if on_durable is not None:
            on_durable()

    def nack(self, tag: int, txid: str | None = None) -> None:
        """Reject a delivery: it is redelivered, or dead-lettered past max_redeliveries."""
        sub = self._lookup(tag)
        if txid is not None:
            self._tx(txid)
        taken = self._take(sub, tag)
        sub.destination.requeue(sub, taken, redelivered=True)

    def tag_for_message_id(self, message_id: str, sub_id: str | None) -> int:
        """Find the delivery tag of a message (STOMP 1.0 and 1.1 acknowledge by message id)."""
        candidates = [
            sub
            for candidate_id, sub in self._all_subscriptions()
            if sub_id is None or candidate_id == sub_id
        ]
        if not candidates and sub_id is not None:
            raise RequestError(
                f"no subscription with id {sub_id!r} on this connection (the ACK or NACK for "
                f"message-id {message_id!r} names it)"
            )
        for sub in candidates:
            # Cumulative acks usually name the newest delivery, individual ones the oldest.
            order = reversed(sub.inflight) if sub.ack_mode is AckMode.CLIENT else iter(sub.inflight)
            for tag in order:
                if sub.inflight[tag].message_id == message_id:
                    return tag
        raise RequestError(f"no message awaiting acknowledgement with message-id {message_id!r}")

    def _all_subscriptions(self) -> list[tuple[str, Subscription]]:
        subs = list(self.subs.items())
        for sub_id, wildcard in self.wildcard_subs.items():
            subs.extend((sub_id, child) for child in wildcard.children)
        return subs

    # -- transactions ---------------------------------------------------------------------------

    def _tx(self, txid: str) -> Transaction:
        tx = self.txs.get(txid)
        if tx is None:
            raise RequestError(f"unknown transaction {txid!r}")
        return tx

    def begin(self, txid: str) -> None:
        """Start a transaction."""
        if txid in self.txs:
            raise RequestError(f"transaction {txid!r} is already open")
        limit = self.broker.limits.max_transactions_per_connection
        if len(self.txs) >= limit:
            self.broker.count("limit_max_transactions_per_connection")
            raise LimitExceeded("max_transactions_per_connection", limit)
        tx = Transaction(self.broker, txid, f"{self.id}:{txid}")
        self.txs[txid] = tx
        self.broker.store.begin(tx.store_id)

    def commit(
        self,
        txid: str,
        on_done: Callable[[], None],
        on_failed: Callable[[], None] | None = None,
    ) -> None:
        """Make the transaction's sends visible and its acks final; `on_done` once written, or
        `on_failed` if the store failed to write it (nothing of it then shows)."""
        tx = self._tx(txid)
        del self.txs[txid]
        tx.commit(on_done, on_failed)

    def abort(self, txid: str) -> None:
        """Drop the transaction's sends; its acknowledged messages are redelivered."""
        tx = self._tx(txid)
        del self.txs[txid]
        tx.rollback()

    # -- end ------------------------------------------------------------------------------------

    def close(self) -> None:
        """The connection ended: abort its transactions, redeliver what it had not acked."""
        if self.closed:
            return
        self.closed = True
        if self.open_streams and not self.broker.shutting_down:
            # A broker that stops cleanly leaves live streams open, as one that crashes does:
            # their producers continue after the restart, or the idle timeout ends them then.
            self.abort_streams("the producer disconnected mid-stream")
        for tx in list(self.txs.values()):
            tx.rollback()
        self.txs.clear()
        for sub in list(self.subs.values()):
            self._drop_subscription(sub)
        self.subs.clear()
        for wildcard in list(self.wildcard_subs.values()):
            self._drop_wildcard(wildcard)
        self.wildcard_subs.clear()
        self.producing.clear()
        self.broker.forget_producer(self, self._waiting_on)
        self._waiting_on.clear()
        self.broker.forget_creator(self.id)
