"""What queues and topics share: identity, usage, the store, and coalesced dispatch.

Dispatch never runs inside the call that made it necessary. `wakeup()` schedules one `_dispatch`
for the next turn of the loop, however many sends, acks or drained transports asked for it, so a
burst of frames read in one chunk is dispatched in one pass and written in one batch.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sluice.config import DestinationPolicy
from sluice.core.message import DestinationKind, Message
from sluice.core.streams import OpenStreams
from sluice.core.usage import Usage
from sluice.core.views import (
    DestinationView,
    DurableView,
    MessageView,
    StreamReading,
    StreamView,
    Traffic,
)
from sluice.errors import RequestError, StoreOfflineError

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import MessageStore, WriteHandle

log = logging.getLogger(__name__)

# A dispatch pass the store could not serve (`StoreOfflineError`) runs again after this long.
STORE_RETRY_S = 0.5


class Services(Protocol):
    """The broker services a destination calls on (the `Broker` provides them)."""

    store: MessageStore

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the next turn of the loop."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run `callback` after `delay` seconds."""
        ...

    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch."""
        ...

    def dead_letter(
        self,
        message: Message,
        reason: str,
        on_stored: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """Move a message to its destination's dead-letter queue."""
        ...

    def count(self, metric: str, n: int = 1) -> None:
        """Add to a counter."""
        ...

    @property
    def temp_store(self) -> MessageStore | None:
        """Where non-persistent messages spool when memory is full (None: no spooling)."""
        ...

    def track_write(self, message: Message) -> None:
        """Count a write the store has not completed yet (bounded by the pending-write limits)."""
        ...

    def write_done(self, handle: WriteHandle) -> None:
        """A tracked write completed."""
        ...


class DedupWindow:
    """The most recent `x-dedup-id`s of a destination, oldest first, at most `size` of them."""

    __slots__ = ("_ids", "size")

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, dedup_id: str) -> bool:
        return dedup_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def discard(self, dedup_id: str) -> None:
        """Forget an id (its transaction's COMMIT failed: a retry is not a duplicate)."""
        self._ids.pop(dedup_id, None)

    def add(self, dedup_id: str) -> None:
        """Remember an id, forgetting the oldest beyond the window."""
        ids = self._ids
        ids[dedup_id] = None
        if len(ids) > self.size:
            ids.popitem(last=False)

    def extend(self, dedup_ids: list[str]) -> None:
        """Remember ids read back from the store, oldest first."""
        for dedup_id in dedup_ids:
            self.add(dedup_id)


class Destination:
    """A queue or a topic."""

    kind: DestinationKind

    def __init__(
        self, services: Services, name: str, policy: DestinationPolicy, usage: Usage
    ) -> None:
        self.services = services
        self.store = services.store
        self.name = name
        self.policy = policy
        self.usage = usage
        self.last_seq = 0
        self.subscriptions: list[Subscription] = []
        self.dedup = DedupWindow()
        # Live streams sent here whose end has not come (see `idle_streams`).
        self.open_streams = OpenStreams()
        self._scheduled = False
        self._stopped = False
        # The store could not be read by the last pass; a retry is pending (one at a time).
        self._store_unavailable = False
        self._retry_pending = False
        self._dispatch_cb = self._run_dispatch
        # Open transactions holding messages for this destination (it must not be removed).
        self.pins = 0
        # The connection that created it (its quota, `max_destinations_per_connection`); when
        # the broker first found it unused, and its `last_seq` then (see `Broker`).
        self.creator_id = 0
        self.unused_since_ms = 0
        self.unused_seq = 0
        # What it delivered, had acknowledged, redelivered and dead-lettered; what came in is
        # `last_seq` less the sequence it had when the broker started or created it.
        self.traffic = Traffic()
        self.counted_from_seq = 0
        # Connections open now that have sent to it (see `sluice.core.producers`).
        self.producers = 0

    # -- dispatch scheduling --------------------------------------------------------------------

    def wakeup(self) -> None:
        """Ask for a dispatch pass on the next turn of the loop (coalesced)."""
        if not self._scheduled and not self._stopped:
            self._scheduled = True
            self.services.call_soon(self._dispatch_cb)

    def stop(self) -> None:
        """The broker is closing its store: no dispatch pass runs from now on, not even one
        already scheduled (a pass reads the store)."""
        self._stopped = True

    def _run_dispatch(self) -> None:
        self._scheduled = False
        if self._stopped:
            return
        try:
            self.dispatch()
        except StoreOfflineError as exc:
            # The store cannot be read for now (its database restarts): what the pass did
            # stands, what it could not read stays in the store; the pass runs again later.
            if not self._store_unavailable:
                self._store_unavailable = True
                log.warning("%s: the store cannot be read (%s); dispatch retries", self.name, exc)
            self.services.count("store_read_retries")
            if not self._retry_pending:  # passes that fail meanwhile share it
                self._retry_pending = True
                self.services.call_later(STORE_RETRY_S, self._retry_dispatch)
            return
        if self._store_unavailable:
            self._store_unavailable = False
            log.info("%s: the store can be read again", self.name)

    def _retry_dispatch(self) -> None:
        self._retry_pending = False
        self.wakeup()

    def dispatch(self) -> None:
        """Hand messages to subscriptions with credit."""
        raise NotImplementedError

    # -- messages -------------------------------------------------------------------------------

    def next_seq(self) -> int:
        """Assign the next sequence number."""
        self.last_seq += 1
        return self.last_seq

    def accept(self, message: Message, on_stored: Callable[[WriteHandle | None], None]) -> None:
        """Take a message from a producer (sequence not yet assigned). `on_stored` runs once it
        is safe to tell the producer: written, cancelled by an early ACK, or not persistent."""
        raise NotImplementedError

    def reserve_committed(self, message: Message) -> None:
        """A transaction is committing a message here: assign its sequence and its place."""
        raise NotImplementedError

    def publish_committed(self, message: Message) -> None:
        """The transaction's commit is written: the message becomes visible."""
        raise NotImplementedError

    def withdraw(self, message: Message) -> None:
        """The message's write (or its transaction's COMMIT) failed: it must not be delivered
        from now on. A message already handed to a consumer stays with it."""
        raise NotImplementedError

    def settle(
        self,
        sub: Subscription,
        message: Message,
        *,
        store_removed: bool = False,
        on_removed: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """A delivered message was acknowledged. `on_removed` runs once its removal is durable
        (at once when there is nothing to write)."""
        raise NotImplementedError

    def requeue(
        self, sub: Subscription, deliveries: list[tuple[int, Message]], *, redelivered: bool
    ) -> None:
        """Delivered messages (tag, message) come back (NACK, or their consumer left), in
        delivery order."""
        raise NotImplementedError

    def add_subscription(self, sub: Subscription) -> None:
        """A consumer subscribed."""
        self.subscriptions.append(sub)
        self.wakeup()

    def remove_subscription(self, sub: Subscription) -> None:
        """A consumer left; its in-flight messages must already have been requeued."""
        if sub in self.subscriptions:
            self.subscriptions.remove(sub)
        self.wakeup()

    @property
    def depth(self) -> int:
        """Messages waiting for a consumer."""
        raise NotImplementedError

    @property
    def messages_in(self) -> int:
        """Messages that came in since the broker started (or created it)."""
        return self.last_seq - self.counted_from_seq

    @property
    def messages_ready(self) -> int:
        """What its view counts as ready (a queue adds what waits in a store alone)."""
        return self.depth

    @property
    def messages_in_flight(self) -> int:
        """Messages its consumers hold unacknowledged."""
        return self._in_flight()

    def view(self) -> DestinationView:
        """What an operator sees of it now."""
        raise NotImplementedError

    def durable_views(self) -> list[DurableView]:
        """Its durable subscriptions (a queue has none)."""
        return []

    def stream_views(self) -> list[StreamView]:
        """The streams being sent to it (a queue tells of their reading too)."""
        return [
            StreamView(
                self.name,
                stream_id,
                sending=True,
                producer_connected=connected,
                last_chunk_ms=last_ms,
                reading=StreamReading.NONE,
                reader_connection=None,
                reader_subscription=None,
                chunks_in_flight=0,
                delivered_chunk=None,
                resume_chunk=None,
                resume_offset=None,
            )
            for stream_id, last_ms, connected in self.open_streams.entries()
        ]

    def _in_flight(self) -> int:
        return sum(len(sub.inflight) for sub in self.subscriptions)

    def purge(self, upto_seq: int, max_messages: int) -> int:
        """Remove messages waiting for a consumer (a queue's; see `Queue.purge`)."""
        raise RequestError(f"{self.name} is not a queue: only queues can be purged")

    def browse(
        self,
        after_seq: int,
        limit: int,
        preview_bytes: int,
        matches: Callable[[Message], bool] | None = None,
        scan_limit: int = 0,
    ) -> tuple[list[MessageView], int | None]:
        """Messages after `after_seq`, without consuming them (a queue's; `Queue.browse`)."""
        raise RequestError(f"{self.name} is not a queue: only queues can be browsed")

    def in_use(self) -> str | None:
        """Why it may not be removed now (None: it may): consumers, open transactions holding
        its messages, live streams, writes in progress."""
        if self.subscriptions:
            return f"{len(self.subscriptions)} consumers are subscribed"
        if self.pins:
            return "open transactions hold messages for it"
        if self.open_streams:
            return "streams are being sent to it"
        return None

    def unused(self) -> bool:
        """Holds no message and serves nobody: no subscription, no live stream, no open
        transaction's message, no memory, nothing being written. Such a destination may be
        removed once idle (`limits.destination_idle_timeout_s`)."""
        return not (self.subscriptions or self.open_streams or self.pins or self.usage.used)

    # -- live streams ---------------------------------------------------------------------------

    def idle_streams(self, now_ms: int) -> list[str]:
        """Forget and return the live streams of which no chunk came within this destination's
        `stream_idle_timeout_s` (their producer is gone): the broker ends each with an abort
        marker."""
        timeout_ms = int(self.policy.stream_idle_timeout_s * 1000)
        return self.open_streams.idle(now_ms - timeout_ms, now_ms, self._holds_unread)

    def _holds_unread(self, stream_id: str) -> bool:
        """Are chunks of this recovered stream still to be read here (so it is not idle)?"""
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
