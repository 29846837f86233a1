"""The in-memory store: the reference implementation of `MessageStore`.

It keeps references to the messages it is given (no copies) and completes every write at once,
through the completion sink, so callers see the same asynchronous shape as with the journal. Used
for `--store memory` and as the model the contract tests hold the journal store to.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from sluice.config import DEFAULT_DEDUP_WINDOW
from sluice.store.api import (
    DEDUP_HEADER,
    CompletionSink,
    RecoveredDestination,
    RecoveredSubscription,
    Recovery,
    StoreCapabilities,
    StoredMessage,
    StoreStats,
    StoreView,
    WriteHandle,
    WriteState,
    take_for_commit,
)


@dataclass
class _Tx:
    adds: list[StoredMessage] = field(default_factory=list)
    removes: list[tuple[str, int]] = field(default_factory=list)


class MemoryStore:
    """Keeps everything in process memory; nothing survives a restart."""

    capabilities = StoreCapabilities(pages_to_disk=False, durable=False, data_files=False)

    def __init__(self, dedup_window: int = DEFAULT_DEDUP_WINDOW) -> None:
        self._sink: CompletionSink | None = None
        self._dedup_window = dedup_window
        self._dedup: dict[str, deque[str]] = {}
        self._dispatch_marks: dict[str, int] = {}
        self._destinations: dict[str, SortedDict] = {}
        self._last_seq: dict[str, int] = {}
        self._txs: dict[str, _Tx] = {}
        self._subs: dict[tuple[str, str], RecoveredSubscription] = {}
        self._stats = StoreStats()
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self, sink: CompletionSink) -> Recovery:
        """Start empty (or with what this instance already holds)."""
        self._sink = sink
        return Recovery(
            destinations=[
                RecoveredDestination(
                    name=name,
                    last_seq=self._last_seq.get(name, 0),
                    message_count=len(msgs),
                    message_bytes=sum(m.size for m in msgs.values()),
                    dispatch_mark=self._dispatch_marks.get(name, 0),
                    dedup_ids=list(self._dedup.get(name, ())),
                )
                for name, msgs in self._destinations.items()
            ],
            subscriptions=list(self._subs.values()),
        )

    def close(self) -> None:
        """Nothing to flush."""

    # -- helpers -----------------------------------------------------------------------------

    def _complete(
        self, on_complete: Callable[[WriteHandle], None] | None, size: int = 0
    ) -> WriteHandle:
        handle = WriteHandle(on_complete, size)
        handle.state = WriteState.WRITTEN
        self._stats.written_records += 1
        if self._sink is not None:
            self._sink((handle,))
        return handle

    def _remember_dedup(self, message: StoredMessage) -> None:
        dedup_id = message.headers.get(DEDUP_HEADER)
        if dedup_id and self._dedup_window > 0:
            window = self._dedup.get(message.destination)
            if window is None:
                window = self._dedup[message.destination] = deque(maxlen=self._dedup_window)
            window.append(dedup_id)

    def _messages(self, destination: str) -> SortedDict:
        msgs = self._destinations.get(destination)
        if msgs is None:
            msgs = self._destinations[destination] = SortedDict()
        return msgs

    # -- messages ----------------------------------------------------------------------------

    def add(
        self,
        message: StoredMessage,
        on_complete: Callable[[WriteHandle], None] | None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Keep a reference to the message (held by its transaction until commit)."""
        if txid is not None:
            self._txs.setdefault(txid, _Tx()).adds.append(message)
        else:
            self._messages(message.destination)[message.seq] = message
            if message.seq > self._last_seq.get(message.destination, 0):
                self._last_seq[message.destination] = message.seq
            self._remember_dedup(message)
        return self._complete(on_complete, message.size)

    def remove(
        self,
        destination: str,
        seq: int,
        on_complete: Callable[[WriteHandle], None] | None = None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Drop one message (at commit when transacted)."""
        if txid is not None:
            self._txs.setdefault(txid, _Tx()).removes.append((destination, seq))
        else:
            msgs = self._destinations.get(destination)
            if msgs is not None:
                msgs.pop(seq, None)
        return self._complete(on_complete)

    def remove_range(self, destination: str, upto_seq: int) -> WriteHandle:
        """Drop every message up to and including `upto_seq`."""
        msgs = self._destinations.get(destination)
        if msgs is not None:
            while msgs and msgs.peekitem(0)[0] <= upto_seq:
                msgs.popitem(0)
        return self._complete(None)

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        """Messages after `after_seq`, ascending, within the count and byte budget."""
        msgs = self._destinations.get(destination)
        if not msgs:
            return []
        out: list[StoredMessage] = []
        total = 0
        for seq in msgs.irange(minimum=after_seq, inclusive=(False, True)):
            message: StoredMessage = msgs[seq]
            size = message.size
            if out and (len(out) >= max_count or total + size > max_bytes):
                break
            out.append(message)
            total += size
        return out

    def first_seq(self, destination: str, at_or_after_ms: int = 0) -> int:
        """Lowest stored sequence, or the first stamped at or after `at_or_after_ms`."""
        msgs = self._destinations.get(destination)
        if not msgs:
            return 0
        for seq, message in msgs.items():
            if message.timestamp_ms >= at_or_after_ms:
                return int(seq)
        return 0

    # -- transactions --------------------------------------------------------------------------

    def begin(self, txid: str) -> None:
        """Open a transaction."""
        self._txs.setdefault(txid, _Tx())

    def commit(
        self, txid: str, seqs: Sequence[int], on_complete: Callable[[WriteHandle], None] | None
    ) -> WriteHandle:
        """Assign sequences to the transaction's adds and apply its removes."""
        tx = take_for_commit(self._txs, txid, seqs) or _Tx()
        for message, seq in zip(tx.adds, seqs, strict=True):
            message.seq = seq
            self._messages(message.destination)[seq] = message
            if seq > self._last_seq.get(message.destination, 0):
                self._last_seq[message.destination] = seq
            self._remember_dedup(message)
        for destination, seq in tx.removes:
            msgs = self._destinations.get(destination)
            if msgs is not None:
                msgs.pop(seq, None)
        return self._complete(on_complete)

    def abort(self, txid: str) -> None:
        """Forget the transaction."""
        self._txs.pop(txid, None)

    # -- destinations, subscriptions ---------------------------------------------------------

    def mark_dispatched(self, destination: str, seq: int) -> WriteHandle:
        """Remember the mark (reported by `open()` on this instance)."""
        self._messages(destination)
        self._dispatch_marks[destination] = seq
        return self._complete(None)

    def delete_destination(self, destination: str) -> WriteHandle:
        """Drop the destination and its messages; open transactions forget their removes
        of them."""
        self._destinations.pop(destination, None)
        for tx in self._txs.values():
            tx.removes = [(name, seq) for name, seq in tx.removes if name != destination]
        self._last_seq.pop(destination, None)
        self._dispatch_marks.pop(destination, None)
        self._dedup.pop(destination, None)
        return self._complete(None)

    def put_subscription(self, sub: RecoveredSubscription) -> WriteHandle:
        """Create or replace a durable subscription."""
        self._subs[(sub.client_id, sub.name)] = sub
        return self._complete(None)

    def delete_subscription(self, client_id: str, name: str) -> WriteHandle:
        """Drop a durable subscription."""
        self._subs.pop((client_id, name), None)
        return self._complete(None)

    def set_cursor(self, client_id: str, name: str, seq: int) -> None:
        """Move a durable cursor."""
        sub = self._subs.get((client_id, name))
        if sub is not None:
            sub.cursor = seq

    def stats(self) -> StoreStats:
        """Counts of what is held."""
        return self._stats

    def inspect(self, max_messages: int) -> StoreView:
        """Nothing on disk: the memory store has no files."""
        return StoreView("memory")
