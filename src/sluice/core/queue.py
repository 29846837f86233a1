"""A queue: point to point, FIFO within a priority, higher priority first.

Messages waiting for a consumer sit in `pending`, a sorted map keyed by priority then sequence, so
a message put back by NACK or by a leaving consumer returns to its place. A dispatch pass walks
`pending` from the front and gives each message to the next ready consumer in round-robin order,
unless an exclusive consumer, a message group or a selector decides otherwise. Messages that nobody
can take right now (their group's owner has no credit, no selector matches) are skipped, and a pass
looks at no more than `SCAN_LIMIT` messages so one pass never stalls the loop.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from sluice.config import DestinationPolicy
from sluice.core.destination import Destination, Services
from sluice.core.message import GROUP_SEQ, DestinationKind, Message
from sluice.core.usage import Usage

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import WriteHandle

# Messages one dispatch pass looks at, and delivers, before it yields the loop.
SCAN_LIMIT = 4096
DELIVER_LIMIT = 2048

_PRIORITY_SHIFT = 44

_tags = itertools.count(1)


def next_tag() -> int:
    """A broker-wide unique delivery tag."""
    return next(_tags)


def _key(message: Message) -> int:
    # Higher priority sorts first; within a priority, lower sequence first.
    return ((9 - message.priority) << _PRIORITY_SHIFT) | message.seq


class Queue(Destination):
    """A point-to-point destination."""

    kind = DestinationKind.QUEUE

    def __init__(
        self,
        services: Services,
        name: str,
        policy: DestinationPolicy,
        usage: Usage,
        *,
        max_groups: int,
        concurrent_store_and_dispatch: bool,
        is_dlq: bool = False,
    ) -> None:
        super().__init__(services, name, policy, usage)
        self.pending: SortedDict = SortedDict()
        self.max_groups = max_groups
        self.concurrent_store_and_dispatch = concurrent_store_and_dispatch
        self.is_dlq = is_dlq
        # group id -> owning subscription, least recently used first.
        self.groups: OrderedDict[str, Subscription] = OrderedDict()
        self.group_evictions = 0
        self.exclusive_owner: Subscription | None = None
        self._rr = 0
        self._has_selectors = False

    # -- producers ------------------------------------------------------------------------------

    def accept(self, message: Message, on_stored: Callable[[WriteHandle | None], None]) -> None:
        """Assign the next sequence, store if persistent, and make it available."""
        message.seq = self.next_seq()
        if not message.persistent:
            self._enqueue(message)
            on_stored(None)
            return
        message.in_store = True
        if self.concurrent_store_and_dispatch:
            self._enqueue(message)
            self.store.add(message, on_stored)
        else:

            def stored(handle: WriteHandle) -> None:
                self._enqueue(message)
                on_stored(handle)

            self.store.add(message, stored)

    def reserve_committed(self, message: Message) -> None:
        """A transaction commits a message here: assign its sequence (visible once written)."""
        message.seq = self.next_seq()
        message.in_store = message.persistent

    def publish_committed(self, message: Message) -> None:
        """The commit is written: the message becomes available."""
        self._enqueue(message)

    def _enqueue(self, message: Message) -> None:
        self.pending[_key(message)] = message
        self.usage.add(message.nbytes)
        self.wakeup()

    @property
    def depth(self) -> int:
        """Messages waiting for a consumer (not counting those in flight)."""
        return len(self.pending)

    # -- consumers ------------------------------------------------------------------------------

    def add_subscription(self, sub: Subscription) -> None:
        """A consumer subscribed; an exclusive one takes over if none holds the queue."""
        if sub.exclusive and self.exclusive_owner is None:
            self.exclusive_owner = sub
        self._has_selectors = self._has_selectors or sub.selector is not None
        super().add_subscription(sub)

    def remove_subscription(self, sub: Subscription) -> None:
        """A consumer left: release its groups; the next exclusive consumer takes over."""
        for group_id in sub.groups:
            if self.groups.get(group_id) is sub:
                del self.groups[group_id]
        sub.groups.clear()
        super().remove_subscription(sub)
        if self.exclusive_owner is sub:
            self.exclusive_owner = next((s for s in self.subscriptions if s.exclusive), None)
        self._has_selectors = any(s.selector is not None for s in self.subscriptions)

    def settle(self, sub: Subscription, message: Message, *, store_removed: bool = False) -> None:
        """An acknowledged message leaves the queue for good (`store_removed` when a committed
        transaction already removed it from the store)."""
        if message.in_store and not store_removed:
            self.store.remove(self.name, message.seq)
        self.usage.release(message.nbytes)
        group_id = message.group_id
        if group_id is not None and message.headers.get(GROUP_SEQ) == "-1":
            self._close_group(group_id)
        self.wakeup()

    def requeue(
        self, sub: Subscription, deliveries: list[tuple[int, Message]], *, redelivered: bool
    ) -> None:
        """Put messages back at their place, or dead-letter those past `max_redeliveries`."""
        limit = self.policy.max_redeliveries
        for _tag, message in deliveries:
            if redelivered and not self.is_dlq and message.delivery_count > limit:
                self._drop(message)
                self.services.dead_letter(
                    message, f"delivered {message.delivery_count} times (max_redeliveries={limit})"
                )
            else:
                self.pending[_key(message)] = message
        self.wakeup()

    def _drop(self, message: Message) -> None:
        if message.in_store:
            self.store.remove(self.name, message.seq)
        self.usage.release(message.nbytes)

    # -- groups ---------------------------------------------------------------------------------

    def _close_group(self, group_id: str) -> None:
        owner = self.groups.pop(group_id, None)
        if owner is not None:
            owner.groups.pop(group_id, None)

    def _assign_group(
        self, group_id: str, ready: list[Subscription], message: Message
    ) -> Subscription | None:
        best: Subscription | None = None
        for sub in ready:
            limit = sub.max_open_groups
            if limit and len(sub.groups) >= limit:
                continue
            if not sub.matches(message):
                continue
            if best is None or len(sub.groups) < len(best.groups):
                best = sub
        if best is None:
            return None
        if len(self.groups) >= self.max_groups:
            # The map is bounded: forget the least recently used group (it will be reassigned).
            evicted_id, evicted_owner = self.groups.popitem(last=False)
            evicted_owner.groups.pop(evicted_id, None)
            self.group_evictions += 1
            self.services.count("message_group_evictions")
        self.groups[group_id] = best
        best.groups[group_id] = 1
        return best

    # -- dispatch -------------------------------------------------------------------------------

    def _choose(self, message: Message, ready: list[Subscription]) -> Subscription | None:
        owner = self.exclusive_owner
        if owner is not None:
            return owner if owner in ready and owner.matches(message) else None
        group_id = message.group_id
        if group_id is not None:
            sub = self.groups.get(group_id)
            if sub is not None:
                self.groups.move_to_end(group_id)
                return sub if sub in ready else None
            return self._assign_group(group_id, ready, message)
        n = len(ready)
        start = self._rr
        for i in range(n):
            sub = ready[(start + i) % n]
            if sub.selector is None or sub.matches(message):
                self._rr = (start + i + 1) % n
                return sub
        return None

    def dispatch(self) -> None:
        """One pass: give pending messages to ready consumers."""
        pending = self.pending
        if not pending or not self.subscriptions:
            return
        ready = [s for s in self.subscriptions if s.ready()]
        if not ready:
            return
        now_ms = self.services.now_ms()
        taken: list[int] = []
        expired: list[tuple[int, Message]] = []
        # Without selectors, groups or an exclusive owner, a message nobody takes means nobody
        # can take any: stop at the first refusal.
        delivered = 0
        for scanned, (key, message) in enumerate(pending.items()):
            if scanned >= SCAN_LIMIT or delivered >= DELIVER_LIMIT or not ready:
                break
            if message.expires_ms and message.expired(now_ms):
                expired.append((key, message))
                continue
            sub = self._choose(message, ready)
            if sub is None:
                if (
                    self._has_selectors
                    or message.group_id is not None
                    or self.exclusive_owner is not None
                ):
                    continue
                break
            taken.append(key)
            delivered += 1
            self._deliver(sub, message)
            if not sub.ready():
                ready.remove(sub)
                if self._rr >= len(ready):
                    self._rr = 0
        for key in taken:
            del pending[key]
        for key, message in expired:
            del pending[key]
            self._drop(message)
            self.services.dead_letter(message, "expired")
        if delivered >= DELIVER_LIMIT and ready and pending:
            self.wakeup()

    def _deliver(self, sub: Subscription, message: Message) -> None:
        message.delivery_count += 1
        if sub.auto:
            sub.link.deliver(sub, message, 0, message.delivery_count)
            self.settle(sub, message)
            return
        tag = next(_tags)
        sub.inflight[tag] = message
        sub.inflight_bytes += message.nbytes
        sub.tags[tag] = sub
        sub.link.deliver(sub, message, tag, message.delivery_count)
