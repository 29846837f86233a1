"""The broker: destinations, the store's completions, dead letters, flow control and counters.

One `Broker` lives on one event loop. It knows nothing of STOMP or sockets: connections reach it
through `BrokerConnection` (see `connection.py`) and it reaches them through `Link`.
"""

from __future__ import annotations

import collections
import gc
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

from sluice.config import Config, DestinationPolicy
from sluice.core.admin import BrokerAdmin
from sluice.core.destination import Destination
from sluice.core.disk import DiskBudget, DiskWatch
from sluice.core.message import (
    DEDUP_ID,
    GROUP_ID,
    STREAM_ABORT,
    STREAM_ABORT_REASON,
    STREAM_ID,
    DestinationKind,
    Message,
    parse_destination,
)
from sluice.core.queue import Queue
from sluice.core.services import Cancellable, FlowReason, Loop, Producer
from sluice.core.topic import Topic
from sluice.core.usage import Usage
from sluice.core.views import Totals
from sluice.core.wildcard import WildcardIndex, compile_pattern
from sluice.errors import (
    DiskFullError,
    LimitExceeded,
    StoreError,
    StoreIOError,
)
from sluice.store.api import MessageStore, Recovery, WriteHandle

log = logging.getLogger(__name__)

ORIGINAL_DESTINATION = "x-original-destination"
# Expiry, idle streams and time-based topic retention are checked on one broker-wide timer.
EXPIRY_SWEEP_INTERVAL_S = 5.0
# The sweep runs at least twice per shortest stream_idle_timeout_s, but not more often than this.
MIN_SWEEP_INTERVAL_S = 0.1
DLQ_REASON = "x-dlq-reason"
# Idle destinations removed at once past which the cyclic garbage collector is run, and what one
# destination is reckoned to take (for `Broker.memory_freed`).
_COLLECT_AFTER_REMOVED = 1000
_DESTINATION_BYTES = 4096


class TopicAttacher(Protocol):
    """A wildcard subscription: told about every new topic its pattern matches."""

    def attach(self, topic: Topic) -> None:
        """Subscribe to a topic that matches."""
        ...


def _sweep_interval_s(config: Config) -> float:
    """How often expiry, idle streams and idle destinations are swept: often enough for the
    shortest stream idle timeout of any destination and for the destination idle timeout, within
    bounds."""
    idle_timeouts = [config.policy.stream_idle_timeout_s] + [
        override.policy.stream_idle_timeout_s for override in config.destinations
    ]
    if config.limits.destination_idle_timeout_s:
        idle_timeouts.append(config.limits.destination_idle_timeout_s)
    return max(MIN_SWEEP_INTERVAL_S, min(EXPIRY_SWEEP_INTERVAL_S, min(idle_timeouts) / 2))


def _dlq_prefixes(config: Config) -> tuple[str, ...]:
    """Every dead-letter prefix of the default policy and of the destination overrides."""
    policies = [config.policy, *(override.policy for override in config.destinations)]
    return tuple(
        {prefix for p in policies for prefix in (p.dlq_prefix, p.topic_dlq_prefix) if prefix}
    )


class Broker(BrokerAdmin):
    """Destinations, the store, and the bounds that protect them."""

    def __init__(
        self,
        config: Config,
        store: MessageStore,
        loop: Loop,
        *,
        now_ms: Callable[[], int] | None = None,
        temp_store: MessageStore | None = None,
    ) -> None:
        """One assignment per piece of the broker's state, each with what it is for: long
        because the list is, and kept in one place so that it can be read as that list."""
        self.config = config
        self.limits = config.limits
        self.store = store
        self.temp_store = temp_store
        self._loop = loop
        # Disk use: measured from the stores on a timer, estimated in between from what was
        # accepted since.
        self.disks = DiskWatch(
            config,
            store,
            temp_store,
            loop,
            count=self.count,
            on_write_errors=self._store_write_errors,
        )
        self.store_disk = self.disks.store
        self.temp_disk = self.disks.temp
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.destinations: dict[str, Destination] = {}
        self.usage = Usage(
            "broker", self.limits.memory_limit_bytes, self.limits.memory_resume_ratio
        )
        self.counters: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count(1)
        self._id_prefix = f"ID:{config.broker_name}-{os.getpid()}-{int(time.time())}-"
        # Store completions arrive from the writer thread; they are drained on the loop.
        self._completed: collections.deque[WriteHandle] = collections.deque()
        self._drain_scheduled = False
        self._drain_lock = threading.Lock()
        # Persistent writes handed to the store and not yet completed.
        self.pending_writes = 0
        self.pending_write_bytes = 0
        self._write_waiters: dict[Hashable, Producer] = {}
        # A write to the store failed: it takes no more writes until it is reopened, so
        # persistent messages are refused from then on. `store_failure` says why, fit for a
        # client ("journal sync failed: Input/output error"), when the store said.
        self.store_failed = False
        self.store_failure: str | None = None
        # The broker is stopping: connections it closes are not producers that died.
        self.shutting_down = False
        # The stores are closed (`close`): nothing more runs against them.
        self.closed = False
        self.recovery: Recovery | None = None
        self._sweep_timer: Cancellable | None = None
        self._sweep_interval_s = _sweep_interval_s(config)
        self._next_expiry_ms = 0
        self.store_pages = store.capabilities.pages_to_disk
        self._overrides = [
            (kind, compile_pattern(short), override.policy)
            for override in config.destinations
            for kind, short in [parse_destination(override.pattern)]
        ]
        # Queues named with any of these prefixes are dead-letter queues: what fails there is
        # not dead-lettered again.
        self._dlq_prefixes = _dlq_prefixes(config)
        # Wildcard topic subscriptions, by pattern: each attaches to matching topics as they
        # appear.
        self.wildcards: WildcardIndex[TopicAttacher] = WildcardIndex()
        # Destinations each live connection created that still exist, by connection id.
        self._created: collections.Counter[int] = collections.Counter()
        # The last sequence of topics removed when idle, so that a topic created again numbers
        # on (a reader of its offsets never sees one twice); at most max_destinations of them.
        self._removed_topic_seqs: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._next_gc_ms = 0
        self._removed_since_collect = 0
        # Told roughly how many bytes were freed at once (the server gives the memory back to
        # the system); by default nobody is.
        self.memory_freed: Callable[[int], None] = _ignore_freed
        # The counts of destinations removed since the start, so that totals never go down.
        self._removed_totals = Totals()
        self.started_ms = self._now_ms()
        # More counters and gauges for `snapshot`, from around the core (the server's latency).
        self.snapshot_sources: list[Callable[[], dict[str, int]]] = []

    # -- services for destinations ------------------------------------------------------------

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the next turn of the loop."""
        self._loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run `callback` after `delay` seconds."""
        self._loop.call_later(delay, callback)

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch."""
        return self._now_ms()

    def count(self, metric: str, n: int = 1) -> None:
        """Add to a counter."""
        self.counters[metric] += n

    def new_message_id(self) -> str:
        """A broker-unique message id."""
        return self._id_prefix + str(next(self._ids))

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> Recovery:
        """Open the store and rebuild destinations from what it holds."""
        recovery = self.store.open(self._on_store_completed)
        if self.temp_store is not None:
            self.temp_store.open(self._on_store_completed)
        for recovered in recovery.destinations:
            destination = self.destination(recovered.name)
            destination.last_seq = max(destination.last_seq, recovered.last_seq)
            destination.dedup.extend(recovered.dedup_ids)
            if isinstance(destination, Queue):
                destination.recovered_mark = recovered.dispatch_mark
                destination.recovered_seq = recovered.last_seq
                destination.stored_ahead = recovered.message_count
                destination.stored_ahead_bytes = recovered.message_bytes
                destination.wakeup()
            elif isinstance(destination, Topic):
                destination.base_seq = destination.last_seq + 1
                destination.restore_retention()
        for sub in recovery.subscriptions:
            topic = self.destination(sub.destination)
            if isinstance(topic, Topic):
                topic.restore_durable(sub)
        for destination in self.destinations.values():
            # What came in before the start is not counted as coming in now.
            destination.counted_from_seq = destination.last_seq
        self.recovery = recovery
        self._sweep_timer = self._loop.call_later(self._sweep_interval_s, self._sweep)
        self.disks.start()
        return recovery

    def close(self) -> None:
        """Stop the timers and the destinations, then close the store (flushing what it has).
        Nothing touches the stores after: work still queued on the loop (a dispatch pass, the
        completions of the writes the close flushes, and what they would set off: a message
        enqueued, a page read) is dropped. Every connection is closed by then: nobody waits."""
        self.closed = True
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        self.disks.stop()
        for destination in self.destinations.values():
            destination.stop()
        self.store.close()
        if self.temp_store is not None:
            self.temp_store.close()

    def _sweep(self) -> None:
        """Expired messages go to their DLQ even when nobody consumes the destination; topics
        let go of what their time retention no longer keeps even when nothing is published;
        streams whose producer went quiet past `stream_idle_timeout_s` are aborted."""
        now_ms = self.now_ms()
        if now_ms >= self._next_expiry_ms:
            self._next_expiry_ms = now_ms + int(EXPIRY_SWEEP_INTERVAL_S * 1000)
            for destination in list(self.destinations.values()):
                if isinstance(destination, Queue):
                    if destination.pending:
                        destination.expire(now_ms)
                elif isinstance(destination, Topic):
                    destination.sweep(now_ms)
        self.abort_idle_streams(now_ms)
        timeout_s = self.limits.destination_idle_timeout_s
        if timeout_s and now_ms >= self._next_gc_ms:
            self._next_gc_ms = now_ms + int(min(timeout_s / 2, EXPIRY_SWEEP_INTERVAL_S) * 1000)
            self.remove_idle_destinations(now_ms)
        self._sweep_timer = self._loop.call_later(self._sweep_interval_s, self._sweep)

    def remove_idle_destinations(self, now_ms: int) -> int:
        """Remove the destinations found unused (`Destination.unused`), with no message
        published, since `destination_idle_timeout_s` ago: from the table, and from the stores'
        records. Returns how many went."""
        timeout_ms = int(self.limits.destination_idle_timeout_s * 1000)
        removed = 0
        for destination in list(self.destinations.values()):
            if not destination.unused():
                destination.unused_since_ms = 0
            elif not destination.unused_since_ms or destination.unused_seq != destination.last_seq:
                destination.unused_since_ms = now_ms
                destination.unused_seq = destination.last_seq
            elif now_ms - destination.unused_since_ms >= timeout_ms:
                self._remove_destination(destination)
                removed += 1
        if removed:
            self._removed_since_collect += removed
            if self._removed_since_collect >= _COLLECT_AFTER_REMOVED:
                # A destination is freed by the cyclic collector (it holds callbacks to itself),
                # which may not run for a long time on a broker that has gone quiet. The broker
                # process freezes long-lived objects out of its sight (`sluice.cli.collector`):
                # thawed, this collection visits the removed destinations too.
                self.memory_freed(self._removed_since_collect * _DESTINATION_BYTES)
                self._removed_since_collect = 0
                gc.unfreeze()
                gc.collect()
            self.count("destinations_removed_idle", removed)
            log.info(
                "removed %d idle destinations (unused for destination_idle_timeout_s=%g)",
                removed,
                self.limits.destination_idle_timeout_s,
            )
        return removed

    def _remove_destination(self, destination: Destination) -> None:
        name = destination.name
        del self.destinations[name]
        self._removed_totals += destination.view().totals
        destination.stop()
        destination.usage.detach()
        creator = destination.creator_id
        if creator in self._created:
            self._created[creator] -= 1
        if isinstance(destination, Topic):
            # A new key, not the name itself: the name was allocated among the destination's
            # own objects, and keeping it would pin their memory in the allocator's arenas.
            key = name.encode()
            seqs = self._removed_topic_seqs
            seqs[key] = destination.last_seq
            seqs.move_to_end(key)
            while len(seqs) > self.limits.max_destinations:
                seqs.popitem(last=False)
        self.store.delete_destination(name)
        if self.temp_store is not None:
            self.temp_store.delete_destination(name)

    def abort_idle_streams(self, now_ms: int) -> None:
        """End with an abort marker every live stream of which no chunk came within its
        destination's `stream_idle_timeout_s` (see `Destination.idle_streams`)."""
        for destination in list(self.destinations.values()):
            if destination.open_streams:
                for stream_id in destination.idle_streams(now_ms):
                    self.abort_stream(
                        destination.name, stream_id, "no chunk within stream_idle_timeout_s"
                    )

    # -- destinations ---------------------------------------------------------------------------

    def destination(self, name: str, creator_id: int = 0) -> Destination:
        """The destination with this full name (`/queue/x`, `/topic/x`), created on first use;
        a connection that creates one (`creator_id`) is held to its quota."""
        existing = self.destinations.get(name)
        if existing is not None:
            return existing
        kind, short = parse_destination(name)
        self._check_room_for(name, creator_id)
        if creator_id:
            self._created[creator_id] += 1
        policy = self._policy_for(kind, short)
        usage = Usage(
            name,
            self.limits.destination_memory_limit_bytes,
            self.limits.memory_resume_ratio,
            parent=self.usage,
        )
        destination: Destination
        if kind is DestinationKind.QUEUE:
            destination = Queue(
                self,
                name,
                policy,
                usage,
                max_groups=self.limits.max_message_groups,
                concurrent_store_and_dispatch=(
                    self.config.store.concurrent_store_and_dispatch_queues
                ),
                is_dlq=short.startswith(self._dlq_prefixes),
                store_pages=self.store_pages,
            )
        else:
            destination = Topic(
                self,
                name,
                policy,
                usage,
                concurrent_store_and_dispatch=(
                    self.config.store.concurrent_store_and_dispatch_topics
                ),
                store_pages=self.store_pages,
            )
        destination.dedup.size = self.limits.dedup_window
        destination.open_streams.limit = self.limits.max_open_streams_per_destination
        destination.creator_id = creator_id
        if isinstance(destination, Topic):
            last_seq = self._removed_topic_seqs.pop(name.encode(), None)
            if last_seq is not None:
                destination.last_seq = last_seq
                destination.base_seq = last_seq + 1
        destination.counted_from_seq = destination.last_seq
        self.destinations[name] = destination
        if isinstance(destination, Topic):
            for attacher in self.wildcards.match(short):
                attacher.attach(destination)
        return destination

    def _check_room_for(self, name: str, creator_id: int) -> None:
        """Raise `LimitExceeded` (counted) if the table, or the creating connection's quota of
        it, has no room for one more destination."""
        if len(self.destinations) >= self.limits.max_destinations:
            self.count("limit_max_destinations")
            raise LimitExceeded("max_destinations", self.limits.max_destinations, name)
        quota = self.limits.max_destinations_per_connection
        if creator_id and self._created[creator_id] >= quota:
            self.count("limit_max_destinations_per_connection")
            raise LimitExceeded(
                "max_destinations_per_connection",
                quota,
                f"{name}: this connection created {quota} destinations that still exist",
            )

    def _policy_for(self, kind: DestinationKind, short: str) -> DestinationPolicy:
        for override_kind, pattern, policy in self._overrides:
            if override_kind is kind and pattern.matches(short):
                return policy
        return self.config.policy

    def abort_stream(self, destination_name: str, stream_id: str, reason: str) -> None:
        """Put an abort marker at the end of a stream: its reader raises instead of waiting."""
        destination = self.destinations.get(destination_name)
        if destination is None:
            return
        destination.open_streams.end(stream_id)
        headers = {
            GROUP_ID: stream_id,
            STREAM_ID: stream_id,
            STREAM_ABORT: "true",
            STREAM_ABORT_REASON: reason,
        }
        marker = Message(
            destination_name,
            0,
            self.new_message_id(),
            self.now_ms(),
            headers,
            b"",
            persistent=True,
        )
        self.count("streams_aborted")
        log.info("aborting stream %s on %s: %s", stream_id, destination_name, reason)
        self.accept(destination, marker)

    def dlq_name(self, destination_name: str) -> str:
        """The dead-letter queue of a destination: `/queue/<dlq_prefix><name>` for a queue,
        `/queue/<topic_dlq_prefix><name>` for a topic, with the destination's own policy."""
        kind, short = parse_destination(destination_name)
        destination = self.destinations.get(destination_name)
        policy = destination.policy if destination is not None else self._policy_for(kind, short)
        prefix = policy.dlq_prefix if kind is DestinationKind.QUEUE else policy.topic_dlq_prefix
        return "/queue/" + prefix + short

    def dead_letter(
        self,
        message: Message,
        reason: str,
        on_stored: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """Send a copy of the message to its dead-letter queue, with where and why
        (`on_stored` runs once the copy is safe, as for a producer's send)."""
        dlq_name = self.dlq_name(message.destination)
        headers = dict(message.headers)
        headers.setdefault(ORIGINAL_DESTINATION, message.destination)
        headers[DLQ_REASON] = reason
        copy = Message(
            dlq_name,
            0,
            message.message_id,
            message.timestamp_ms,
            headers,
            message.body,
            expires_ms=0,
            priority=message.priority,
            persistent=message.persistent,
        )
        self.count("dead_lettered")
        source = self.destinations.get(message.destination)
        if source is not None:
            source.traffic.dead_lettered += 1
        try:
            dlq = self.destination(dlq_name)
        except LimitExceeded:
            log.error("dropped message %s: no room for its DLQ %s", message.message_id, dlq_name)
            self.count("dead_letter_dropped")
            if on_stored is not None:
                on_stored(None)
            return
        self.accept(dlq, copy, on_stored)

    # -- accepting messages ---------------------------------------------------------------------

    def accept(
        self,
        destination: Destination,
        message: Message,
        on_stored: Callable[[WriteHandle | None], None] | None = None,
    ) -> None:
        """Hand a message to its destination. A persistent one counts as a pending write from
        here until the destination reports it (written, failed, cancelled, or not stored at all:
        a topic nobody keeps it for): this is the one place that pairs the count with its
        release. A failed write withdraws the message from its destination."""
        if not message.persistent:
            destination.accept(message, on_stored or _not_waited)
            return
        self.track_write(message)
        nbytes = message.nbytes
        # The store may keep the handle, and so this callback, after the write: the message is
        # let go of once it ran, so its body is not held with it.
        withdrawable: Message | None = message

        def stored(handle: WriteHandle | None) -> None:
            nonlocal withdrawable
            error = handle.error if handle is not None else None
            self._untrack_write(nbytes, error)
            if error is not None and withdrawable is not None:
                destination.withdraw(withdrawable)
                dedup_id = withdrawable.headers.get(DEDUP_ID)
                if dedup_id is not None:
                    # Not stored: the producer's retry is not a duplicate.
                    destination.dedup.discard(dedup_id)
            withdrawable = None
            if on_stored is not None:
                on_stored(handle)

        destination.accept(message, stored)

    # -- store completions and pending-write bounds ---------------------------------------------

    def _on_store_completed(self, handles: Sequence[WriteHandle]) -> None:
        # Called from the store's writer thread (or inline by the memory store).
        self._completed.extend(handles)
        with self._drain_lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._loop.call_soon_threadsafe(self._drain_completed)

    def _drain_completed(self) -> None:
        with self._drain_lock:
            self._drain_scheduled = False
        completed = self._completed
        if self.closed:
            completed.clear()  # see `close`
            return
        while completed:
            handle = completed.popleft()
            callback = handle.on_complete
            if callback is not None:
                callback(handle)

    def track_write(self, message: Message) -> None:
        """Count a write a store has not completed yet (persistent, or spooled)."""
        if message.persistent or message.spooled:
            self.pending_writes += 1
            self.pending_write_bytes += message.nbytes
            budget = self.store_disk if message.persistent else self.temp_disk
            budget.note_accepted(message.nbytes)

    # -- disk limits ----------------------------------------------------------------------------

    def disk_budget(self, *, persistent: bool) -> DiskBudget:
        """The disk of the store (`persistent`) or of the temp store."""
        return self.disks.budget(persistent=persistent)

    def disk_full(self, *, persistent: bool) -> bool:
        """Is the store (`persistent`) or the temp store full (see `core/disk.py`)?"""
        return self.disks.full(persistent=persistent)

    def wait_for_disk(self, key: Hashable, producer: Producer, persistent: bool) -> None:
        """Pause a producer until the store (or temp store) has room again."""
        self.disks.wait(key, producer, persistent=persistent)

    def _store_write_errors(self) -> None:
        """A measure found failed writes nobody waited on (a removal, a mark): the store is
        failed all the same."""
        if not self.store_failed:
            self.write_failed(StoreError("the message store reported a failed write"))

    def write_done(self, handle: WriteHandle) -> None:
        """A write counted by `track_write` and handed to a store completed."""
        self._untrack_write(handle.size, handle.error)

    def _untrack_write(self, nbytes: int, error: BaseException | None) -> None:
        if error is not None:
            self.write_failed(error)
        self.pending_writes -= 1
        self.pending_write_bytes -= nbytes
        if self._write_waiters and not self.writes_backed_up(resume=True):
            waiters, self._write_waiters = self._write_waiters, {}
            for producer in waiters.values():
                producer.resume_producer(FlowReason.PENDING_WRITES)

    def write_failed(self, error: BaseException) -> None:
        """A store write failed. For lack of space (`DiskFullError`: nothing was written, the
        store goes on) the store counts as full until a measure finds room. Otherwise: count it;
        the first one is logged and from then on persistent messages are refused (the store
        takes no more writes until it is reopened)."""
        if isinstance(error, DiskFullError):
            self.count("store_no_space_errors")
            self.store_disk.out_of_space(time.monotonic())
            return
        self.count("store_write_errors")
        if not self.store_failed:
            self.store_failed = True
            if isinstance(error, StoreIOError):
                self.store_failure = error.reason
            log.error(
                "a store write failed (%s): persistent messages are refused until the broker is "
                "restarted",
                error,
            )

    def writes_backed_up(self, *, resume: bool = False) -> bool:
        """Are pending writes over their bound (or, when deciding to resume, above half of it)?"""
        factor = 0.5 if resume else 1.0
        return (
            self.pending_writes >= self.limits.max_async_writes * factor
            or self.pending_write_bytes >= self.limits.max_async_write_bytes * factor
        )

    def wait_for_writes(self, key: Hashable, producer: Producer) -> None:
        """Pause a producer until pending writes drain."""
        self.count("flow_paused_pending_writes")
        self._write_waiters[key] = producer
        producer.pause_producer(FlowReason.PENDING_WRITES)

    def forget_creator(self, connection_id: int) -> None:
        """A connection closed: its destinations no longer count against a quota."""
        self._created.pop(connection_id, None)

    def forget_producer(self, key: Hashable, usages: Iterable[Usage] = ()) -> None:
        """A connection closed: drop it from the wait lists it is on."""
        self._write_waiters.pop(key, None)
        self.disks.forget(key)
        for usage in usages:
            usage.cancel_wait(key)

    def snapshot(self) -> dict[str, int]:
        """Counters and gauges, for logs, metrics and tests."""
        out = dict(self.counters)
        out["store_disk_bytes"] = self.disks.store_disk_bytes
        out["temp_disk_bytes"] = self.disks.temp_disk_bytes
        disk = self.store_disk
        out["store_full"] = int(disk.full)
        out["store_room_bytes"] = disk.room_bytes
        out["store_data_bytes"] = disk.held_bytes
        out["store_disk_free_bytes"] = disk.free_bytes
        out["temp_full"] = int(self.temp_disk.full)
        out["memory_used_bytes"] = self.usage.used
        out["pending_writes"] = self.pending_writes
        out["store_failed"] = int(self.store_failed)
        out["destinations"] = len(self.destinations)
        for source in self.snapshot_sources:
            out.update(source())
        return out


def _ignore_freed(nbytes: int) -> None:
    """Nobody asked to hear of freed memory."""


def _not_waited(handle: WriteHandle | None) -> None:
    """A message nobody waits on (non-persistent, or without a producer)."""
