"""A queue: point to point, FIFO within a priority, higher priority first.

Messages waiting for a consumer sit in `pending`, a sorted map keyed by priority then sequence, so
a message put back by NACK or by a leaving consumer returns to its place. A dispatch pass walks
`pending` from the front and gives each message to the next ready consumer in round-robin order,
unless an exclusive consumer, a message group or a selector decides otherwise. Messages that nobody
can take right now (their group's owner has no credit, no selector matches) are skipped, and a pass
looks at no more than `SCAN_LIMIT` messages so one pass never stalls the loop.

Paging: when the store keeps messages on disk, the queue holds only a window of them in memory.
Once the destination is over its memory limit, new persistent messages stay in the store alone, and
as consumers drain `pending`, the next page is read back (`_page_in`). `loaded_seq` is the highest
sequence brought into memory; everything above it waits in the store.

Evicted messages: a message that waits in memory but cannot be dispatched (its group belongs to a
consumer without credit) while the queue is over its memory limit is dropped from memory and its
sequence remembered in `_evicted`; `_page_in` reads such messages back first, so a window full of
other streams' chunks never hides the chunks a consumer is waiting for. Acknowledged chunks of an
unfinished stream under the `restart` policy are kept the same way.

Streams (DESIGN.md section 7): when a consumer leaves with a stream open, the destination's
`stream_policy` decides: `resume` (its unacknowledged chunks go back and the next consumer continues
from the first of them), `restart` (every chunk since the start comes back, from chunk 0) or
`discard` (the stream's chunks go to the DLQ).

Dispatch marks: before a message is handed to a consumer, the store must know that messages up to
its sequence may have been delivered, so that after a crash they come back marked redelivered. The
queue asks for marks ahead of dispatch, `MARK_STEP` sequences at a time, and dispatches only up to
the last mark the store has confirmed.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from sluice.config import DestinationPolicy, StreamPolicy
from sluice.core.destination import Destination, Services
from sluice.core.message import STREAM_ID, DestinationKind, Message, closes_group
from sluice.core.usage import Usage

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import WriteHandle

# Messages one dispatch pass looks at, and delivers, before it yields the loop.
SCAN_LIMIT = 4096
DELIVER_LIMIT = 2048
# Paging: read this many messages (or bytes) from the store at a time, when fewer than half that
# many wait in memory.
PAGE_MESSAGES = 1000
PAGE_BYTES = 8 << 20
# Dispatch marks are written this many sequences ahead of dispatch.
MARK_STEP = 1000
# At most this many evicted sequences are remembered per queue; beyond it, messages that cannot
# be dispatched stay in memory and the queue's producers wait (flow control) instead.
MAX_EVICTED = 100_000

_PRIORITY_SHIFT = 44
# Without a store that survives restarts there is nothing to mark.
_NO_MARKS = 1 << 62

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
        store_pages: bool = False,
    ) -> None:
        super().__init__(services, name, policy, usage)
        self.pending: SortedDict = SortedDict()
        self.temp_store = services.temp_store
        self.store_pages = store_pages
        self.loaded_seq = 0
        # Sequences of messages left in the store alone whose write has not completed yet: they
        # cannot be read back before it does.
        self._unwritten: deque[int] = deque()
        self.mark_confirmed = 0 if store_pages else _NO_MARKS
        self._mark_requested = self.mark_confirmed
        # Recovered messages up to this sequence may have been delivered before the stop.
        self.recovered_mark = 0
        # Stored messages dropped from memory below `loaded_seq`: sequence -> delivery count.
        self._evicted: SortedDict = SortedDict()
        # `restart` streams: the acknowledged chunks kept until the stream's end is acknowledged,
        # by sequence when the store can give them back, else the messages themselves.
        self._retained: dict[str, list[tuple[int, Message | None]]] = {}
        # `discard` streams whose consumer died: their chunks go to the DLQ (bounded, oldest out).
        self._discarded: OrderedDict[str, None] = OrderedDict()
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
            if self.temp_store is not None and (
                self.loaded_seq < message.seq - 1 or self.usage.full
            ):
                self._spool(message)
            else:
                self._enqueue(message)
            on_stored(None)
            return
        message.in_store = True
        if self.store_pages and (self.loaded_seq < message.seq - 1 or self.usage.full):
            # Over the memory window, or behind messages still on disk: leave it there.
            seq = message.seq
            self._unwritten.append(seq)

            def written(handle: WriteHandle) -> None:
                on_stored(handle)
                self._written(seq)

            self.store.add(message, written)
            return
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
        if message.paged_out:
            # Its body is in the store only: paging must not pass it before the commit is written.
            self._unwritten.append(message.seq)

    def publish_committed(self, message: Message) -> None:
        """The commit is written: the message becomes available."""
        if message.paged_out:
            self._written(message.seq)  # read back from the store by `_page_in`
        else:
            self._enqueue(message)

    def withdraw(self, message: Message) -> None:
        """Its write or its COMMIT failed: take it back if no consumer has it yet."""
        key = _key(message)
        if self.pending.get(key) is message:
            del self.pending[key]
            self.usage.release(message.nbytes)
        elif message.paged_out and message.seq in self._unwritten:
            self._written(message.seq)  # reserved by the COMMIT; the store never made it visible

    def _enqueue(self, message: Message) -> None:
        if message.seq > self.loaded_seq:
            self.loaded_seq = message.seq
        self.pending[_key(message)] = message
        self.usage.add(message.nbytes)
        self.wakeup()

    def _spool(self, message: Message) -> None:
        """Memory is full: a non-persistent message waits in the temp store (never synced)."""
        assert self.temp_store is not None
        message.spooled = True
        seq = message.seq
        self._unwritten.append(seq)
        services = self.services

        def written(handle: WriteHandle) -> None:
            services.write_done(handle)
            self._written(seq)

        services.track_write(message)
        self.temp_store.add(message, written)
        services.count("spooled")

    def _written(self, seq: int) -> None:
        if self._unwritten and self._unwritten[0] == seq:
            self._unwritten.popleft()
        else:
            self._unwritten.remove(seq)
        self.wakeup()

    def _evict(self, key: int, message: Message) -> None:
        """Drop a stored message from memory; it is read back later by `_page_in`."""
        del self.pending[key]
        self.usage.release(message.nbytes)
        self._evicted[message.seq] = message.delivery_count
        self.services.count("evicted")

    def _reload_evicted(self) -> int:
        evicted = self._evicted
        loaded = 0
        while evicted and loaded < PAGE_MESSAGES and not self.usage.full:
            seq, count = evicted.popitem(0)
            stored = self.store.load(self.name, seq - 1, 1, PAGE_BYTES)
            if not stored or stored[0].seq != seq:
                continue  # acknowledged or removed meanwhile
            message = Message.from_stored(stored[0], count)
            self.pending[_key(message)] = message
            self.usage.add(message.nbytes)
            loaded += 1
        return loaded

    def _page_in(self) -> None:
        """Read stored messages back into memory: evicted ones first, then the next page."""
        if self.usage.full:
            return
        if self._evicted and self._reload_evicted():
            return
        limit = self._unwritten[0] - 1 if self._unwritten else self.last_seq
        if self.loaded_seq >= limit:
            return
        # The backlog may be in two stores: persistent messages in the store, spooled ones in
        # the temp store. Read a page from each and keep what lies below the point both reached.
        sources = [(self.store, False)]
        if self.temp_store is not None:
            sources.append((self.temp_store, True))
        pages = []
        cutoff = limit
        for store, spooled in sources:
            page = store.load(self.name, self.loaded_seq, PAGE_MESSAGES, PAGE_BYTES)
            if page and (
                len(page) >= PAGE_MESSAGES or sum(len(m.body) for m in page) > PAGE_BYTES // 2
            ):
                cutoff = min(cutoff, page[-1].seq)  # this store may hold more beyond the page
            pages.append((page, spooled))
        loaded = 0
        for page, spooled in pages:
            for item in page:
                if item.seq > cutoff:
                    break
                message = Message.from_stored(item, 1 if item.seq <= self.recovered_mark else 0)
                if spooled:
                    message.in_store = False
                    message.spooled = True
                self.pending[_key(message)] = message
                self.usage.add(message.nbytes)
                loaded += 1
        # Everything up to the cutoff is now in memory (or was acknowledged before it was read).
        self.loaded_seq = cutoff
        self.services.count("paged_in", loaded)

    def _request_mark(self, seq: int) -> None:
        target = seq + MARK_STEP
        self._mark_requested = target

        def confirmed(handle: WriteHandle) -> None:
            if target > self.mark_confirmed:
                self.mark_confirmed = target
            self.wakeup()

        # Completions run on the loop after this returns, so the callback is in place in time.
        self.store.mark_dispatched(self.name, target).on_complete = confirmed

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
        """A consumer left: release its groups (applying the stream policy to open streams); the
        next exclusive consumer takes over."""
        policy = self.policy.stream_policy
        for group_id in sub.groups:
            if self.groups.get(group_id) is sub:
                del self.groups[group_id]
            if policy is StreamPolicy.RESTART:
                # Every chunk since the start comes back: the next consumer starts at chunk 0.
                for seq, kept in self._retained.pop(group_id, ()):
                    if kept is None:
                        self._evicted[seq] = 1
                    else:
                        self.pending[_key(kept)] = kept
            elif policy is StreamPolicy.DISCARD and self._is_stream(group_id):
                self._discarded[group_id] = None
                if len(self._discarded) > self.max_groups:
                    self._discarded.popitem(last=False)
        sub.groups.clear()
        super().remove_subscription(sub)
        if self.exclusive_owner is sub:
            self.exclusive_owner = next((s for s in self.subscriptions if s.exclusive), None)
        self._has_selectors = any(s.selector is not None for s in self.subscriptions)

    def settle(
        self,
        sub: Subscription,
        message: Message,
        *,
        store_removed: bool = False,
        on_removed: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """An acknowledged message leaves the queue for good (`store_removed` when a committed
        transaction already removed it from the store)."""
        group_id = message.group_id
        closing = group_id is not None and closes_group(message.headers)
        if (
            group_id is not None
            and self.policy.stream_policy is StreamPolicy.RESTART
            and not store_removed
            and STREAM_ID in message.headers
        ):
            # Kept until the stream's end is acknowledged: a new consumer may need it again.
            retained = self._retained.setdefault(group_id, [])
            if closing:
                for seq, kept in retained:
                    if kept is None or kept.in_store:
                        self.store.remove(self.name, seq)
                    if kept is not None:
                        self.usage.release(kept.nbytes)
                del self._retained[group_id]
            else:
                if message.in_store and self.store_pages:
                    retained.append((message.seq, None))
                    self.usage.release(message.nbytes)
                else:
                    retained.append((message.seq, message))
                if on_removed is not None:
                    on_removed(None)
                self.wakeup()
                return
        if message.in_store and not store_removed:
            self.store.remove(self.name, message.seq, on_removed)
        else:
            if message.spooled and self.temp_store is not None:
                self.temp_store.remove(self.name, message.seq)
            if on_removed is not None:
                on_removed(None)
        self.usage.release(message.nbytes)
        if closing:
            assert group_id is not None
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
        elif message.spooled and self.temp_store is not None:
            self.temp_store.remove(self.name, message.seq)
        self.usage.release(message.nbytes)

    def expire(self, now_ms: int, limit: int = SCAN_LIMIT) -> int:
        """Move expired messages waiting in memory to the DLQ (at most `limit` looked at)."""
        expired = [
            (key, message)
            for key, message in itertools.islice(self.pending.items(), limit)
            if message.expires_ms and message.expired(now_ms)
        ]
        for key, message in expired:
            del self.pending[key]
            self._drop(message)
            self.services.dead_letter(message, "expired")
        return len(expired)

    # -- groups ---------------------------------------------------------------------------------

    def _is_stream(self, group_id: str) -> bool:
        return any(m.group_id == group_id and STREAM_ID in m.headers for m in self.pending.values())

    def _close_group(self, group_id: str) -> None:
        owner = self.groups.pop(group_id, None)
        if owner is not None:
            owner.groups.pop(group_id, None)

    def _assign_group(
        self, group_id: str, ready: list[Subscription], message: Message
    ) -> Subscription | None:
        best: Subscription | None = None
        now_ms = self.services.now_ms()
        for sub in ready:
            limit = sub.max_open_groups
            if limit and len(sub.groups) >= limit:
                self._release_idle_groups(sub, now_ms)
                if len(sub.groups) >= limit:
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
        best.groups[group_id] = self.services.now_ms()
        return best

    def _release_idle_groups(self, sub: Subscription, now_ms: int) -> None:
        """Forget groups of `sub` idle past the policy's timeout with nothing in flight."""
        timeout_ms = int(self.policy.group_idle_timeout_s * 1000)
        busy = {m.group_id for m in sub.inflight.values()}
        for group_id, last_ms in list(sub.groups.items()):
            if now_ms - last_ms >= timeout_ms and group_id not in busy:
                del sub.groups[group_id]
                if self.groups.get(group_id) is sub:
                    del self.groups[group_id]
                self.services.count("message_groups_idle_released")

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
                if sub not in ready:
                    return None
                sub.groups[group_id] = self.services.now_ms()
                return sub
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
        if (self.store_pages and len(pending) < PAGE_MESSAGES // 2) or self._evicted:
            self._page_in()
        if not pending or not self.subscriptions:
            return
        ready = [s for s in self.subscriptions if s.ready()]
        if not ready:
            return
        now_ms = self.services.now_ms()
        taken: list[int] = []
        expired: list[tuple[int, Message]] = []
        discarded: list[tuple[int, Message]] = []
        skipped: list[tuple[int, Message]] = []
        # Without selectors, groups or an exclusive owner, a message nobody takes means nobody
        # can take any: stop at the first refusal.
        delivered = 0
        for scanned, (key, message) in enumerate(pending.items()):
            if scanned >= SCAN_LIMIT or delivered >= DELIVER_LIMIT or not ready:
                break
            if message.expires_ms and message.expired(now_ms):
                expired.append((key, message))
                continue
            if self._discarded and message.group_id in self._discarded:
                discarded.append((key, message))
                continue
            if message.seq > self.mark_confirmed:
                # The store must know this message may be delivered before it is.
                if self._mark_requested < message.seq:
                    self._request_mark(message.seq)
                continue
            if (
                self._mark_requested <= self.mark_confirmed
                and message.seq > self.mark_confirmed - MARK_STEP // 2
            ):
                # Ask for the next mark before this one runs out.
                self._request_mark(self.mark_confirmed)
            sub = self._choose(message, ready)
            if sub is None:
                if message.in_store:
                    skipped.append((key, message))
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
        for key, message in discarded:
            del pending[key]
            self._drop(message)
            self.services.dead_letter(
                message, "stream consumer died mid-stream (stream_policy=discard)"
            )
            if closes_group(message.headers) and message.group_id is not None:
                self._discarded.pop(message.group_id, None)
        if not delivered and skipped and self.usage.full and self.store_pages:
            # Nothing here can go anywhere and memory is full: make room for what can.
            room = MAX_EVICTED - len(self._evicted)
            if room < len(skipped):
                self.services.count("limit_max_evicted")
            for key, message in skipped[: max(room, 0)]:
                self._evict(key, message)
            if room > 0:
                self.wakeup()
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
