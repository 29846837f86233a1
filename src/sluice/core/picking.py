"""What an operator sees of a queue and picks out of it (`QueuePicking`, a layer of
`queue.Queue`): the messages after a sequence, each with where it is (`Place`), to browse and
search them; the streams in progress, with their readers' positions; taking waiting messages
out of the queue for a move or a delete, then settling or giving them back; and purging.

A waiting message is in one of three places: in memory (`pending`), dropped from memory with its
place remembered (`Evicted`), or in a store alone above `loaded_seq`, not read yet. Taking one
out of memory or out of the evicted index is immediate. One not read yet is *claimed*: paging
and purges pass over it (counting it as read) until it is settled or given back. A message taken
is invisible to consumers; it is `settle`d once its removal is written (the queue forgets it), or
`give_back` puts it where it belongs again. Messages in flight, and those in a passing state
(being written, acknowledged inside an open transaction, kept for a `restart` stream, taken by
another operation), are shown but never taken.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.core.message import STREAM_END, STREAM_LENGTH, STREAM_OFFSET, STREAM_SEQ, Message
from sluice.core.paging import PAGE_BYTES, PAGE_MESSAGES, QueuePaging, pending_after
from sluice.core.paging import pending_key as _key
from sluice.core.views import MessageView, StreamReading, StreamView
from sluice.store.api import StoredMessage

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription

# A window reads at most this much of a store at a time.
WINDOW_BYTES = 16 << 20
# A browse with a filter looks at this many messages at a time.
_BROWSE_WINDOW = 1000


class Place(enum.Enum):
    """Where a message of a queue is."""

    PENDING = "pending"  # in memory, waiting for a consumer
    IN_FLIGHT = "in_flight"  # delivered, not acknowledged yet
    EVICTED = "evicted"  # waiting, dropped from memory (`Evicted`)
    UNREAD = "unread"  # waiting, in a store alone above `loaded_seq`
    BUSY = "busy"  # in a passing state: shown, never taken


_WAITING = frozenset({Place.PENDING, Place.EVICTED, Place.UNREAD})


@dataclass(frozen=True, slots=True)
class Found:
    """A message of the queue and where it is."""

    message: Message
    place: Place

    @property
    def waiting(self) -> bool:
        """Is it waiting for a consumer (so an operator may take it)?"""
        return self.place in _WAITING


@dataclass(frozen=True, slots=True)
class Window:
    """The messages of a queue after a sequence, in sequence order; `next_after` is where the
    next window starts (None: there is nothing after)."""

    found: list[Found]
    next_after: int | None


class Taken:
    """A waiting message an operator took out of its queue: consumers do not see it until it is
    given back. Exactly one of `settle` and `give_back` is called."""

    __slots__ = ("message", "place", "queue")

    def __init__(self, queue: QueuePicking, message: Message, place: Place) -> None:
        self.queue = queue
        self.message = message
        self.place = place

    def settle(self) -> None:
        """Its removal from the store is written (or it was not stored): the queue forgets it."""
        self.queue._taken_settled(self)

    def give_back(self) -> None:
        """The operation failed: it waits in its queue again, at its place."""
        self.queue._taken_given_back(self)


def _header_int(message: Message | None, name: str) -> int | None:
    """An integer header of a chunk (None: no chunk, or not a number)."""
    if message is None:
        return None
    raw = message.headers.get(name)
    if raw is None or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def _message_view(message: Message, in_flight: bool, preview_bytes: int) -> MessageView:
    return MessageView(
        seq=message.seq,
        message_id=message.message_id,
        timestamp_ms=message.timestamp_ms,
        priority=message.priority,
        persistent=message.persistent,
        expires_ms=message.expires_ms,
        delivery_count=message.delivery_count,
        in_flight=in_flight,
        headers=dict(message.headers),
        body_bytes=len(message.body),
        body_preview=bytes(message.body[:preview_bytes]),
    )


class QueuePicking(QueuePaging):
    """The operator's half of `queue.Queue`: windows of its messages, and taking them."""

    # Set by `Queue.__init__`: sequences of unread messages taken by an operator, and whether
    # paging passed over them since (True: counted as read).
    _claimed: dict[int, bool]
    _retained: dict[str, list[tuple[int, int, Message | None]]]

    def _drop(self, message: Message) -> None:
        """Forget a message for good, in the stores too (the queue's)."""
        raise NotImplementedError

    def window(self, after_seq: int, max_count: int, max_bytes: int = WINDOW_BYTES) -> Window:
        """The first messages after `after_seq` (at most `max_count`, and about `max_bytes`
        read from the stores), wherever they are: in memory, with consumers, in a store."""
        found: dict[int, Found] = {}
        for message in pending_after(self.pending, after_seq, max_count):
            found[message.seq] = Found(message, Place.PENDING)
        for sub in self.subscriptions:
            for message in sub.inflight.values():
                if message.seq > after_seq:
                    found[message.seq] = Found(message, Place.IN_FLIGHT)
        retained = (
            {seq for kept in self._retained.values() for seq, _nbytes, _m in kept}
            if self._retained
            else set()
        )
        cutoff = self.last_seq
        stores = [(self.store, False)]
        if self.temp_store is not None:
            stores.append((self.temp_store, True))
        for store, spooled in stores:
            page = store.load(self.name, after_seq, max_count, max_bytes)
            if page:
                # The store may hold more beyond the page: a page stops short of `max_bytes`
                # when its next message would not fit, so only an empty page says it is all.
                cutoff = min(cutoff, page[-1].seq)
            for item in page:
                if item.seq not in found:
                    found[item.seq] = self._stored_place(item, spooled, retained)
        seqs = sorted(seq for seq in found if seq <= cutoff)
        if len(seqs) > max_count:
            del seqs[max_count:]
            cutoff = seqs[-1]
        next_after = cutoff if cutoff < self.last_seq else None
        return Window([found[seq] for seq in seqs], next_after)

    def _stored_place(self, item: StoredMessage, spooled: bool, retained: set[int]) -> Found:
        """Where a message a store holds, and memory does not, is."""
        seq = item.seq
        unwritten = self._unwritten
        if seq in self._claimed or seq in retained or (unwritten and seq >= unwritten[0]):
            return Found(Message.from_stored(item), Place.BUSY)
        if seq > self.loaded_seq:
            message = Message.from_stored(item, 1 if seq <= self.recovered_mark else 0)
            if spooled:
                message.in_store = False
                message.spooled = True
            return Found(message, Place.UNREAD)
        if not spooled:
            message = Message.from_stored(item)
            entry = self._evicted.find(seq, message.group_id)
            if entry is not None:
                return Found(Message.from_stored(item, entry[0]), Place.EVICTED)
            return Found(message, Place.BUSY)
        return Found(Message.from_stored(item), Place.BUSY)

    def browse(
        self,
        after_seq: int,
        limit: int,
        preview_bytes: int,
        matches: Callable[[Message], bool] | None = None,
        scan_limit: int = 0,
    ) -> tuple[list[MessageView], int | None]:
        """The first `limit` messages after `after_seq` (that `matches`, looking at no more
        than `scan_limit` messages when given), in sequence order, without consuming them; and
        the sequence a next page starts after (None: nothing after)."""
        if matches is None:
            window = self.window(after_seq, limit)
            views = [
                _message_view(f.message, f.place is Place.IN_FLIGHT, preview_bytes)
                for f in window.found
            ]
            return views, window.next_after
        views = []
        scanned = 0
        after: int | None = after_seq
        while after is not None and len(views) < limit:
            if scan_limit and scanned >= scan_limit:
                return views, after
            window = self.window(after, _BROWSE_WINDOW)
            after = window.next_after
            for found in window.found:
                scanned += 1
                if matches(found.message):
                    views.append(
                        _message_view(found.message, found.place is Place.IN_FLIGHT, preview_bytes)
                    )
                    if len(views) >= limit:
                        seq = found.message.seq
                        return views, seq if seq < self.last_seq else None
        return views, after

    # -- streams --------------------------------------------------------------------------------

    def stream_views(self) -> list[StreamView]:
        """The streams being sent here, those its consumers read, and those a consumer left in
        the middle: who reads each, how far, and where the next reader would start."""
        sending = {
            sid: (last_ms, connected) for sid, last_ms, connected in self.open_streams.entries()
        }
        streams = self.streams
        ids = list(dict.fromkeys([*sending, *streams.owned, *streams.resuming, *streams.discarded]))
        if not ids:
            return []
        wanted = set(ids)
        held: dict[str, list[tuple[Subscription, Message]]] = {}
        for sub in self.subscriptions:
            for message in sub.inflight.values():
                if message.group_id in wanted:
                    held.setdefault(message.group_id, []).append((sub, message))
        waiting: dict[str, Message] = {}
        # The furthest chunk of each stream held in memory (in flight or waiting).
        furthest = {sid: max(chunks, key=lambda c: c[1].seq)[1] for sid, chunks in held.items()}
        for message in self.pending.values():
            group_id = message.group_id
            if group_id in wanted:
                first = waiting.get(group_id)
                if first is None or message.seq < first.seq:
                    waiting[group_id] = message
                last = furthest.get(group_id)
                if last is None or message.seq > last.seq:
                    furthest[group_id] = message
        views = []
        for stream_id in ids:
            chunks = sorted(held.get(stream_id, ()), key=lambda item: item[1].seq)
            owner = self.groups.get(stream_id) if stream_id in streams.owned else None
            if owner is None and chunks:
                owner = chunks[0][0]
            if owner is not None:
                reading = StreamReading.READING
            elif stream_id in streams.resuming:
                reading = StreamReading.RESUMING
            elif stream_id in streams.discarded:
                reading = StreamReading.DISCARDING
            else:
                reading = StreamReading.NONE
            first = chunks[0][1] if chunks else waiting.get(stream_id)
            last = furthest.get(stream_id)
            numbers = [n for _, m in chunks if (n := _header_int(m, STREAM_SEQ)) is not None]
            last_ms, connected = sending.get(stream_id, (None, False))
            views.append(
                StreamView(
                    self.name,
                    stream_id,
                    sending=stream_id in sending,
                    producer_connected=connected,
                    last_chunk_ms=last_ms,
                    reading=reading,
                    reader_connection=owner.connection_id if owner is not None else None,
                    reader_subscription=owner.id if owner is not None else None,
                    chunks_in_flight=len(chunks),
                    delivered_chunk=max(numbers) if numbers else None,
                    resume_chunk=_header_int(first, STREAM_SEQ),
                    resume_offset=_header_int(first, STREAM_OFFSET),
                    last_chunk=_header_int(last, STREAM_SEQ),
                    ended=last is not None and last.headers.get(STREAM_END) == "true",
                    length_bytes=_header_int(last, STREAM_LENGTH),
                )
            )
        return views

    # -- taking ---------------------------------------------------------------------------------

    def take(self, found: Found) -> Taken | None:
        """Take a waiting message out of the queue for an operator; None if it is not waiting
        (any more). Until the `Taken` is settled or given back the queue is pinned."""
        message = found.message
        place = found.place
        if place is Place.PENDING:
            key = _key(message)
            if self.pending.get(key) is not message:
                return None
            del self.pending[key]
        elif place is Place.EVICTED:
            if not self._evicted.remove(message.seq, message.group_id):
                return None
        elif place is Place.UNREAD:
            if message.seq <= self.loaded_seq or message.seq in self._claimed:
                return None
            self._claimed[message.seq] = False
        else:
            return None
        self.pins += 1
        return Taken(self, message, place)

    def _passed_claimed(self, seq: int, nbytes: int) -> bool:
        """Paging or a purge reached an unread message: True if an operator took it (it is
        then counted as read, and left alone)."""
        if seq not in self._claimed:
            return False
        if not self._claimed[seq]:
            self._claimed[seq] = True
            self.stored_ahead -= 1
            self.stored_ahead_bytes -= nbytes
        return True

    def _taken_settled(self, taken: Taken) -> None:
        self.pins -= 1
        message = taken.message
        if taken.place is Place.PENDING:
            self.usage.release(message.nbytes)
        elif taken.place is Place.UNREAD and not self._claimed.pop(message.seq):
            self.stored_ahead -= 1
            self.stored_ahead_bytes -= message.nbytes
        if message.spooled and self.temp_store is not None:
            self.temp_store.remove(self.name, message.seq)
        self._retry_ungrouped = True
        self.wakeup()

    def _taken_given_back(self, taken: Taken) -> None:
        self.pins -= 1
        message = taken.message
        place = taken.place
        if place is Place.PENDING:
            self.pending[_key(message)] = message  # its memory was never given back
        elif place is Place.UNREAD:
            if self._claimed.pop(message.seq):
                self._hold(message)  # paging passed it meanwhile
        elif not self._evicted.add(
            message.seq, message.group_id, message.delivery_count, message.nbytes
        ):
            self._hold(message)
        self._retry_ungrouped = True
        self.wakeup()

    def _hold(self, message: Message) -> None:
        self.pending[_key(message)] = message
        self.usage.add(message.nbytes)

    # -- purge ----------------------------------------------------------------------------------

    def purge(self, upto_seq: int, max_messages: int) -> int:
        """Remove messages waiting for a consumer whose sequence is at most `upto_seq`: those in
        memory, those dropped from memory, then those a store holds alone, about
        `max_messages` at a time (call again until it returns 0). Messages in flight stay with
        their consumers, and messages still being written stay too. Returns how many went."""
        removed = 0
        doomed = []
        for key, message in self.pending.items():
            if message.seq <= upto_seq:
                doomed.append((key, message))
                if len(doomed) >= max_messages:
                    break
        for key, message in doomed:
            del self.pending[key]
            self._drop(message)
        removed += len(doomed)
        if self._evicted and removed < max_messages:
            for seq in self._evicted.take_all():
                self.store.remove(self.name, seq)
                removed += 1
        if removed < max_messages:
            removed += self._purge_stored(upto_seq)
        if removed:
            self._retry_ungrouped = True
            self.wakeup()
        return removed

    def _purge_stored(self, upto_seq: int) -> int:
        """Remove a page of the messages above `loaded_seq` that the stores hold alone."""
        limit = min(upto_seq, self._unwritten[0] - 1 if self._unwritten else self.last_seq)
        if self.loaded_seq >= limit:
            return 0
        stores = [self.store] if self.temp_store is None else [self.store, self.temp_store]
        sources = [
            (store, store.load(self.name, self.loaded_seq, PAGE_MESSAGES, PAGE_BYTES))
            for store in stores
        ]
        cutoff = limit
        for _store, page in sources:
            if page:
                cutoff = min(cutoff, page[-1].seq)  # this store may hold more beyond the page
        removed = 0
        for store, page in sources:
            for item in page:
                if item.seq > cutoff:
                    break
                if self._claimed and self._passed_claimed(item.seq, item.size):
                    continue
                store.remove(self.name, item.seq)
                self.stored_ahead -= 1
                self.stored_ahead_bytes -= item.size
                removed += 1
        self.loaded_seq = cutoff
        return removed
