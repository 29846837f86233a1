"""The message store interface that the core programs against, and the values it exchanges.

Every store (`memory.MemoryStore`, `journal.store.JournalStore`, `postgres.store.PostgresStore`)
implements `MessageStore`, and one contract test suite runs against all of them. What a store can
do beyond the contract it declares in `StoreCapabilities`; the core reads that, never probes.

Threading: every method is called from the broker's event-loop thread. A store may write on a thread
of its own; it then reports finished writes by calling the `CompletionSink` given to `open()` from
that thread, with every handle of a batch in one call. The core's sink hands the batch back to its
loop. The store knows nothing of asyncio.

Sequences: every destination numbers its messages 1, 2, 3... in the order they became visible.
A non-transacted message is added with its sequence already assigned. A transacted message is added
with `seq == 0` as soon as it arrives (it is journaled, not held in memory); `commit()` assigns the
sequences, in the order the transaction added its messages, and only then are they visible.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

DEDUP_HEADER = "x-dedup-id"
"""The SEND header whose values a store keeps in each destination's dedup window."""


class StoredMessage:
    """A message as the store keeps it. The core's runtime message extends this class."""

    __slots__ = (
        "body",
        "destination",
        "expires_ms",
        "headers",
        "message_id",
        "persistent",
        "priority",
        "seq",
        "timestamp_ms",
    )

    def __init__(
        self,
        destination: str,
        seq: int,
        message_id: str,
        timestamp_ms: int,
        headers: dict[str, str],
        body: bytes,
        *,
        expires_ms: int = 0,
        priority: int = 4,
        persistent: bool = True,
    ) -> None:
        self.destination = destination
        self.seq = seq
        self.message_id = message_id
        self.timestamp_ms = timestamp_ms
        self.headers = headers
        self.body = body
        self.expires_ms = expires_ms
        self.priority = priority
        self.persistent = persistent

    @property
    def size(self) -> int:
        """Bytes this message accounts for in memory and credit: its body and header text."""
        return len(self.body) + sum(len(k) + len(v) + 2 for k, v in self.headers.items())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.destination}#{self.seq} {self.message_id}>"


class WriteState(enum.Enum):
    """Where a write stands."""

    PENDING = 0
    TAKEN = 1  # the writer took it into a batch: it can no longer be cancelled
    WRITTEN = 2
    CANCELLED = 3
    FAILED = 4


class WriteHandle:
    """One asynchronous store operation. `on_complete` runs on the loop once it is written,
    cancelled or failed (`error` then says why)."""

    __slots__ = ("_lock", "error", "on_complete", "size", "state")

    def __init__(
        self,
        on_complete: Callable[[WriteHandle], None] | None,
        size: int = 0,
        lock: threading.Lock | None = None,
    ) -> None:
        self.on_complete = on_complete
        self.size = size
        self.state = WriteState.PENDING
        self.error: BaseException | None = None
        self._lock = lock

    @property
    def done(self) -> bool:
        """True once written, cancelled or failed."""
        return self.state in (WriteState.WRITTEN, WriteState.CANCELLED, WriteState.FAILED)

    def try_cancel(self) -> bool:
        """Cancel if the writer has not taken it yet. Returns True when cancelled.

        A cancelled handle is still completed through the sink (so whoever waits on it, a
        producer's RECEIPT, is released)."""
        if self._lock is None:
            if self.state is WriteState.PENDING:
                self.state = WriteState.CANCELLED
                return True
            return False
        with self._lock:
            if self.state is WriteState.PENDING:
                self.state = WriteState.CANCELLED
                return True
            return False

    def __repr__(self) -> str:
        return f"<WriteHandle {self.state.name} {self.size}B>"


class BatchTimes:
    """When the journal writer moved one batch along (`time.perf_counter_ns`): it took the batch
    from its queue, began writing its bytes (its records framed), had written them, had synced
    them (`written_ns` when the sync policy does not sync each batch). Shared by the batch's
    timed handles; stamped on the writer thread before the handles go to the sink."""

    __slots__ = ("synced_ns", "taken_ns", "write_ns", "written_ns")

    def __init__(self, taken_ns: int) -> None:
        self.taken_ns = taken_ns
        self.write_ns = taken_ns
        self.written_ns = taken_ns
        self.synced_ns = taken_ns


class TimedWriteHandle(WriteHandle):
    """A handle of a store asked to time its writes (`time.perf_counter_ns`): when `add` began
    (`added_ns`, set here), when the op was queued for the writer (`queued_ns`), and the batch it
    was written in (`batch`, None until written: a cancelled or failed write has none)."""

    __slots__ = ("added_ns", "batch", "queued_ns")

    def __init__(
        self,
        on_complete: Callable[[WriteHandle], None] | None,
        size: int = 0,
        lock: threading.Lock | None = None,
    ) -> None:
        self.added_ns = time.perf_counter_ns()
        super().__init__(on_complete, size, lock)
        self.queued_ns = self.added_ns
        self.batch: BatchTimes | None = None


CompletionSink = Callable[[Sequence[WriteHandle]], None]
"""Called by the store, possibly from its writer thread, with a batch of finished handles."""


@dataclass
class RecoveredDestination:
    """What the store holds for one destination after `open()`."""

    name: str
    last_seq: int
    message_count: int
    message_bytes: int
    # Highest sequence that may have been dispatched before the stop: messages at or below it are
    # redelivered with `redelivered:true`.
    dispatch_mark: int = 0
    # The most recent `x-dedup-id`s (of non-transacted adds, and of transacted ones at commit),
    # oldest first, at most the configured window.
    dedup_ids: list[str] = field(default_factory=list)


@dataclass
class RecoveredSubscription:
    """A durable topic subscription and its cursor (last sequence it acknowledged)."""

    client_id: str
    name: str
    destination: str
    selector: str | None
    cursor: int


@dataclass
class Recovery:
    """The store's state after `open()`, and what recovery had to do to reach it."""

    destinations: list[RecoveredDestination] = field(default_factory=list)
    subscriptions: list[RecoveredSubscription] = field(default_factory=list)
    # Human-readable lines: tails cut, records skipped by repair, index rebuilt, and so on.
    report: list[str] = field(default_factory=list)


SYNC_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds, in seconds, of the buckets the journal counts its syncs' durations in (the
last bucket, beyond 2.5 s, has none): a Prometheus histogram's `le`s."""


@dataclass
class StoreStats:
    """Numbers the broker exposes and uses for flow control."""

    disk_bytes: int = 0
    pending_writes: int = 0
    pending_write_bytes: int = 0
    files: int = 0
    written_records: int = 0
    cancelled_writes: int = 0
    batches: int = 0
    syncs: int = 0
    # A write or sync failed: the store stops accepting writes until it is reopened.
    write_errors: int = 0
    checkpoints: int = 0
    gc_deleted_files: int = 0
    gc_archived_files: int = 0
    compacted_files: int = 0
    # Message records that failed their checks when read back: reported, counted and dropped.
    damaged_records: int = 0
    # Disk as a bounded resource (journal store; a store without a disk leaves these alone).
    # What the store holds: `disk_bytes` less the space preallocated and not written yet.
    data_bytes: int = 0
    # Space the store has taken on the disk and not written yet (the rest of the file being
    # written, a data file prepared ahead): writes go there without needing more disk.
    preallocated_bytes: int = 0
    # Free bytes on the store's filesystem; -1 for a store without a disk.
    disk_free_bytes: int = -1
    # The store could not get the space for its next data file (it goes on once it can).
    no_space: bool = False
    # Batches refused for lack of space before any of their bytes were written.
    no_space_errors: int = 0
    # When (ms since the epoch, 0: not since the store opened) the index was last committed, a
    # collection last ran, and one last compacted files.
    last_checkpoint_ms: int = 0
    last_gc_ms: int = 0
    last_compaction_ms: int = 0
    # The syncs' durations: how many fell in each bucket of SYNC_BUCKETS_S and beyond (not
    # cumulative; empty for a store that never synced), and their sum.
    sync_bucket_counts: tuple[int, ...] = ()
    sync_seconds_total: float = 0.0
    # A store on a database server: its connection is lost and being made again (writes wait,
    # reads fail with `StoreOfflineError`), and how many times it was made again.
    unavailable: bool = False
    reconnects: int = 0


@dataclass(frozen=True)
class DataFileView:
    """A data file of a journal and what keeps it, as the index's last checkpoint has it:
    its live messages (`live_by_destination`, with the lowest sequence of each in
    `oldest_by_destination`), the state records in it (`state_of`: destinations and durable
    subscriptions), open transactions' records, and the files that must go before it."""

    number: int
    name: str
    size_bytes: int
    data_bytes: int
    live_messages: int
    live_bytes: int
    pins: int
    transaction_pins: int
    live_by_destination: dict[str, int]
    oldest_by_destination: dict[str, int]
    state_of: list[str]
    depends_on: list[int]
    # The file the store writes to now (never collected).
    head: bool


@dataclass(frozen=True)
class ArchiveView:
    """The files collection moved to the archive instead of deleting them."""

    directory: str
    files: int
    bytes: int
    oldest: str | None
    newest: str | None


@dataclass(frozen=True)
class StoreView:
    """What a store holds on disk, for operators (`MessageStore.inspect`). A store without
    files (memory) has none; `checkpoint` is the journal position (file, offset) up to which
    the index reflects it, and what the files say is as of then. `complete` is False when the
    messages were too many to attribute all of them (`messages_scanned` were)."""

    kind: str
    directory: str | None = None
    files: list[DataFileView] = field(default_factory=list)
    checkpoint: tuple[int, int] | None = None
    head: tuple[int, int] | None = None
    archive: ArchiveView | None = None
    messages_scanned: int = 0
    complete: bool = True


class Fence(Protocol):
    """Whether this process may still write to a store another process may take over (high
    availability, `sluice.ha`). A store given a fence checks it before each batch it writes and
    again before it confirms one: a broker that lost its lease writes nothing more and confirms
    nothing written after it was lost."""

    def check(self) -> None:
        """Return if this process still holds the store; raise `FencedError` otherwise. Cheap: a
        clock read and a comparison, called for every write batch."""
        ...


class OpenTransaction(Protocol):
    """What a store keeps of a transaction until its commit: at least its adds."""

    @property
    def adds(self) -> Sized:
        """The transaction's adds, in order."""
        ...


TxT = TypeVar("TxT", bound=OpenTransaction)


def take_for_commit(txs: dict[str, TxT], txid: str, seqs: Sequence[int]) -> TxT | None:
    """Remove and return transaction `txid` (None if it was never begun or holds nothing),
    checking that the commit gives one sequence for each of its adds (a ValueError if not, the
    transaction then left open)."""
    tx = txs.get(txid)
    adds = len(tx.adds) if tx is not None else 0
    if len(seqs) != adds:
        raise ValueError(f"commit of {txid}: {len(seqs)} sequences for {adds} adds")
    return txs.pop(txid, None)


@dataclass(frozen=True)
class StoreCapabilities:
    """What a store declares it can do, beyond the contract every store keeps.

    `pages_to_disk`: messages it holds may be dropped from memory and read back with `load()`
    (the broker then keeps only a window of a long queue in memory). `durable`: what it holds
    survives a restart of the process. `data_files`: it keeps data files of its own that
    `inspect()` describes, collects and compacts."""

    pages_to_disk: bool
    durable: bool
    data_files: bool


class MessageStore(Protocol):
    """What the core needs from a store. Methods marked async return a `WriteHandle`."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """What this store can do (declared by its class, never probed)."""
        ...

    def open(self, sink: CompletionSink) -> Recovery:
        """Open (recovering if needed) and return what is stored."""
        ...

    def close(self) -> None:
        """Flush pending writes, checkpoint, and release files."""
        ...

    def add(
        self,
        message: StoredMessage,
        on_complete: Callable[[WriteHandle], None] | None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Async: store a message (its `seq` is 0 when `txid` is given)."""
        ...

    def remove(
        self,
        destination: str,
        seq: int,
        on_complete: Callable[[WriteHandle], None] | None = None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Async: the message was consumed. If its add is still pending and no transaction is
        involved, the add is cancelled and nothing is written for either: both handles end
        CANCELLED and both go through the sink. (The journal store still writes adds that carry
        an `x-dedup-id`, so the id stays in the persisted window.)"""
        ...

    def remove_range(self, destination: str, upto_seq: int) -> WriteHandle:
        """Async: drop every message of a destination up to and including `upto_seq` (topic
        retention and cursors)."""
        ...

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        """Committed, unremoved messages with `seq > after_seq`, ascending, at most `max_count`
        and at least one even if it alone exceeds `max_bytes`. A message whose record cannot
        be read back intact is dropped (reported, counted in `damaged_records`) and the page
        goes on with the next ones, so a short page still means nothing more is stored."""
        ...

    def first_seq(self, destination: str, at_or_after_ms: int = 0) -> int:
        """Lowest stored sequence (0 if none); with a time, the first at or after it."""
        ...

    def begin(self, txid: str) -> None:
        """Start a transaction (journaled lazily with its first operation)."""
        ...

    def commit(
        self, txid: str, seqs: Sequence[int], on_complete: Callable[[WriteHandle], None] | None
    ) -> WriteHandle:
        """Async: make the transaction's adds visible with these sequences, in add order, and
        apply its removes. Raises ValueError, leaving the transaction open, when the number of
        sequences differs from the number of adds."""
        ...

    def abort(self, txid: str) -> None:
        """Forget the transaction; its adds never become visible."""
        ...

    def mark_dispatched(self, destination: str, seq: int) -> WriteHandle:
        """Async: messages of `destination` up to `seq` may be dispatched from now on (the
        destination is created if it does not exist; the mark is reported by `open()`)."""
        ...

    def delete_destination(self, destination: str) -> WriteHandle:
        """Async: drop a destination and every message it has. Removes of its messages in
        open transactions are dropped too: a commit never removes a message of the destination
        created again under the same sequence."""
        ...

    def put_subscription(self, sub: RecoveredSubscription) -> WriteHandle:
        """Async: create or replace a durable subscription (with its cursor)."""
        ...

    def delete_subscription(self, client_id: str, name: str) -> WriteHandle:
        """Async: drop a durable subscription."""
        ...

    def set_cursor(self, client_id: str, name: str, seq: int) -> None:
        """A durable subscription acknowledged up to `seq`. Persisted with the next write or
        checkpoint (a cursor that lags after a crash only causes marked redelivery)."""
        ...

    def stats(self) -> StoreStats:
        """Current numbers."""
        ...

    def inspect(self, max_messages: int) -> StoreView:
        """What the store holds on disk, file by file, attributing at most `max_messages` live
        messages to their destinations. A read that may take a while (it reads the index): the
        one method meant to be called off the event loop, from any thread."""
        ...
