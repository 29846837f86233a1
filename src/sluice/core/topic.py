"""A topic: publish/subscribe over a log.

Every message published gets the next sequence number and is appended to the topic's log.
A subscription is a cursor (`next_seq`) into it: a non-durable subscriber starts after the last
message published before it subscribed. The log keeps a message while some cursor has not passed
it; `_trim` drops the prefix every cursor has passed. While a persistent message is being written
(concurrent store and dispatch off, the default for topics) it is in the log but not yet visible:
`visible_seq` stops short of the first unwritten message, so subscribers see messages in sequence
order and only once they are safe.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice.config import DestinationPolicy
from sluice.core.destination import Destination, Services
from sluice.core.message import DestinationKind, Message
from sluice.core.queue import DELIVER_LIMIT, next_tag
from sluice.core.usage import Usage

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import WriteHandle

# Compact the log list once this many trimmed slots have accumulated at its head.
_COMPACT_AFTER = 4096


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
    ) -> None:
        super().__init__(services, name, policy, usage)
        self.concurrent_store_and_dispatch = concurrent_store_and_dispatch
        self._log: list[Message] = []
        self._head = 0  # index in _log of the oldest kept message
        self.base_seq = 1  # sequence of _log[_head]
        # Sequences of persistent messages still being written, oldest first.
        self._unwritten: deque[int] = deque()

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

    def _append(self, message: Message) -> None:
        self._log.append(message)
        self.usage.add(message.nbytes)

    def accept(self, message: Message, on_stored: Callable[[WriteHandle | None], None]) -> None:
        """Append to the log; persistent messages become visible once written."""
        message.seq = self.next_seq()
        if (
            not self.subscriptions
            and not self.policy.retention_s
            and not self.policy.retention_bytes
        ):
            # Nobody would ever read it: a topic without subscribers or retention keeps nothing.
            self.base_seq = message.seq + 1
            on_stored(None)
            return
        self._append(message)
        if not message.persistent:
            on_stored(None)
            self.wakeup()
            return
        message.in_store = True
        if self.concurrent_store_and_dispatch:
            self.store.add(message, on_stored)
            self.wakeup()
            return
        self._unwritten.append(message.seq)

        def stored(handle: WriteHandle) -> None:
            # Writes complete in the order they were made, so the oldest unwritten is this one.
            if self._unwritten and self._unwritten[0] == message.seq:
                self._unwritten.popleft()
            else:
                self._unwritten.remove(message.seq)
            on_stored(handle)
            self.wakeup()

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
        if self._unwritten and self._unwritten[0] == message.seq:
            self._unwritten.popleft()
        else:
            self._unwritten.remove(message.seq)
        self.wakeup()

    def _trim(self) -> None:
        """Drop the prefix of the log that every cursor has passed."""
        low = self.last_seq + 1
        for sub in self.subscriptions:
            low = min(low, sub.next_seq)
        log = self._log
        head = self._head
        end = len(log)
        released = 0
        stored_upto = 0
        while head < end and log[head].seq < low:
            message = log[head]
            released += message.nbytes
            if message.in_store:
                stored_upto = message.seq
            head += 1
        if head == self._head:
            return
        self.base_seq = log[head].seq if head < end else low
        if head >= _COMPACT_AFTER or head == end:
            del log[:head]
            head = 0
        self._head = head
        self.usage.release(released)
        if stored_upto:
            self.store.remove_range(self.name, stored_upto)

    # -- consumers ------------------------------------------------------------------------------

    def add_subscription(self, sub: Subscription) -> None:
        """A non-durable subscriber starts after what was already published."""
        if sub.next_seq == 0:
            sub.next_seq = self.last_seq + 1
        super().add_subscription(sub)

    def remove_subscription(self, sub: Subscription) -> None:
        """A subscriber left: the log may shrink."""
        super().remove_subscription(sub)
        self._trim()

    def settle(self, sub: Subscription, message: Message, *, store_removed: bool = False) -> None:
        """A topic message was acknowledged by one subscriber: its credit frees."""
        self.wakeup()

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
        self.wakeup()

    # -- dispatch -------------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Advance every ready cursor through the visible log."""
        visible = self.visible_seq
        now_ms = self.services.now_ms()
        log = self._log
        more = False
        for sub in self.subscriptions:
            budget = DELIVER_LIMIT
            while sub.redeliver and budget and sub.ready():
                message, count = sub.redeliver.pop(0)
                self._deliver(sub, message, count)
                budget -= 1
            offset = self._head - self.base_seq
            while sub.next_seq <= visible and budget:
                if not sub.ready():
                    break
                seq = sub.next_seq
                if seq < self.base_seq:
                    # Older than what is kept: the cursor moves to the oldest kept message.
                    sub.next_seq = self.base_seq
                    continue
                message = log[seq + offset]
                sub.next_seq = seq + 1
                if message.expires_ms and message.expired(now_ms):
                    continue
                if sub.selector is not None and not sub.matches(message):
                    continue
                self._deliver(sub, message, 1)
                budget -= 1
            if not budget:
                more = True
        self._trim()
        if more:
            self.wakeup()

    def _deliver(self, sub: Subscription, message: Message, count: int) -> None:
        if sub.auto:
            sub.link.deliver(sub, message, 0, count)
            return
        tag = next_tag()
        sub.inflight[tag] = message
        sub.inflight_bytes += message.nbytes
        if count > 1:
            sub.inflight_counts[tag] = count
        sub.tags[tag] = sub
        sub.link.deliver(sub, message, tag, count)
