"""How a queue pages: what it reads back from the store, and when (`QueuePaging`), and the
stored messages it dropped from memory (`Evicted`, indexed by message group).

A queue over its memory limit drops from memory the stored messages that cannot be dispatched now
(their group belongs to a consumer without credit, or no consumer can take another group) and reads
them back when they can be. To choose what to read back without reading it, each entry keeps the
message's delivery count and its size in bytes, and entries are indexed by group: the next messages
of the group a consumer owns are found at once, however many messages of other groups wait before
them, and groups nobody owns are taken in the order their first message arrived.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from sluice.core.destination import Destination
from sluice.core.message import STREAM_ID, Message, closes_group
from sluice.core.streams import StreamGroups

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import MessageStore

# Read this many messages (or bytes, and never beyond the memory limit) from the store at a time,
# when fewer than half that many wait in memory.
PAGE_MESSAGES = 1000
PAGE_BYTES = 8 << 20
# At most this many evicted messages are remembered per queue; beyond it, messages that cannot be
# dispatched stay in memory and paging stops once memory is full.
MAX_EVICTED = 100_000

_PRIORITY_SHIFT = 44


def pending_key(message: Message) -> int:
    """A message's place in a queue: higher priority first; within a priority, lower sequence
    first."""
    return ((9 - message.priority) << _PRIORITY_SHIFT) | message.seq


_key = pending_key


def pending_after(pending: SortedDict, after_seq: int, max_count: int) -> list[Message]:
    """The first `max_count` messages of `pending` after `after_seq`, by sequence (each
    priority's messages are in sequence order: take the first of each, then merge)."""
    top = (1 << _PRIORITY_SHIFT) - 1
    found: list[Message] = []
    for priority in range(10):
        base = (9 - priority) << _PRIORITY_SHIFT
        keys = pending.irange(base | (after_seq + 1), base | top)
        for count, key in enumerate(keys):
            if count >= max_count:
                break
            found.append(pending[key])
    found.sort(key=lambda m: m.seq)
    return found[:max_count]


def _credit(sub: Subscription) -> tuple[int, int]:
    """What a subscription may still be sent: messages and bytes (a page's worth if unbounded)."""
    if sub.auto:
        return PAGE_MESSAGES, PAGE_BYTES
    messages = sub.prefetch - len(sub.inflight)
    nbytes = sub.prefetch_bytes - sub.inflight_bytes if sub.prefetch_bytes else PAGE_BYTES
    return max(messages, 0), max(nbytes, 0)


class Evicted:
    """Evicted messages of one queue: (seq, delivery count, bytes) per group (None for messages
    without a group), in sequence order, at most `limit` in all."""

    __slots__ = ("_firsts", "_groups", "_size", "limit", "nbytes")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # group -> [(seq, delivery count, bytes)], ascending (most are added in order).
        self._groups: dict[str | None, list[tuple[int, int, int]]] = {}
        # The lowest evicted sequence of each named group -> the group.
        self._firsts: SortedDict = SortedDict()
        self._size = 0
        # The bytes of the messages remembered.
        self.nbytes = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def add(self, seq: int, group_id: str | None, delivery_count: int, nbytes: int) -> bool:
        """Remember an evicted message; False (nothing remembered) when the index is full."""
        if self._size >= self.limit:
            return False
        entry = (seq, delivery_count, nbytes)
        entries = self._groups.setdefault(group_id, [])
        if entries and seq > entries[-1][0]:
            entries.append(entry)
        else:
            at = bisect.bisect_left(entries, (seq,))
            if at < len(entries) and entries[at][0] == seq:
                return True
            entries.insert(at, entry)
            if at == 0 and group_id is not None:
                if len(entries) > 1:
                    del self._firsts[entries[1][0]]
                self._firsts[seq] = group_id
        self._size += 1
        self.nbytes += nbytes
        return True

    def has(self, group_id: str | None) -> bool:
        """Are messages of this group (None: without a group) evicted?"""
        return group_id in self._groups

    def blocks(self, group_id: str, seq: int) -> bool:
        """Is a message of `group_id` before `seq` evicted (so `seq` must wait for it)?"""
        entries = self._groups.get(group_id)
        return entries is not None and entries[0][0] < seq

    def first(self, group_id: str | None) -> tuple[int, int, int] | None:
        """(seq, delivery count, bytes) of the group's lowest evicted message."""
        entries = self._groups.get(group_id)
        return entries[0] if entries is not None else None

    def pop_first(self, group_id: str | None) -> None:
        """Forget the group's lowest evicted message (it is being read back)."""
        entries = self._groups[group_id]
        seq, _count, nbytes = entries.pop(0)
        self._size -= 1
        self.nbytes -= nbytes
        if group_id is not None:
            del self._firsts[seq]
            if entries:
                self._firsts[entries[0][0]] = group_id
        if not entries:
            del self._groups[group_id]

    def find(self, seq: int, group_id: str | None) -> tuple[int, int] | None:
        """(delivery count, bytes) of an evicted message of this group; None if it is not."""
        entries = self._groups.get(group_id)
        if entries is None:
            return None
        at = bisect.bisect_left(entries, (seq,))
        if at < len(entries) and entries[at][0] == seq:
            return entries[at][1], entries[at][2]
        return None

    def remove(self, seq: int, group_id: str | None) -> bool:
        """Forget one evicted message (an operator took it); False if it was not here."""
        entries = self._groups.get(group_id)
        if entries is None:
            return False
        at = bisect.bisect_left(entries, (seq,))
        if at == len(entries) or entries[at][0] != seq:
            return False
        if at == 0:
            self.pop_first(group_id)
            return True
        _seq, _count, nbytes = entries.pop(at)
        self._size -= 1
        self.nbytes -= nbytes
        return True

    def take_all(self) -> list[int]:
        """Forget every message remembered (a purge); returns their sequences."""
        seqs = [entry[0] for entries in self._groups.values() for entry in entries]
        self._groups.clear()
        self._firsts.clear()
        self._size = 0
        self.nbytes = 0
        return seqs

    def lowest(self) -> tuple[int, str | None] | None:
        """(seq, group) of the lowest evicted sequence of all; None when empty."""
        best: tuple[int, str | None] | None = None
        ungrouped = self._groups.get(None)
        if ungrouped is not None:
            best = (ungrouped[0][0], None)
        if self._firsts:
            seq, group_id = self._firsts.peekitem(0)
            if best is None or seq < best[0]:
                best = (seq, group_id)
        return best

    def groups_in_order(self) -> Iterator[str]:
        """Named groups with evicted messages, by their lowest evicted sequence. A live view:
        stop iterating before changing the index."""
        return iter(self._firsts.values())


class QueuePaging(Destination):
    """The paging half of `queue.Queue`: reading stored messages back into `pending`, what can
    be dispatched first, and dropping from memory what cannot."""

    # Set by `Queue.__init__`.
    pending: SortedDict
    temp_store: MessageStore | None
    store_pages: bool
    loaded_seq: int
    _unwritten: deque[int]
    recovered_mark: int
    recovered_seq: int
    _evicted: Evicted
    _retry_ungrouped: bool
    stored_ahead: int
    stored_ahead_bytes: int
    is_dlq: bool
    max_groups: int
    groups: dict[str, Subscription]
    streams: StreamGroups
    exclusive_owner: Subscription | None

    # Set by `Queue.__init__` (see `picking.py`).
    _claimed: dict[int, bool]

    def _release_idle_groups(self, sub: Subscription, now_ms: int) -> None:
        """Forget groups of `sub` idle past the policy's timeout (the queue's rule)."""
        raise NotImplementedError

    def _passed_claimed(self, seq: int, nbytes: int) -> bool:
        """Paging reached an unread message: True if an operator took it (`picking.py`)."""
        raise NotImplementedError

    def _evict(self, key: int, message: Message) -> bool:
        """Drop a stored message from memory; it is read back later. False when the evicted
        index is full (the message stays)."""
        if not self._evicted.add(
            message.seq, message.group_id, message.delivery_count, message.nbytes
        ):
            return False
        del self.pending[key]
        self.usage.release(message.nbytes)
        self.services.count("evicted")
        return True

    def _load(self, seq: int, delivery_count: int) -> tuple[int, Message] | None:
        """Read one stored message back into `pending` (None if it was removed meanwhile)."""
        stored = self.store.load(self.name, seq - 1, 1, PAGE_BYTES)
        if not stored or stored[0].seq != seq:
            return None
        message = Message.from_stored(stored[0], delivery_count)
        self._seen_stored(message)
        key = _key(message)
        self.pending[key] = message
        self.usage.add(message.nbytes)
        self.services.count("paged_in")
        return key, message

    def _reload_group(
        self, group_id: str | None, max_messages: int, max_bytes: int, *, one_anyway: bool
    ) -> list[tuple[int, Message]]:
        """Read back a group's next evicted messages, in order, within a credit (with
        `one_anyway`, the first even if it is larger). Returns what was read."""
        evicted = self._evicted
        loaded: list[tuple[int, Message]] = []
        nbytes = 0
        while len(loaded) < max_messages and not self.usage.full:
            entry = evicted.first(group_id)
            if entry is None:
                break
            seq, delivery_count, size = entry
            if nbytes + size > max_bytes and not (one_anyway and not loaded):
                break
            # Read first: a store that cannot be read now (StoreOfflineError) leaves the
            # message evicted, to be read on a later pass.
            item = self._load(seq, delivery_count)
            evicted.pop_first(group_id)
            if item is not None:
                loaded.append(item)
                nbytes += size
        return loaded

    def _reload_evicted(self) -> bool:
        """Read back the evicted messages that can be dispatched now: those of streams being
        discarded; the next ones of each group whose consumer has credit, within that credit;
        then groups nobody holds, oldest first, for consumers that can take another group.
        Returns True when memory is full."""
        evicted = self._evicted
        for group_id in [g for g in self.streams.discarded if evicted.has(g)]:
            self._reload_group(group_id, PAGE_MESSAGES, PAGE_BYTES, one_anyway=True)
        ready = [s for s in self.subscriptions if s.ready()]
        if not ready or not evicted:
            return self.usage.full
        owner = self.exclusive_owner
        if owner is not None:
            if owner in ready:
                self._reload_in_order(owner)
            return self.usage.full
        now_ms = self.services.now_ms()
        rooms = [self._group_room(sub, now_ms) for sub in ready]
        candidates = deque(self._unheld_groups(sum(rooms)))
        for sub, rooms_left in zip(ready, rooms, strict=True):
            room = rooms_left
            messages, nbytes = _credit(sub)
            first = not sub.inflight
            for group_id in [g for g in sub.groups if evicted.has(g)]:
                loaded = self._reload_group(group_id, messages, nbytes, one_anyway=first)
                messages -= len(loaded)
                nbytes -= sum(m.nbytes for _, m in loaded)
                first = first and not loaded
            while room > 0 and candidates and messages > 0 and not self.usage.full:
                group_id = candidates[0]
                loaded = self._reload_group(group_id, messages, nbytes, one_anyway=first)
                if not loaded:
                    break  # its first message does not fit this consumer's credit
                candidates.popleft()
                if sub.selector is not None and not sub.matches(loaded[0][1]):
                    # Not for this consumer: back to disk at once, so nothing loops on it.
                    for key, message in loaded:
                        self._evict(key, message)
                    continue
                messages -= len(loaded)
                nbytes -= sum(m.nbytes for _, m in loaded)
                first = False
                room -= 1
        return self.usage.full

    def _reload_in_order(self, sub: Subscription) -> None:
        """An exclusive consumer takes everything: read back the lowest evicted sequences,
        within its credit."""
        messages, nbytes = _credit(sub)
        first = not sub.inflight
        evicted = self._evicted
        while messages > 0 and not self.usage.full:
            lowest = evicted.lowest()
            if lowest is None:
                return
            loaded = self._reload_group(lowest[1], 1, nbytes, one_anyway=first)
            if loaded:
                messages -= 1
                nbytes -= loaded[0][1].nbytes
                first = False
            elif evicted.lowest() == lowest:
                return  # it does not fit the credit

    def _group_room(self, sub: Subscription, now_ms: int) -> int:
        """How many more groups a consumer can take now (a page's worth when unlimited)."""
        limit = sub.max_open_groups
        if not limit:
            return PAGE_MESSAGES
        if len(sub.groups) >= limit:
            self._release_idle_groups(sub, now_ms)
        return max(limit - len(sub.groups), 0)

    def _unheld_groups(self, wanted: int) -> list[str]:
        """Up to `wanted` groups with evicted messages that nobody holds, oldest first."""
        if not wanted or (
            len(self.groups) >= self.max_groups and len(self.streams.owned) >= len(self.groups)
        ):
            return []  # the group map is full of open streams: no new group can be assigned
        found: list[str] = []
        discarded = self.streams.discarded
        for group_id in self._evicted.groups_in_order():
            if group_id not in self.groups and group_id not in discarded:
                found.append(group_id)
                if len(found) >= wanted:
                    break
        return found

    def _can_take_a_group(self) -> bool:
        """Could some consumer take a group nobody holds (or is there no consumer yet)?"""
        return not self.subscriptions or any(
            not s.max_open_groups or len(s.groups) < s.max_open_groups for s in self.subscriptions
        )

    def _stays_on_disk(self, message: Message, takeable: bool) -> bool:
        """Is this stored message, just read, one that cannot be dispatched before something
        else happens (so it is not worth its memory)?"""
        group_id = message.group_id
        if group_id is None or self.exclusive_owner is not None:
            return False
        if self._evicted.has(group_id):
            return True  # it comes after evicted messages of its group
        if group_id in self.groups or group_id in self.streams.discarded:
            return False
        return not takeable

    def _page_in(self) -> None:
        """Read stored messages back into memory, what can be dispatched first: evicted
        messages consumers can take, then the next page, then evicted messages without a
        group."""
        if self.usage.full:
            return
        if self._evicted and self._reload_evicted():
            return
        if self.store_pages and len(self.pending) < PAGE_MESSAGES // 2 and self._read_page():
            return
        if self._retry_ungrouped and self._evicted.has(None):
            self._retry_ungrouped = False
            self._reload_group(None, PAGE_MESSAGES, PAGE_BYTES, one_anyway=True)

    def _read_page(self) -> bool:
        """Read the next page of the store (False if there is none), keeping in memory only
        what consumers may take; the rest is remembered as evicted."""
        limit = self._unwritten[0] - 1 if self._unwritten else self.last_seq
        if self.loaded_seq >= limit:
            return False
        headroom = self.usage.headroom_bytes
        budget = PAGE_BYTES if headroom is None else max(1, min(PAGE_BYTES, headroom))
        # The backlog may be in two stores: persistent messages in the store, spooled ones in
        # the temp store. Read a page from each and keep what lies below the point both reached.
        sources = [(self.store, False)]
        if self.temp_store is not None:
            sources.append((self.temp_store, True))
        pages = []
        cutoff = limit
        for store, spooled in sources:
            page = store.load(self.name, self.loaded_seq, PAGE_MESSAGES, budget)
            if page:
                cutoff = min(cutoff, page[-1].seq)  # this store may hold more beyond the page
            pages.append((page, spooled))
        takeable = self._can_take_a_group()
        loaded = left = 0
        for page, spooled in pages:
            for item in page:
                if item.seq > cutoff:
                    break
                if self._claimed and self._passed_claimed(item.seq, item.size):
                    continue  # an operator took it
                message = Message.from_stored(item, 1 if item.seq <= self.recovered_mark else 0)
                self.stored_ahead -= 1
                self.stored_ahead_bytes -= message.nbytes
                if spooled:
                    message.in_store = False
                    message.spooled = True
                else:
                    self._seen_stored(message)
                    if self._stays_on_disk(message, takeable) and self._evicted.add(
                        message.seq, message.group_id, message.delivery_count, message.nbytes
                    ):
                        left += 1
                        continue
                self.pending[_key(message)] = message
                self.usage.add(message.nbytes)
                loaded += 1
        # Everything up to the cutoff is now in memory, evicted, or was acknowledged.
        self.loaded_seq = cutoff
        self.services.count("paged_in", loaded)
        if left:
            self.services.count("paged_past", left)
        if (left or not loaded) and not self.usage.full:
            # Read on: what was read was for nobody now, or an operator had taken all of it.
            self.wakeup()
        return True

    def _seen_stored(self, message: Message) -> None:
        """A chunk stored before the restart was read back: its stream is tracked (to be
        aborted if its producer never comes back) until its end is read."""
        if message.seq > self.recovered_seq or self.is_dlq:
            return
        stream_id = message.headers.get(STREAM_ID)
        if stream_id is None:
            return
        if closes_group(message.headers):
            self.open_streams.end(stream_id)
        elif not self.open_streams.seen(stream_id, self.services.now_ms()):
            self.services.count("limit_max_open_streams_per_destination")

    def _holds_unread(self, stream_id: str) -> bool:
        if self.loaded_seq < self.recovered_seq or self._evicted.has(stream_id):
            return True
        return any(m.group_id == stream_id for m in self.pending.values())

    def _evict_all(self, messages: list[tuple[int, Message]]) -> None:
        evicted = 0
        for key, message in messages:
            if not self._evict(key, message):
                self.services.count("limit_max_evicted")
                break
            evicted += 1
        if evicted:
            self.wakeup()
