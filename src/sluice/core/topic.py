"""A topic: publish/subscribe over a log.

Every message published gets the next sequence number and is appended to the topic's log in
memory. A subscription is a cursor (`next_seq`): a non-durable subscriber starts after the last
message published before it subscribed, or where its `x-offset` says. A durable subscription is a
cursor that outlives its consumers; while nobody consumes it, it holds what it has not acknowledged.

What is kept:
- in memory, a message stays while an active cursor has not passed it, and, unless the store holds
  it, while a durable cursor or the topic's retention needs it;
- in the store, a persistent message is written only if the topic keeps messages (it has durable
  subscriptions or a retention), and removed once every durable cursor has passed it and the
  retention lets it go. Cursors behind the in-memory log read from the store, a credit at a time.

Retention keeps a message for at least `retention_s` seconds and keeps at least the newest
`retention_bytes` bytes; a message goes when neither keeps it. The broker's sweep applies time
retention on a topic where nothing happens.

Transactions: a committed message whose body waits in the store (or, non-persistent, in the temp
store) takes its place in the log as a body-less stub; a cursor that reaches it reads the bodies
back, a credit's worth at a time, as it does for a durable cursor behind the log.

Expiry: a message past its `expires` time is never delivered. A persistent one goes to the
topic's dead-letter queue once (however many subscribers it had), when a cursor reaches it or the
sweep finds it in the log; a non-persistent one is discarded and counted, as in ActiveMQ.

While a persistent message is being written (concurrent store and dispatch off, the default for
topics) it is in the log but not visible: `visible_seq` stops short of the first unwritten message,
so subscribers see messages in sequence order and only once they are safe.

After a restart a topic numbers on from the highest of the sequences the store holds for it and
its durable cursors: messages the store never held used sequences too, and a cursor may stand
past them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice.core.dispatch import DELIVER_LIMIT
from sluice.core.message import DestinationKind, Message
from sluice.core.subscription import Durable
from sluice.core.topic_log import TopicLog
from sluice.core.views import DestinationView, DurableView
from sluice.errors import RequestError
from sluice.store.api import RecoveredSubscription

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import WriteHandle

# Read at most this much from the store into one subscription's backlog at a time.
_BACKLOG_MESSAGES = 256
_BACKLOG_BYTES = 4 << 20


class Topic(TopicLog):
    """A publish/subscribe destination."""

    kind = DestinationKind.TOPIC

    def accept(self, message: Message, on_stored: Callable[[WriteHandle | None], None]) -> None:
        """Append to the log; a persistent message the topic keeps is visible once written."""
        message.seq = self.next_seq()
        if not self.subscriptions and not self.keeps_messages:
            # Nobody could ever read it.
            self.base_seq = message.seq + 1
            on_stored(None)
            return
        self._append(message)
        if message.expires_ms and message.expired(self.services.now_ms()):
            # Expired on arrival: its offset stays a hole (it is never stored nor delivered),
            # and the producer is answered once its dead letter is safe.
            message.in_store = False
            self._expire(message, on_stored)
            self.wakeup()
            return
        if not (message.persistent and self.keeps_messages):
            message.in_store = False
            on_stored(None)
            self.wakeup()
            return
        message.in_store = True
        if self.concurrent_store_and_dispatch:
            self.store.add(message, on_stored)
            self.wakeup()
            return
        seq = message.seq
        self._unwritten.append(seq)

        def stored(handle: WriteHandle) -> None:
            self._written(seq)
            on_stored(handle)

        self.store.add(message, stored)

    def reserve_committed(self, message: Message) -> None:
        """A transaction commits a message here: it takes its place in the log, unseen until the
        commit is written."""
        message.seq = self.next_seq()
        message.in_store = message.persistent
        self._append(message)
        self._unwritten.append(message.seq)

    def publish_committed(self, message: Message) -> None:
        """The commit is written: the message becomes visible."""
        self._written(message.seq)

    def withdraw(self, message: Message) -> None:
        """Its write or its COMMIT failed: no cursor delivers it from now on."""
        seq = message.seq
        self._withdrawn.add(seq)
        if seq in self._unwritten:
            self._written(seq)

    # -- subscriptions --------------------------------------------------------------------------

    def add_subscription(self, sub: Subscription, offset: str | None = None) -> None:
        """Start a cursor: after what was already published, or at `offset`."""
        if offset is not None:
            sub.next_seq = self.resolve_offset(offset)
        elif sub.next_seq == 0:
            sub.next_seq = self.last_seq + 1
        super().add_subscription(sub)

    def subscribe_durable(
        self,
        sub: Subscription,
        client_id: str,
        name: str,
        selector: str | None,
        offset: str | None,
    ) -> None:
        """Attach a consumer to a durable subscription, creating it if new (or if its selector
        changed, as JMS does)."""
        key = (client_id, name)
        durable = self.durables.get(key)
        if durable is not None and durable.active is not None:
            raise RequestError(
                f"durable subscription {name!r} of client {client_id!r} already has a consumer"
            )
        if durable is not None and durable.selector != selector:
            self.delete_durable(client_id, name)
            durable = None
        if durable is None:
            start = self.resolve_offset(offset) if offset is not None else self.last_seq + 1
            durable = Durable(client_id, name, selector, start - 1, start - 1)
            self.durables[key] = durable
            self.store.put_subscription(
                RecoveredSubscription(client_id, name, self.name, selector, durable.cursor)
            )
        elif offset is not None:
            durable.cursor = self.resolve_offset(offset) - 1
        durable.active = sub
        sub.durable = durable
        sub.next_seq = durable.cursor + 1
        super().add_subscription(sub)

    def create_durable(self, client_id: str, name: str, selector: str | None) -> bool:
        """Create a durable subscription without a consumer (an operator's, from definitions):
        it keeps what is published from now on. False if it exists (left as it is)."""
        key = (client_id, name)
        if key in self.durables:
            return False
        cursor = self.last_seq
        self.durables[key] = Durable(client_id, name, selector, cursor, cursor)
        self.store.put_subscription(
            RecoveredSubscription(client_id, name, self.name, selector, cursor)
        )
        return True

    def restore_retention(self) -> None:
        """After a restart, keep what the store holds for at least another retention period:
        the exact times and sizes of the messages before the restart are not known here, and
        keeping a little longer is the safe side."""
        policy = self.policy
        if not (policy.retention_s or policy.retention_bytes):
            return
        first = self.store.first_seq(self.name)
        if first:
            self._newest_ms = self.services.now_ms()
            self._retention_marks.appendleft((first, self._newest_ms, 0))

    def restore_durable(self, recovered: RecoveredSubscription) -> None:
        """A durable subscription read back from the store. Whatever it had not acknowledged may
        have been delivered before the stop: it comes back marked redelivered.

        The store knows the sequences of what it holds, not of what it never held (messages
        published before the topic kept any, non-persistent ones), so its last sequence can be
        below the cursor: the topic numbers on from the cursor, or the cursor would skip what
        is published next."""
        if recovered.cursor > self.last_seq:
            self.last_seq = recovered.cursor
            if not self.depth:
                self.base_seq = self.last_seq + 1
        durable = Durable(
            recovered.client_id,
            recovered.name,
            recovered.selector,
            recovered.cursor,
            self.last_seq,
        )
        self.durables[(recovered.client_id, recovered.name)] = durable

    def delete_durable(self, client_id: str, name: str) -> None:
        """Remove a durable subscription and release what it held."""
        durable = self.durables.pop((client_id, name), None)
        if durable is None:
            raise RequestError(f"no durable subscription {name!r} for client {client_id!r}")
        self.store.delete_subscription(client_id, name)
        self._trim()

    def remove_subscription(self, sub: Subscription) -> None:
        """A subscriber left; a durable subscription keeps its cursor."""
        durable = sub.durable
        if durable is not None:
            durable.active = None
            durable.delivered_upto = max(durable.delivered_upto, sub.next_seq - 1)
            sub.durable = None
        sub.backlog.clear()
        super().remove_subscription(sub)
        self._trim()

    def settle(
        self,
        sub: Subscription,
        message: Message,
        *,
        store_removed: bool = False,
        on_removed: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """A subscriber acknowledged a message: its credit frees; a durable cursor advances (and
        is persisted with the next write or checkpoint, so `on_removed` runs at once)."""
        if on_removed is not None:
            on_removed(None)
        self.traffic.acked += 1
        durable = sub.durable
        if durable is not None:
            self._advance_cursor(sub, durable)
        self.wakeup()

    def _advance_cursor(self, sub: Subscription, durable: Durable) -> None:
        upto = (sub.backlog[0].seq if sub.backlog else sub.next_seq) - 1
        for message in sub.inflight.values():
            if message.seq <= upto:
                upto = message.seq - 1
        for message, _count in sub.redeliver:
            if message.seq <= upto:
                upto = message.seq - 1
        if upto > durable.cursor:
            durable.cursor = upto
            self.store.set_cursor(durable.client_id, durable.name, upto)

    def requeue(
        self, sub: Subscription, deliveries: list[tuple[int, Message]], *, redelivered: bool
    ) -> None:
        """NACKed messages go back to the front of this subscriber's cursor."""
        if sub not in self.subscriptions:
            return
        limit = self.policy.max_redeliveries
        for tag, message in deliveries:
            count = sub.inflight_counts.pop(tag, 1) + 1
            if redelivered and count > limit + 1:
                self.services.dead_letter(
                    message, f"delivered {count - 1} times (max_redeliveries={limit})"
                )
            else:
                sub.redeliver.append((message, count))
                if redelivered:
                    self.traffic.redelivered += 1
        if sub.durable is not None:
            self._advance_cursor(sub, sub.durable)
        self.wakeup()

    # -- what operators see ---------------------------------------------------------------------

    def view(self) -> DestinationView:
        """What an operator sees of it now: the log kept in memory, its subscribers."""
        traffic = self.traffic
        return DestinationView(
            name=self.name,
            kind=self.kind.value,
            messages_ready=self.depth,
            messages_in_flight=self._in_flight(),
            consumers=len(self.subscriptions),
            producers=self.producers,
            durable_subscriptions=len(self.durables),
            memory_bytes=self.usage.used,
            messages_paged=0,
            paged_bytes=0,
            messages_in=self.messages_in,
            delivered=traffic.delivered,
            acked=traffic.acked,
            redelivered=traffic.redelivered,
            dead_lettered=traffic.dead_lettered,
            expired=traffic.expired,
            last_seq=self.last_seq,
            dead_letter_queue=False,
        )

    def durable_views(self) -> list[DurableView]:
        """Its durable subscriptions, each with its cursor and how far behind it is."""
        return [
            DurableView(
                destination=self.name,
                client_id=durable.client_id,
                name=durable.name,
                selector=durable.selector,
                cursor=durable.cursor,
                lag=max(0, self.last_seq - durable.cursor),
                active=durable.active is not None,
            )
            for durable in self.durables.values()
        ]

    # -- dispatch -------------------------------------------------------------------------------

    def _load_backlog(self, sub: Subscription) -> None:
        """Read the next stored messages for a cursor behind the in-memory log."""
        before = self.base_seq if self.depth else self.visible_seq + 1
        stored = self.store.load(self.name, sub.next_seq - 1, _BACKLOG_MESSAGES, _BACKLOG_BYTES)
        loaded = [Message.from_stored(m) for m in stored if m.seq < before]
        if loaded:
            sub.backlog.extend(loaded)
            sub.next_seq = loaded[-1].seq + 1
        else:
            # Nothing older is kept: the cursor moves to the oldest message in memory.
            sub.next_seq = before

    def _load_committed(self, sub: Subscription, stub: Message, visible: int) -> None:
        """A cursor reached a committed message whose body is in the store (or the temp store):
        read it and the stubs that follow it from the same store into the cursor's backlog."""
        store = self.services.temp_store if stub.spooled else self.store
        seq = stub.seq
        loaded: list[Message] = []
        if store is not None:
            log = self._log
            offset = self._head - self.base_seq
            for item in store.load(self.name, seq - 1, _BACKLOG_MESSAGES, _BACKLOG_BYTES):
                expected = seq + len(loaded)
                if item.seq != expected or expected > visible or expected + offset >= len(log):
                    break
                entry = log[expected + offset]
                if not entry.paged_out or entry.spooled != stub.spooled:
                    break
                message = Message.from_stored(item)
                message.in_store = entry.in_store
                message.spooled = entry.spooled
                loaded.append(message)
        if loaded:
            sub.backlog.extend(loaded)
            sub.next_seq = loaded[-1].seq + 1
        else:
            sub.next_seq = seq + 1  # not in the store: its COMMIT failed

    def dispatch(self) -> None:
        """Advance every ready cursor through the visible log."""
        visible = self.visible_seq
        now_ms = self.services.now_ms()
        log = self._log
        withdrawn = self._withdrawn
        more = False
        for sub in self.subscriptions:
            budget = DELIVER_LIMIT
            durable = sub.durable
            while budget and sub.ready():
                if sub.redeliver:
                    message, count = sub.redeliver.pop(0)
                elif sub.backlog:
                    message = sub.backlog.pop(0)
                    count = 1
                else:
                    seq = sub.next_seq
                    if seq > visible:
                        break
                    if seq < self.base_seq or not self.depth:
                        self._load_backlog(sub)
                        continue
                    message = log[seq - self.base_seq + self._head]
                    if message.paged_out:
                        self._load_committed(sub, message, visible)
                        continue
                    sub.next_seq = seq + 1
                    count = 1
                if withdrawn and message.seq in withdrawn:
                    continue
                if message.expires_ms and message.expired(now_ms):
                    self._expire(message)
                    if durable is not None and not sub.inflight:
                        self._advance_cursor(sub, durable)
                    continue
                if sub.selector is not None and not sub.matches(message):
                    if durable is not None and not sub.inflight:
                        self._advance_cursor(sub, durable)
                    continue
                if count == 1 and durable is not None and message.seq <= durable.delivered_upto:
                    count = 2
                self._deliver(sub, message, count)
                budget -= 1
            if not budget:
                more = True
        self._trim()
        if more:
            self.wakeup()

    def _deliver(self, sub: Subscription, message: Message, count: int) -> None:
        traffic = self.traffic
        traffic.delivered += 1
        if sub.auto:
            traffic.acked += 1
            sub.link.deliver(sub, message, 0, count)
            if sub.durable is not None:
                self._advance_cursor(sub, sub.durable)
            return
        tags = sub.tags
        tag = tags.next_tag()
        tags[tag] = sub
        sub.inflight[tag] = message
        sub.inflight_bytes += message.nbytes
        if count > 1:
            sub.inflight_counts[tag] = count
        sub.link.deliver(sub, message, tag, count)
