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
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice.config import DestinationPolicy
from sluice.core.destination import Destination, Services
from sluice.core.message import DestinationKind, Message
from sluice.core.queue import DELIVER_LIMIT
from sluice.core.subscription import Durable
from sluice.core.usage import Usage
from sluice.errors import RequestError
from sluice.store.api import RecoveredSubscription

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import WriteHandle

# Compact the log list once this many trimmed slots have accumulated at its head.
_COMPACT_AFTER = 4096
# Retention is tracked with coarse marks (sequence, time, bytes so far): one per MiB or second.
_RETENTION_MARK_BYTES = 1 << 20
_RETENTION_MARK_MS = 1000
# At most this many marks per topic: beyond it every other one is dropped (coarser, so keeping a
# little more, never less).
_MAX_RETENTION_MARKS = 10_000
# Read at most this much from the store into one subscription's backlog at a time.
_BACKLOG_MESSAGES = 256
_BACKLOG_BYTES = 4 << 20
# Remove from the store in steps of at least this many sequences.
_STORE_TRIM_STEP = 256
# The sweep looks at most this many messages of a topic's log for expiry at a time.
_EXPIRY_SCAN = 4096
# Expired messages already dead-lettered (by sequence), so that each goes to the DLQ once: at
# most this many are remembered per topic, the oldest forgotten first.
_MAX_EXPIRED_REMEMBERED = 100_000


class OffsetError(RequestError):
    """An `x-offset` header that is not `earliest`, `latest`, a number or `timestamp=MS`."""


class Topic(Destination):
    """A publish/subscribe destination."""

    kind = DestinationKind.TOPIC

    def __init__(
        self,
        services: Services,
        name: str,
        policy: DestinationPolicy,
        usage: Usage,
        *,
        concurrent_store_and_dispatch: bool,
        store_pages: bool,
    ) -> None:
        super().__init__(services, name, policy, usage)
        self.concurrent_store_and_dispatch = concurrent_store_and_dispatch
        self.store_pages = store_pages
        self._log: list[Message] = []
        self._head = 0  # index in _log of the oldest kept message
        self.base_seq = 1  # sequence of _log[_head]
        # Sequences of persistent messages still being written, oldest first.
        self._unwritten: deque[int] = deque()
        self.durables: dict[tuple[str, str], Durable] = {}
        self._stored_total = 0
        # (sequence, timestamp, bytes kept before it): one per MiB or second of the log.
        self._retention_marks: deque[tuple[int, int, int]] = deque()
        self._newest_ms = 0
        self._store_trimmed = 0
        # Sequences whose write or COMMIT failed: never delivered (few: the store then fails).
        self._withdrawn: set[int] = set()
        self._expired: OrderedDict[int, None] = OrderedDict()
        self._may_expire = False
        self._expiry_scan_seq = 0

    # -- the log --------------------------------------------------------------------------------

    @property
    def visible_seq(self) -> int:
        """Highest sequence subscribers may see."""
        if self._unwritten:
            return self._unwritten[0] - 1
        return self.last_seq

    @property
    def depth(self) -> int:
        """Messages kept in the log in memory."""
        return len(self._log) - self._head

    @property
    def keeps_messages(self) -> bool:
        """Does the topic keep messages beyond its active subscribers (durables, retention)?"""
        policy = self.policy
        return bool(self.durables or policy.retention_s or policy.retention_bytes)

    def _append(self, message: Message) -> None:
        if not self._log or self._head == len(self._log):
            self.base_seq = message.seq
        self._log.append(message)
        self.usage.add(message.nbytes)
        if message.expires_ms:
            self._may_expire = True
        if self.keeps_messages:
            before = self._stored_total
            self._stored_total = before + message.nbytes
            self._newest_ms = message.timestamp_ms
            marks = self._retention_marks
            if (
                not marks
                or before - marks[-1][2] >= _RETENTION_MARK_BYTES
                or message.timestamp_ms - marks[-1][1] >= _RETENTION_MARK_MS
            ):
                marks.append((message.seq, message.timestamp_ms, before))
                if len(marks) > _MAX_RETENTION_MARKS:
                    # Keep the oldest (it bounds what may go) and every second one after it.
                    thinned = list(marks)
                    self._retention_marks = marks = deque([thinned[0], *thinned[2::2]])

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

    def _written(self, seq: int) -> None:
        # Writes complete in the order they were made, so the oldest unwritten is usually this one.
        if self._unwritten and self._unwritten[0] == seq:
            self._unwritten.popleft()
        else:
            self._unwritten.remove(seq)
        self.wakeup()

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

    # -- offsets --------------------------------------------------------------------------------

    def earliest_seq(self) -> int:
        """The oldest sequence still kept, in memory or in the store."""
        candidates = [self.base_seq] if self.depth else []
        stored = self.store.first_seq(self.name)
        if stored:
            candidates.append(stored)
        return min(candidates) if candidates else self.last_seq + 1

    def offsets(self) -> tuple[int, int]:
        """(first, last): the oldest sequence kept and the newest subscribers may see, what a
        reader of the log (the Spark source) may ask for."""
        return self.earliest_seq(), self.visible_seq

    def resolve_offset(self, spec: str) -> int:
        """The first sequence a reader starting at `spec` gets."""
        spec = spec.strip()
        if spec == "earliest":
            return self.earliest_seq()
        if spec == "latest":
            return self.last_seq + 1
        if spec.startswith("timestamp="):
            try:
                at_ms = int(spec[len("timestamp=") :])
            except ValueError:
                raise OffsetError(f"x-offset {spec!r}: timestamp must be milliseconds") from None
            for i in range(self._head, len(self._log)):
                if self._log[i].timestamp_ms >= at_ms:
                    stored = self.store.first_seq(self.name, at_ms)
                    return min(stored, self._log[i].seq) if stored else self._log[i].seq
            stored = self.store.first_seq(self.name, at_ms)
            return stored if stored else self.last_seq + 1
        try:
            seq = int(spec)
        except ValueError:
            raise OffsetError(
                f"x-offset must be earliest, latest, a sequence number or timestamp=MS, "
                f"got {spec[:40]!r}"
            ) from None
        if seq < 0:
            raise OffsetError(f"x-offset must not be negative, got {seq}")
        return max(seq, 1)

    # -- trimming -------------------------------------------------------------------------------

    def _retention_floor(self) -> int:
        """Lowest sequence the retention may still keep (last_seq + 1 when it keeps nothing).

        Marks are coarse, so the floor is conservative: it may keep up to one mark's worth more."""
        policy = self.policy
        marks = self._retention_marks
        if not (policy.retention_s or policy.retention_bytes) or not marks:
            return self.last_seq + 1
        cutoff_ms = self.services.now_ms() - int(policy.retention_s * 1000)
        total = self._stored_total
        # Drop a mark when retention keeps nothing before its successor: neither by time (the
        # successor, and so everything before it, is older than the cutoff) nor by bytes (the
        # successor and what follows it make up the retained bytes).
        while len(marks) > 1:
            _seq, timestamp_ms, before = marks[1]
            # The messages of the first mark are no newer than the next mark, and less than a
            # mark's time apart from their first.
            newest_ms = min(timestamp_ms, marks[0][1] + _RETENTION_MARK_MS - 1)
            if (policy.retention_s and newest_ms >= cutoff_ms) or (
                policy.retention_bytes and total - before < policy.retention_bytes
            ):
                return marks[0][0]
            marks.popleft()
        if not policy.retention_bytes and self._newest_ms < cutoff_ms:
            # Even the newest message is past the time retention: nothing is kept.
            marks.clear()
            return self.last_seq + 1
        return marks[0][0]

    def _trim(self, *, sweeping: bool = False) -> None:
        """Drop from memory what nobody needs there, and from the store what nobody needs (in
        steps, or all of it when `sweeping`)."""
        last = self.last_seq + 1
        low_active = last
        for sub in self.subscriptions:
            position = sub.backlog[0].seq if sub.backlog else sub.next_seq
            if position < low_active:
                low_active = position
        # A durable subscription, active or not, holds what it has not acknowledged: if its
        # consumer leaves, the unacknowledged messages are delivered again.
        low_durable = last
        for durable in self.durables.values():
            after = durable.cursor + 1
            if after < low_durable:
                low_durable = after
        low_retention = self._retention_floor()
        low_unstored = min(low_durable, low_retention)

        log = self._log
        head = self._head
        end = len(log)
        released = 0
        store_pages = self.store_pages
        temp_store = self.services.temp_store
        while head < end:
            message = log[head]
            seq = message.seq
            if seq >= low_active:
                break
            if not (message.in_store and store_pages) and seq >= low_unstored:
                break
            released += message.nbytes
            if message.spooled and temp_store is not None:
                temp_store.remove(self.name, seq)  # a committed non-persistent message's body
            head += 1
        if head != self._head:
            self.base_seq = log[head].seq if head < end else last
            if head == end:
                self._may_expire = False
            if head >= _COMPACT_AFTER or head == end:
                del log[:head]
                head = 0
            self._head = head
            self.usage.release(released)

        low = min(low_active, low_durable, low_retention)
        store_upto = low - 1
        if store_upto > self._store_trimmed and (
            sweeping
            or store_upto - self._store_trimmed >= _STORE_TRIM_STEP
            or store_upto == self.last_seq
        ):
            self._store_trimmed = store_upto
            self.store.remove_range(self.name, store_upto)
        if self._withdrawn or self._expired:
            self._forget_below(min(low, self.base_seq if self.depth else low))

    def _forget_below(self, seq: int) -> None:
        """No cursor reads a sequence below `seq` again: forget what is remembered of it."""
        expired = self._expired
        while expired and next(iter(expired)) < seq:
            expired.popitem(last=False)
        if self._withdrawn:
            self._withdrawn = {s for s in self._withdrawn if s >= seq}

    # -- the sweep and expiry -------------------------------------------------------------------

    def sweep(self, now_ms: int) -> None:
        """Run by the broker's timer: dead-letter what expired in the log, and let go of what
        time retention no longer keeps, though nothing happens on the topic."""
        if self._may_expire and self.depth:
            self._expire_scan(now_ms)
        if self.policy.retention_s:
            self._trim(sweeping=True)

    def _expire_scan(self, now_ms: int) -> None:
        log = self._log
        start = max(self._expiry_scan_seq, self.base_seq)
        if start > self.visible_seq:
            start = self.base_seq
        end = min(start + _EXPIRY_SCAN, self.visible_seq + 1)
        offset = self._head - self.base_seq
        for seq in range(start, end):
            message = log[seq + offset]
            if message.expires_ms and not message.paged_out and message.expired(now_ms):
                self._expire(message)
        self._expiry_scan_seq = end

    def _expire(
        self,
        message: Message,
        on_stored: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """An expired message: to the DLQ once if persistent, else discarded."""
        seq = message.seq
        expired = self._expired
        if seq not in expired:
            expired[seq] = None
            if len(expired) > _MAX_EXPIRED_REMEMBERED:
                expired.popitem(last=False)
            if message.persistent:
                self.services.dead_letter(message, "expired", on_stored)
                return
            self.services.count("expired_discarded")
        if on_stored is not None:
            on_stored(None)

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
        have been delivered before the stop: it comes back marked redelivered."""
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
        if sub.durable is not None:
            self._advance_cursor(sub, sub.durable)
        self.wakeup()

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
        if sub.auto:
            sub.link.deliver(sub, message, 0, count)
            if sub.durable is not None:
                self._advance_cursor(sub, sub.durable)
            return
        tag = sub.tags.issue(sub)
        sub.inflight[tag] = message
        sub.inflight_bytes += message.nbytes
        if count > 1:
            sub.inflight_counts[tag] = count
        sub.link.deliver(sub, message, tag, count)
