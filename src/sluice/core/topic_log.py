"""A topic's log: what it keeps in memory and in the store, its offsets, retention and expiry.

`Topic` (topic.py) builds on it with subscriptions and dispatch; the whole account of what a topic
keeps is at the top of topic.py.

Retention keeps a message for at least `retention_s` seconds and keeps at least the newest
`retention_bytes` bytes; a message goes when neither keeps it. It is tracked with coarse marks
(sequence, time, bytes so far), so it is exact to within a mark, on the side of keeping. The
broker's sweep applies time retention and expiry on a topic where nothing happens.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice.config import DestinationPolicy
from sluice.core.destination import Destination, Services
from sluice.core.message import Message
from sluice.core.subscription import Durable
from sluice.core.usage import Usage
from sluice.errors import RequestError

if TYPE_CHECKING:
    from sluice.store.api import StoredMessage, WriteHandle

# Compact the log list once this many trimmed slots have accumulated at its head.
_COMPACT_AFTER = 4096
# Retention is tracked with coarse marks (sequence, time, bytes so far): one per MiB or second.
_RETENTION_MARK_BYTES = 1 << 20
_RETENTION_MARK_MS = 1000
# At most this many marks per topic: beyond it every other one is dropped (coarser, so keeping a
# little more, never less).
_MAX_RETENTION_MARKS = 10_000
# Remove from the store in steps of at least this many sequences.
_STORE_TRIM_STEP = 256
# The sweep looks at most this many messages of a topic's log for expiry at a time.
_EXPIRY_SCAN = 4096
# Expired messages already dead-lettered (by sequence), so that each goes to the DLQ once: at
# most this many are remembered per topic, the oldest forgotten first.
_MAX_EXPIRED_REMEMBERED = 100_000


class OffsetError(RequestError):
    """An `x-offset` header that is not `earliest`, `latest`, a number or `timestamp=MS`."""


class TopicLog(Destination):
    """The log of a topic (see the module docstring); `Topic` adds subscribers."""

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

    def in_use(self) -> str | None:
        """See `Destination.in_use`; besides, durable subscriptions and messages being
        written."""
        reason = super().in_use()
        if reason is None and self.durables:
            reason = f"{len(self.durables)} durable subscriptions read it (delete them first)"
        if reason is None and self._unwritten:
            reason = "messages are being written"
        return reason

    def unused(self) -> bool:
        """See `Destination.unused`; besides, no durable subscription, no retention, an empty
        log."""
        return (
            super().unused() and not self.keeps_messages and not self.depth and not self._unwritten
        )

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

    def _written(self, seq: int) -> None:
        # Writes complete in the order they were made, so the oldest unwritten is usually this one.
        if self._unwritten and self._unwritten[0] == seq:
            self._unwritten.popleft()
        else:
            self._unwritten.remove(seq)
        self.wakeup()

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

    def read_range(
        self, start: int, end: int, max_count: int, max_bytes: int, now_ms: int
    ) -> tuple[list[StoredMessage], int]:
        """The messages a subscriber could see with offsets in `[start, end)`, oldest first: at
        most `max_count`, and about `max_bytes` of bodies (at least one message); and the offset
        to continue from. For a reader of the log (a range block): nothing is delivered,
        acknowledged, trimmed or dead-lettered; withdrawn and expired messages are skipped, as a
        cursor skips them. Older messages come from the store a page at a time, as a cursor
        behind the log reads them."""
        end = min(end, self.visible_seq + 1)
        out: list[StoredMessage] = []
        nbytes = 0
        seq = max(start, 1)
        log = self._log
        withdrawn = self._withdrawn
        while seq < end and len(out) < max_count and nbytes < max_bytes:
            in_memory = self.depth > 0
            if seq < self.base_seq or not in_memory:
                before = min(self.base_seq if in_memory else end, end)
                taken = False
                for item in self.store.load(
                    self.name, seq - 1, max_count - len(out), max_bytes - nbytes
                ):
                    if item.seq >= before:
                        break
                    seq = item.seq + 1
                    taken = True
                    if not 0 < item.expires_ms <= now_ms:
                        out.append(item)
                        nbytes += len(item.body)
                if not taken:
                    seq = before  # nothing older is kept
                continue
            message = log[seq - self.base_seq + self._head]
            if message.paged_out:
                seq, nbytes = self._read_paged(
                    message, seq, end, out, max_count, nbytes, max_bytes, now_ms
                )
                continue
            seq += 1
            if withdrawn and message.seq in withdrawn:
                continue
            if message.expires_ms and message.expired(now_ms):
                continue
            out.append(message)
            nbytes += len(message.body)
        return out, min(seq, max(end, start))

    def _read_paged(
        self,
        stub: Message,
        seq: int,
        end: int,
        out: list[StoredMessage],
        max_count: int,
        nbytes: int,
        max_bytes: int,
        now_ms: int,
    ) -> tuple[int, int]:
        """`read_range` at a committed message whose body is in a store: read it and the stubs
        that follow it from that store (as `Topic._load_committed`); (next offset, bytes)."""
        store = self.services.temp_store if stub.spooled else self.store
        log = self._log
        offset = self._head - self.base_seq
        start = seq
        if store is not None:
            for item in store.load(self.name, seq - 1, max_count - len(out), max_bytes - nbytes):
                if item.seq != seq or seq >= end or seq + offset >= len(log):
                    break
                entry = log[seq + offset]
                if not entry.paged_out or entry.spooled != stub.spooled:
                    break
                seq += 1
                if not 0 < item.expires_ms <= now_ms:
                    out.append(item)
                    nbytes += len(item.body)
        if seq == start:
            seq += 1  # not in the store: its COMMIT failed
        return seq, nbytes

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
            position = sub.resume_offset()
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
            self.traffic.expired += 1
            if len(expired) > _MAX_EXPIRED_REMEMBERED:
                expired.popitem(last=False)
            if message.persistent:
                self.services.dead_letter(message, "expired", on_stored)
                return
            self.services.count("expired_discarded")
        if on_stored is not None:
            on_stored(None)
