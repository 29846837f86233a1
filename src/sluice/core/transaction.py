"""A transaction: the messages sent and the deliveries acknowledged inside BEGIN ... COMMIT.

A transaction never holds its messages in memory (DESIGN.md section 4). Each transacted message
is written as it arrives, marked with the transaction: a persistent one to the store, a
non-persistent one to the temp store (where non-persistent messages spool). The transaction keeps
a body-less stub of each for COMMIT, which gives them their sequences and, once written, makes
them visible; the destination reads the bodies back. ABORT makes the stores forget them. Only the
memory store, which pages nothing, leaves the messages themselves in memory.

Bounds: `max_transaction_messages` and `max_transaction_held_bytes` (the stubs) per transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sluice.core.message import DEDUP_ID, Message
from sluice.errors import LimitExceeded

if TYPE_CHECKING:
    from sluice.core.broker import Broker
    from sluice.core.destination import Destination
    from sluice.core.subscription import Subscription
    from sluice.store.api import MessageStore, WriteHandle

log = logging.getLogger(__name__)

# What a stub costs beyond its header text (the objects and the list entry), counted against
# `max_transaction_held_bytes`.
STUB_OVERHEAD_BYTES = 256


class Taken(Protocol):
    """A waiting message an operator took out of its queue for this transaction to remove
    (`picking.Taken`)."""

    @property
    def message(self) -> Message:
        """The message taken."""
        ...

    def settle(self) -> None:
        """Its removal is written: its queue forgets it."""
        ...

    def give_back(self) -> None:
        """The transaction failed: it waits in its queue again."""
        ...


@dataclass
class _CommitPlan:
    """What a COMMIT writes, and what it must undo if the write fails."""

    seqs: list[int] = field(default_factory=list)
    temp_seqs: list[int] = field(default_factory=list)
    # Indexes into `Transaction.adds` of sends whose dedup id was committed meanwhile.
    duplicates: set[int] = field(default_factory=set)
    registered: list[tuple[Destination, str]] = field(default_factory=list)


class Transaction:
    """One open transaction of a connection."""

    __slots__ = (
        "acks",
        "adds",
        "broker",
        "check_dedup",
        "held_bytes",
        "id",
        "store_id",
        "taken",
        "uses_temp_store",
    )

    def __init__(
        self, broker: Broker, txid: str, store_id: str, *, check_dedup: bool = True
    ) -> None:
        self.broker = broker
        self.id = txid
        self.store_id = store_id
        # Stubs of the messages sent (the whole message only with the memory store).
        self.adds: list[tuple[Destination, Message]] = []
        self.acks: list[tuple[Subscription, int, Message]] = []
        # Waiting messages an operator took out of their queues, removed at COMMIT.
        self.taken: list[Taken] = []
        # Drop sends whose `x-dedup-id` was seen (a producer's retry); an operator moving a
        # message sends it again on purpose, and turns this off.
        self.check_dedup = check_dedup
        # Memory the transaction holds until it ends (counted in the broker's usage).
        self.held_bytes = 0
        # Non-persistent messages of the transaction were written to the temp store.
        self.uses_temp_store = False

    def add(self, destination: Destination, message: Message) -> bool:
        """Write a transacted message as it arrives and keep its stub. Returns True when the
        transaction holds the message itself (the memory store): memory then bounds its
        producer."""
        broker = self.broker
        limits = broker.limits
        if len(self.adds) >= limits.max_transaction_messages:
            broker.count("limit_max_transaction_messages")
            raise LimitExceeded(
                "max_transaction_messages",
                limits.max_transaction_messages,
                f"transaction {self.id}",
            )
        store: MessageStore | None
        if message.persistent:
            store = broker.store if broker.store_pages else None
        else:
            store = broker.temp_store
        kept = message.without_body() if store is not None else message
        held = kept.nbytes + STUB_OVERHEAD_BYTES
        if self.held_bytes + held > limits.max_transaction_held_bytes:
            broker.count("limit_max_transaction_held_bytes")
            raise LimitExceeded(
                "max_transaction_held_bytes",
                limits.max_transaction_held_bytes,
                f"transaction {self.id}",
            )
        if store is not None:
            if not message.persistent:
                message.spooled = kept.spooled = True
                kept.in_store = False
                if not self.uses_temp_store:
                    self.uses_temp_store = True
                    store.begin(self.store_id)
            broker.track_write(message)
            store.add(message, broker.write_done, self.store_id)
        elif message.persistent:
            # The memory store keeps the message itself (and so does the transaction).
            broker.track_write(message)
            broker.store.add(message, broker.write_done, self.store_id)
        self.adds.append((destination, kept))
        destination.pins += 1
        self.held_bytes += held
        broker.usage.add(held)
        return store is None

    def take(self, taken: Taken) -> None:
        """Remove a message an operator took out of its queue, at COMMIT, with the sends: a
        stored one with the transaction's records (so the store removes it if and only if the
        COMMIT is written)."""
        message = taken.message
        if message.in_store:
            self.broker.store.remove(message.destination, message.seq, None, self.store_id)
        self.taken.append(taken)

    def commit(self, on_done: Callable[[], None], on_failed: Callable[[], None] | None) -> None:
        """Make the sends visible and the acks final: `on_done` once written, or `on_failed`
        if the store failed to write the COMMIT (nothing of it then shows)."""
        plan = self._plan_commit()
        broker = self.broker
        failed = False
        waiting = 1

        def written(handle: WriteHandle | None) -> None:
            nonlocal failed, waiting
            if handle is not None and handle.error is not None:
                if not failed:
                    broker.write_failed(handle.error)
                failed = True
            waiting -= 1
            if waiting:
                return
            broker.usage.release(self.held_bytes)
            self._unpin()
            if not failed:
                self._publish(plan)
                on_done()
                return
            self._commit_failed(plan.duplicates, plan.registered)
            if on_failed is not None:
                on_failed()

        temp_store = broker.temp_store
        if self.uses_temp_store and temp_store is not None:
            waiting += 1
            temp_store.commit(self.store_id, plan.temp_seqs, written)
        if (
            plan.seqs
            or any(m.in_store for _, _, m in self.acks)
            or any(t.message.in_store for t in self.taken)
        ):
            broker.store.commit(self.store_id, plan.seqs, written)
        else:
            broker.store.abort(self.store_id)
            written(None)

    def _plan_commit(self) -> _CommitPlan:
        """Sequences for the sends, duplicates (by `x-dedup-id`) set aside, dedup ids taken."""
        plan = _CommitPlan()
        broker = self.broker
        for i, (destination, message) in enumerate(self.adds):
            dedup_id = message.headers.get(DEDUP_ID) if self.check_dedup else None
            if dedup_id is not None:
                if dedup_id in destination.dedup:
                    # Committed by someone else since it was sent: keep only the first.
                    plan.duplicates.add(i)
                    broker.count("duplicates_dropped")
                    if message.persistent or message.spooled:
                        # The store needs a sequence for every add; this one is removed at once.
                        message.seq = destination.next_seq()
                        (plan.seqs if message.persistent else plan.temp_seqs).append(message.seq)
                    continue
                destination.dedup.add(dedup_id)
                plan.registered.append((destination, dedup_id))
            destination.reserve_committed(message)
            if message.persistent:
                plan.seqs.append(message.seq)
            elif message.spooled:
                plan.temp_seqs.append(message.seq)
        return plan

    def _publish(self, plan: _CommitPlan) -> None:
        """The COMMIT is written: its sends show (duplicates are removed), its acks settle."""
        broker = self.broker
        for i, (destination, message) in enumerate(self.adds):
            if i in plan.duplicates:
                if message.persistent:
                    broker.store.remove(destination.name, message.seq)
                elif message.spooled and broker.temp_store is not None:
                    broker.temp_store.remove(destination.name, message.seq)
                continue
            destination.publish_committed(message)
        for sub, _tag, message in self.acks:
            sub.destination.settle(sub, message, store_removed=True)
        for taken in self.taken:
            taken.settle()

    def _commit_failed(
        self, duplicates: set[int], registered: list[tuple[Destination, str]]
    ) -> None:
        """The COMMIT was not written: none of its messages show, its dedup ids do not count
        (a retry is not a duplicate), and what it acknowledged is delivered again."""
        log.error("the COMMIT of transaction %s was not written: the store failed", self.id)
        for i, (destination, message) in enumerate(self.adds):
            if i not in duplicates:
                destination.withdraw(message)
        for destination, dedup_id in registered:
            destination.dedup.discard(dedup_id)
        self._requeue_acks()
        self._give_back()

    def rollback(self) -> None:
        """ABORT (or the connection ended): the stores forget the sends; what was acknowledged
        is delivered again."""
        broker = self.broker
        broker.store.abort(self.store_id)
        if self.uses_temp_store and broker.temp_store is not None:
            broker.temp_store.abort(self.store_id)
        broker.usage.release(self.held_bytes)
        self._unpin()
        self._requeue_acks()
        self._give_back()

    def _give_back(self) -> None:
        for taken in self.taken:
            taken.give_back()
        self.taken.clear()

    def _unpin(self) -> None:
        """The transaction ended: its destinations may be removed when idle."""
        for destination, _message in self.adds:
            destination.pins -= 1

    def _requeue_acks(self) -> None:
        by_sub: dict[Subscription, list[tuple[int, Message]]] = {}
        for sub, tag, message in self.acks:
            by_sub.setdefault(sub, []).append((tag, message))
        for sub, deliveries in by_sub.items():
            sub.destination.requeue(sub, deliveries, redelivered=True)
