"""A queue: point to point, FIFO within a priority, higher priority first.

Messages waiting for a consumer sit in `pending`, a sorted map keyed by priority then sequence, so
a message put back by NACK or by a leaving consumer returns to its place. A dispatch pass walks
`pending` from the front and gives each message to the next ready consumer in round-robin order,
unless an exclusive consumer, a message group or a selector decides otherwise. Messages that nobody
can take right now (their group's owner has no credit, no selector matches) are skipped, and a pass
looks at no more than `SCAN_LIMIT` messages so one pass never stalls the loop.

Paging: when the store keeps messages on disk, the queue holds only a window of them in memory.
Once the destination is over its memory limit, new persistent messages stay in the store alone, and
as consumers drain `pending`, the next page is read back (`_page_in`), at most what fits under the
limit. `loaded_seq` is the highest sequence brought into memory; everything above it waits in the
store. A page never reaches a sequence whose write has not completed (`_unwritten`): the store
shows a write at once, and a message kept in memory until its write completes (concurrent store
and dispatch off) would otherwise enter `pending` twice.

Evicted messages (`paging.Evicted`): what memory holds must be what consumers can take. A stored
message whose group nobody can take now (every consumer holds its `x-max-open-groups`), or that
comes after an evicted message of its group, is not kept in memory when a page is read, and is
dropped from memory when the queue is over its limit; so is, as a last resort, any stored message a
pass could not deliver. Evicted messages are read back by group, only when they can be dispatched:
the next ones of a group whose consumer has credit (no more than that credit), then groups nobody
holds that a consumer can take, oldest first. So the chunks a stream consumer waits for are never
hidden behind other streams' chunks, and streams that wait for a consumer wait on disk. A message
of a group is never dispatched before an evicted one of the same group. Acknowledged chunks of an
unfinished stream under the `restart` policy are kept the same way.

Streams (DESIGN.md section 7, `streams.StreamGroups`): a group whose messages are chunks is held by
its consumer until the stream ends, whatever `group_idle_timeout_s` says. When a consumer leaves in
the middle of a stream (it got chunks of it, not the end, whatever it had in flight), the
destination's `stream_policy` decides: `resume` (its unacknowledged chunks go back, and the next
chunk delivered carries the resume mark, `x-stream-resume:true`), `restart` (every chunk since the
start comes back, from chunk 0) or `discard` (the rest of the stream goes to the DLQ).

A dispatch pass decides a verdict per message; its limits, its verdicts and the dispatch marks
(what the store must know before a message is handed out) are in `dispatch.py`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from sluice.config import DestinationPolicy, StreamPolicy
from sluice.core.destination import Services
from sluice.core.dispatch import (
    DELIVER,
    DELIVER_LIMIT,
    DISCARD,
    EXPIRED,
    HOPELESS,
    SCAN_LIMIT,
    SKIP,
    STOP,
    WAIT,
    DispatchMarks,
    Pass,
    Verdict,
)
from sluice.core.message import STREAM_ID, DestinationKind, Message, closes_group
from sluice.core.paging import MAX_EVICTED, PAGE_MESSAGES, Evicted
from sluice.core.paging import pending_key as _key
from sluice.core.picking import QueuePicking
from sluice.core.streams import StreamGroups
from sluice.core.usage import Usage
from sluice.core.views import DestinationView

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import WriteHandle


class Queue(QueuePicking):
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
        # Sequences whose write has not completed yet, of messages left in the store alone (read
        # back after it) or kept in memory until it does (enqueued then): not read before.
        self._unwritten: deque[int] = deque()
        self.marks = DispatchMarks(services.store, name, self.wakeup, on=store_pages)
        # Recovered messages up to this sequence may have been delivered before the stop.
        self.recovered_mark = 0
        # The last sequence the store held at the start: chunks up to it belong to streams whose
        # producer has not been seen since (`_seen_stored`).
        self.recovered_seq = 0
        # Stored messages dropped from memory below `loaded_seq`.
        self._evicted = Evicted(MAX_EVICTED)
        # Messages above `loaded_seq` held by a store alone (written, or being written), and
        # their bytes: what paging has yet to read. Counted for operators, not for paging.
        self.stored_ahead = 0
        self.stored_ahead_bytes = 0
        # Unread messages an operator took (`picking.py`): paging passes over them.
        self._claimed: dict[int, bool] = {}
        # Evicted messages without a group are read back after an event that may let a consumer
        # take them (an ack, a consumer coming or going), not in a loop.
        self._retry_ungrouped = True
        # `restart` streams: the acknowledged chunks kept until the stream's end is acknowledged,
        # (seq, bytes, None) when the store can give them back, else with the message itself.
        self._retained: dict[str, list[tuple[int, int, Message | None]]] = {}
        self.max_groups = max_groups
        self.concurrent_store_and_dispatch = concurrent_store_and_dispatch
        self.is_dlq = is_dlq
        # group id -> owning subscription, least recently used first.
        self.groups: OrderedDict[str, Subscription] = OrderedDict()
        self.group_evictions = 0
        self.streams = StreamGroups(max_groups, services.count)
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
            self._note_stored_ahead(message.nbytes)

            def written(handle: WriteHandle) -> None:
                on_stored(handle)
                self._written(seq)

            self.store.add(message, written)
            return
        if self.concurrent_store_and_dispatch:
            self._enqueue(message)
            self.store.add(message, on_stored)
        else:
            # Enqueued once written; until then a page read must not take it from the store.
            seq = message.seq
            self._unwritten.append(seq)

            def stored(handle: WriteHandle) -> None:
                self._written(seq)
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
            self._note_stored_ahead(message.nbytes)

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
            self._note_stored_ahead(-message.nbytes)

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
        self._note_stored_ahead(message.nbytes)

    def _note_stored_ahead(self, nbytes: int) -> None:
        """A message above `loaded_seq` is left to a store alone (negative: no longer)."""
        self.stored_ahead += 1 if nbytes >= 0 else -1
        self.stored_ahead_bytes += nbytes

    def _written(self, seq: int) -> None:
        if self._unwritten and self._unwritten[0] == seq:
            self._unwritten.popleft()
        else:
            self._unwritten.remove(seq)
        self.wakeup()

    @property
    def depth(self) -> int:
        """Messages waiting for a consumer in memory (not counting those in flight)."""
        return len(self.pending)

    @property
    def messages_ready(self) -> int:
        """Waiting for a consumer: in memory, and in the store alone (paged)."""
        return len(self.pending) + len(self._evicted) + max(0, self.stored_ahead)

    def view(self) -> DestinationView:
        """What an operator sees of it now: ready messages in memory and in the store."""
        paged = len(self._evicted) + max(0, self.stored_ahead)
        traffic = self.traffic
        return DestinationView(
            name=self.name,
            kind=self.kind.value,
            messages_ready=self.messages_ready,
            messages_in_flight=self._in_flight(),
            consumers=len(self.subscriptions),
            producers=self.producers,
            durable_subscriptions=0,
            memory_bytes=self.usage.used,
            messages_paged=paged,
            paged_bytes=self._evicted.nbytes + max(0, self.stored_ahead_bytes),
            messages_in=self.messages_in,
            delivered=traffic.delivered,
            acked=traffic.acked,
            redelivered=traffic.redelivered,
            dead_lettered=traffic.dead_lettered,
            expired=traffic.expired,
            last_seq=self.last_seq,
            dead_letter_queue=self.is_dlq,
        )

    def in_use(self) -> str | None:
        """See `Destination.in_use`; besides, messages being written."""
        reason = super().in_use()
        if reason is None and self._unwritten:
            reason = "messages are being written"
        return reason

    def unused(self) -> bool:
        """See `Destination.unused`; besides, nothing left in a store (every message taken in
        was read: a queue recovered with messages, or paged out, stays)."""
        return (
            super().unused()
            and not self.pending
            and not self._unwritten
            and not self._evicted
            and not self._retained
            and self.loaded_seq >= self.last_seq
        )

    # -- consumers ------------------------------------------------------------------------------

    def add_subscription(self, sub: Subscription) -> None:
        """A consumer subscribed; an exclusive one takes over if none holds the queue."""
        if sub.exclusive and self.exclusive_owner is None:
            self.exclusive_owner = sub
        self._has_selectors = self._has_selectors or sub.selector is not None
        self._retry_ungrouped = True
        super().add_subscription(sub)

    def remove_subscription(self, sub: Subscription) -> None:
        """A consumer left: release its groups (applying the stream policy to streams it was in
        the middle of); the next exclusive consumer takes over."""
        policy = self.policy.stream_policy
        for group_id in sub.groups:
            if self.groups.get(group_id) is sub:
                del self.groups[group_id]
                self.streams.owner_left(group_id, policy)
            if policy is StreamPolicy.RESTART:
                # Every chunk since the start comes back: the next consumer starts at chunk 0.
                for seq, nbytes, kept in self._retained.pop(group_id, ()):
                    if kept is not None:
                        self.pending[_key(kept)] = kept
                    elif not self._evicted.add(seq, group_id, 1, nbytes):
                        self._load(seq, 1)
        sub.groups.clear()
        self._retry_ungrouped = True
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
        self._retry_ungrouped = True
        self.traffic.acked += 1
        if (
            group_id is not None
            and self.policy.stream_policy is StreamPolicy.RESTART
            and not store_removed
            and STREAM_ID in message.headers
        ):
            # Kept until the stream's end is acknowledged: a new consumer may need it again.
            retained = self._retained.setdefault(group_id, [])
            if closing:
                for seq, _nbytes, kept in retained:
                    if kept is None or kept.in_store:
                        self.store.remove(self.name, seq)
                    if kept is not None:
                        self.usage.release(kept.nbytes)
                del self._retained[group_id]
            else:
                if message.in_store and self.store_pages:
                    retained.append((message.seq, message.nbytes, None))
                    self.usage.release(message.nbytes)
                else:
                    retained.append((message.seq, message.nbytes, message))
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
                if redelivered:
                    self.traffic.redelivered += 1
        self._retry_ungrouped = True
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
        self.traffic.expired += len(expired)
        if expired:
            self.wakeup()  # what they held is free: read on
        return len(expired)

    # -- groups ---------------------------------------------------------------------------------

    def _close_group(self, group_id: str) -> None:
        owner = self.groups.pop(group_id, None)
        if owner is not None:
            owner.groups.pop(group_id, None)
        self.streams.closed(group_id)

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
            if not sub.fits(message) or not sub.matches(message):
                continue
            if best is None or len(sub.groups) < len(best.groups):
                best = sub
        if best is None:
            return None
        if len(self.groups) >= self.max_groups:
            # The map is bounded: forget the least recently used group (it will be reassigned),
            # never a stream in the middle (its next chunk would go to another consumer).
            streams = self.streams.owned
            victim = next((g for g in self.groups if g not in streams), None)
            if victim is None:
                self.services.count("limit_max_message_groups")
                return None
            self.groups.pop(victim).groups.pop(victim, None)
            self.group_evictions += 1
            self.services.count("message_group_evictions")
        self.groups[group_id] = best
        best.groups[group_id] = now_ms
        self.streams.assigned(group_id, message)
        return best

    def _release_idle_groups(self, sub: Subscription, now_ms: int) -> None:
        """Forget groups of `sub` idle past the policy's timeout with nothing in flight. A stream
        is never released in the middle: `stream_idle_timeout_s` governs dead producers."""
        timeout_ms = int(self.policy.group_idle_timeout_s * 1000)
        busy = {m.group_id for m in sub.inflight.values()}
        streams = self.streams.owned
        for group_id, last_ms in list(sub.groups.items()):
            if now_ms - last_ms >= timeout_ms and group_id not in busy and group_id not in streams:
                del sub.groups[group_id]
                if self.groups.get(group_id) is sub:
                    del self.groups[group_id]
                self.services.count("message_groups_idle_released")

    # -- dispatch -------------------------------------------------------------------------------

    def _choose(self, message: Message, ready: list[Subscription]) -> Subscription | None:
        """The consumer for this message. For a group's owner or an exclusive consumer, the
        caller checks that the message `fits` its credit (the next one must not overtake it)."""
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
            fits = not sub.prefetch_bytes or sub.fits(message)
            if fits and (sub.selector is None or sub.matches(message)):
                self._rr = (start + i + 1) % n
                return sub
        return None

    def dispatch(self) -> None:
        """One pass: give pending messages to ready consumers, a verdict per message, then
        carry out what the pass decided (`_finish_pass`)."""
        pending = self.pending
        if self._evicted or (self.store_pages and len(pending) < PAGE_MESSAGES // 2):
            self._page_in()
        if not pending or not self.subscriptions:
            return
        ready = [s for s in self.subscriptions if s.ready()]
        if not ready:
            return
        p = Pass(ready, self.services.now_ms())
        # A queue without selectors, exclusive consumer, evicted groups or discarded streams: a
        # message without group or expiry, within the dispatch marks, goes to whom round robin
        # picks, or nothing more can go (what `_verdict` decides for it, without the call).
        plain = not (
            self._has_selectors
            or self.exclusive_owner is not None
            or self._evicted
            or self.streams.discarded
        )
        marks = self.marks
        for scanned, (key, message) in enumerate(pending.items()):
            if scanned >= SCAN_LIMIT or p.delivered >= DELIVER_LIMIT or not ready:
                break
            if (
                plain
                and message.group_id is None
                and not message.expires_ms
                and message.seq <= marks.clear_to
            ):
                sub = self._choose(message, ready)
                verdict = DELIVER if sub is not None else STOP
            else:
                verdict, sub = self._verdict(message, p)
            if verdict is DELIVER:
                assert sub is not None
                p.taken.append(key)
                p.delivered += 1
                self._deliver(sub, message)
                if not sub.ready():
                    ready.remove(sub)
                    if self._rr >= len(ready):
                        self._rr = 0
            elif verdict is STOP:
                break
            elif verdict is EXPIRED:
                p.expired.append((key, message))
            elif verdict is DISCARD:
                p.discarded.append((key, message))
            elif verdict is HOPELESS:
                p.hopeless.append((key, message))
            elif verdict is SKIP:
                p.skipped.append((key, message))
        self._finish_pass(p)

    def _verdict(self, message: Message, p: Pass) -> tuple[Verdict, Subscription | None]:
        """What this pass does with `message` (and to whom it goes). Only messages in the store
        may be evicted, so a verdict to evict is WAIT for the others."""
        if message.expires_ms and message.expired(p.now_ms):
            return EXPIRED, None
        group_id = message.group_id
        discarding = self.streams.discarded
        if discarding and group_id in discarding:
            return DISCARD, None
        evicted = self._evicted
        if group_id is not None and evicted and evicted.blocks(group_id, message.seq):
            return (HOPELESS if message.in_store else WAIT), None
        seq = message.seq
        if seq > self.marks.clear_to and not self.marks.allows(seq):
            return WAIT, None
        if p.held and group_id in p.held:
            return (SKIP if message.in_store else WAIT), None
        sub = self._choose(message, p.ready)
        # Round robin chose among those it fits; a group's owner or an exclusive consumer was
        # chosen without looking at its credit.
        owned = group_id is not None or self.exclusive_owner is not None
        if sub is not None and owned and not sub.fits(message):
            # Not within its consumer's byte credit: nothing after it of its group (or of the
            # queue, for an exclusive consumer) may overtake it.
            if group_id is None or self.exclusive_owner is not None:
                return STOP, None
            p.held.add(group_id)
            sub = None
        if sub is not None:
            return DELIVER, sub
        if not (self._has_selectors or group_id is not None or self.exclusive_owner is not None):
            # Without selectors, groups or an exclusive owner, a message nobody takes means
            # nobody can take any.
            return STOP, None
        if not message.in_store:
            return WAIT, None
        if group_id is not None and self.exclusive_owner is None and group_id not in self.groups:
            return HOPELESS, None  # its group waits for a consumer with room for it
        return SKIP, None

    def _finish_pass(self, p: Pass) -> None:
        """Remove what was delivered, dead-letter what expired or was discarded, evict from
        memory what the pass could not deliver when memory is full, and go on if cut short."""
        pending = self.pending
        for key in p.taken:
            del pending[key]
        for key, message in p.expired:
            del pending[key]
            self._drop(message)
            self.services.dead_letter(message, "expired")
        self.traffic.expired += len(p.expired)
        for key, message in p.discarded:
            del pending[key]
            self._drop(message)
            self.services.dead_letter(
                message, "stream consumer died mid-stream (stream_policy=discard)"
            )
            if closes_group(message.headers) and message.group_id is not None:
                self.streams.closed(message.group_id)
        if p.expired or p.discarded:
            self.wakeup()  # what they held is free: read on
        if self.store_pages and self.usage.full and (p.hopeless or (p.skipped and not p.delivered)):
            # Memory is full: make room for what can go somewhere, dropping first what cannot
            # (and, if nothing could be delivered at all, whatever was not).
            self._evict_all(p.hopeless if p.delivered else p.hopeless + p.skipped)
        if p.delivered >= DELIVER_LIMIT and p.ready and pending:
            self.wakeup()

    def _deliver(self, sub: Subscription, message: Message) -> None:
        message.delivery_count += 1
        self.traffic.delivered += 1
        if self.streams.resuming:
            self.streams.mark_if_resuming(message)
        if sub.auto:
            sub.link.deliver(sub, message, 0, message.delivery_count)
            self.settle(sub, message)
            return
        tags = sub.tags
        tag = tags.next_tag()
        tags[tag] = sub
        sub.inflight[tag] = message
        sub.inflight_bytes += message.nbytes
        sub.link.deliver(sub, message, tag, message.delivery_count)
