"""Streams as the core sees them (DESIGN.md section 7): the live streams a destination waits on,
and what a queue remembers of the stream groups its consumers hold.

`OpenStreams`, one per destination: every live stream whose end has not come, with the time its
last chunk was seen and the connection sending it. A stream recovered from the store after a
restart has no connection until its producer comes back and sends the next chunk. The broker's
sweep ends the streams idle past the destination's `stream_idle_timeout_s` with an abort marker, so
their reader raises instead of waiting for ever; a producer the broker has stopped reading (flow
control) is held back, not idle, and a recovered stream is idle only once the destination holds
none of its chunks unread. Bounded by `max_open_streams_per_destination`.

`StreamGroups`, one per queue: which owned message groups are streams (their consumer got chunks
of them, not the end), and the streams whose consumer left in the middle. Under the `resume` policy
the next chunk delivered of such a stream carries the resume mark (`x-stream-resume:true`), so the
next reader knows it continues another's stream; under `discard` the rest of the stream goes to the
DLQ. Both maps are bounded by the queue's `max_message_groups`, oldest forgotten first (counted).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from sluice.config import StreamPolicy
from sluice.core.message import STREAM_ID, STREAM_RESUME, Message

# Used until the broker sets the configured limit.
DEFAULT_MAX_OPEN_STREAMS = 10_000


class StreamProducer(Protocol):
    """The connection sending a live stream, as far as the idle sweep cares."""

    @property
    def reading_paused(self) -> bool:
        """Is the broker holding this connection's input back (for whatever reason)?"""
        ...


class _Open:
    __slots__ = ("last_ms", "producer")

    def __init__(self, last_ms: int, producer: StreamProducer | None) -> None:
        self.last_ms = last_ms
        self.producer = producer


class OpenStreams:
    """The live streams of one destination whose end has not come, least recently active first."""

    __slots__ = ("_open", "limit")

    def __init__(self, limit: int = DEFAULT_MAX_OPEN_STREAMS) -> None:
        self.limit = limit
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, stream_id: str) -> bool:
        return stream_id in self._open

    def entries(self) -> list[tuple[str, int, bool]]:
        """(stream id, when its last chunk came, whether a producer is sending it), least
        recently active first."""
        return [(sid, e.last_ms, e.producer is not None) for sid, e in self._open.items()]

    def producer(self, stream_id: str) -> StreamProducer | None:
        """The connection that sent the stream's last chunk (None if unknown or recovered)."""
        entry = self._open.get(stream_id)
        return entry.producer if entry is not None else None

    def full_for(self, stream_id: str) -> bool:
        """Would tracking this stream go beyond `limit`?"""
        return stream_id not in self._open and len(self._open) >= self.limit

    def chunk(self, stream_id: str, now_ms: int, producer: StreamProducer) -> None:
        """A producer sent a chunk that does not end the stream (check `full_for` first)."""
        entry = self._open.get(stream_id)
        if entry is None:
            self._open[stream_id] = _Open(now_ms, producer)
            return
        entry.last_ms = now_ms
        entry.producer = producer
        self._open.move_to_end(stream_id)

    def seen(self, stream_id: str, now_ms: int) -> bool:
        """A chunk stored before a restart was read back: track its stream (if there is room)
        until its end or its producer comes. False when the limit kept it out."""
        entry = self._open.get(stream_id)
        if entry is None:
            if len(self._open) >= self.limit:
                return False
            self._open[stream_id] = _Open(now_ms, None)
        elif entry.producer is None:
            entry.last_ms = now_ms
            self._open.move_to_end(stream_id)
        return True

    def end(self, stream_id: str) -> None:
        """The stream ended (its end chunk, or an abort marker)."""
        self._open.pop(stream_id, None)

    def idle(
        self, older_than_ms: int, now_ms: int, holds_unread: Callable[[str], bool]
    ) -> list[str]:
        """Forget and return the streams whose last chunk is older than `older_than_ms`, except
        those whose producer is held back by flow control (their clock restarts at `now_ms`)
        and recovered ones of which `holds_unread` says chunks are still to be read."""
        idle: list[str] = []
        held: list[str] = []
        for stream_id, entry in self._open.items():
            if entry.last_ms >= older_than_ms:
                break
            if entry.producer is not None:
                if entry.producer.reading_paused:
                    held.append(stream_id)
                    continue
            elif holds_unread(stream_id):
                continue
            idle.append(stream_id)
        for stream_id in held:
            self._open[stream_id].last_ms = now_ms
            self._open.move_to_end(stream_id)
        for stream_id in idle:
            del self._open[stream_id]
        return idle


class StreamGroups:
    """A queue's stream groups: owned ones, and those whose consumer left mid-stream."""

    __slots__ = ("_count", "discarded", "limit", "owned", "resuming")

    def __init__(self, limit: int, count: Callable[[str], None]) -> None:
        self.limit = limit
        self._count = count
        # Owned groups that are streams (a subset of the queue's group map, so bounded by it).
        self.owned: set[str] = set()
        # Streams whose next delivered chunk carries the resume mark.
        self.resuming: OrderedDict[str, None] = OrderedDict()
        # Streams whose remaining chunks go to the DLQ.
        self.discarded: OrderedDict[str, None] = OrderedDict()

    def assigned(self, group_id: str, message: Message) -> None:
        """A group was given to a consumer with this message."""
        if STREAM_ID in message.headers:
            self.owned.add(group_id)

    def closed(self, group_id: str) -> None:
        """The group ended (its end or abort marker was acknowledged or dead-lettered)."""
        self.owned.discard(group_id)
        self.resuming.pop(group_id, None)
        self.discarded.pop(group_id, None)

    def owner_left(self, group_id: str, policy: StreamPolicy) -> None:
        """The consumer holding the group left. If it was in the middle of a stream, `resume`
        marks the stream's next chunk and `discard` sends the rest to the DLQ (`restart` is the
        queue's business: it keeps the chunks)."""
        if group_id not in self.owned:
            return
        self.owned.discard(group_id)
        if policy is StreamPolicy.RESUME:
            self._remember(self.resuming, group_id, "stream_resume_marks_forgotten")
        elif policy is StreamPolicy.DISCARD:
            self._remember(self.discarded, group_id, "stream_discards_forgotten")

    def _remember(self, streams: OrderedDict[str, None], group_id: str, metric: str) -> None:
        streams[group_id] = None
        streams.move_to_end(group_id)
        if len(streams) > self.limit:
            streams.popitem(last=False)
            self._count(metric)

    def mark_if_resuming(self, message: Message) -> None:
        """Put the resume mark on the chunk about to be delivered if its stream was left in the
        middle (once: the reader then reads on from it)."""
        group_id = message.group_id
        if group_id is None or group_id not in self.resuming:
            return
        del self.resuming[group_id]
        if STREAM_ID in message.headers:
            # A new dict: the stored headers may be shared; the cached header block is stale.
            message.headers = {**message.headers, STREAM_RESUME: "true"}
            message.wire = None
