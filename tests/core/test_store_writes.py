"""Store writes as the core sees them: every pending write is released whatever becomes of the
message, a failed write is never acknowledged and withdraws its message, transactions are
bounded."""

from __future__ import annotations

from typing import Any

import pytest

from failing_store import FailingStore
from held_store import HeldStore
from sluice.core.connection import SubscribeOptions
from sluice.core.message import AckMode
from sluice.core.services import FlowReason
from sluice.errors import LimitExceeded, StoreUnavailableError
from sluice.store.api import StoredMessage, WriteHandle

from .fakes import Harness


@pytest.mark.parametrize("subscriber", [None, "plain", "wildcard"])
def test_persistent_topic_sends_nothing_stores_never_pause_producers(
    subscriber: str | None,
) -> None:
    h = Harness(limits={"max_async_writes": 20})
    if subscriber is not None:
        listener, _ = h.connect()
        pattern = "/topic/ticks" if subscriber == "plain" else "/topic/>"
        listener.subscribe("s", pattern, AckMode.AUTO)
    producer, producer_link = h.connect()
    other, other_link = h.connect()
    for i in range(500):
        h.send(producer, "/topic/ticks", b"%d" % i, persistent=True)
        assert FlowReason.PENDING_WRITES not in producer_link.paused, i
    assert len(h.receipts) == 500
    assert h.broker.pending_writes == 0
    assert h.broker.pending_write_bytes == 0
    h.send(other, "/queue/orders", b"o", persistent=True)
    assert not other_link.paused
    assert h.broker.counters["flow_paused_pending_writes"] == 0


def test_pending_writes_balance_for_every_outcome() -> None:
    """Queue, topic kept for a durable, duplicate, dead letter, stream abort marker."""
    h = Harness(policy={"max_redeliveries": 0})
    keeper, _ = h.connect("keeper")
    keeper.subscribe("d", "/topic/kept", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL)
    producer, _ = h.connect()
    h.send(producer, "/topic/kept", b"t", persistent=True)
    h.send(producer, "/queue/q", b"q", persistent=True, headers={"x-dedup-id": "1"})
    h.send(producer, "/queue/q", b"q", persistent=True, headers={"x-dedup-id": "1"})
    consumer.nack(link.take()[0][2])  # to the DLQ
    h.send(producer, "/queue/s", b"c0", persistent=True, headers={"x-stream-id": "f"})
    producer.close()  # the open stream gets an abort marker
    h.loop.run()
    assert h.broker.counters["dead_lettered"] == 1
    assert h.broker.counters["streams_aborted"] == 1
    assert h.broker.pending_writes == 0
    assert h.broker.pending_write_bytes == 0


def _sent(h: Harness, conn: object, dest: str, body: bytes, **kw: object) -> list[object]:
    """Send; return what `on_stored` was called with."""
    outcome: list[object] = []
    message = h.message(dest, body, **kw)  # type: ignore[arg-type]

    def stored(handle: WriteHandle | None) -> None:
        outcome.append(handle.error if handle is not None else None)

    conn.send(message, stored)  # type: ignore[attr-defined]
    h.loop.run()
    return outcome


@pytest.mark.parametrize("concurrent", [True, False])
def test_a_failed_write_is_reported_and_its_message_withdrawn(concurrent: bool) -> None:
    store = FailingStore()
    h = Harness(store, store={"concurrent_store_and_dispatch_queues": concurrent})
    producer, _ = h.connect()
    assert _sent(h, producer, "/queue/q", b"kept", persistent=True) == [None]
    store.fail_writes()
    (error,) = _sent(h, producer, "/queue/q", b"lost", persistent=True)
    assert error is not None
    assert h.broker.store_failed
    assert h.broker.counters["store_write_errors"] == 1
    assert h.broker.pending_writes == 0
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.AUTO)
    h.loop.run()
    assert link.bodies() == [b"kept"]
    # From now on persistent messages are refused; non-persistent ones still flow.
    with pytest.raises(StoreUnavailableError, match="store failed"):
        _sent(h, producer, "/queue/q", b"refused", persistent=True)
    assert h.broker.counters["sends_refused_store_failed"] == 1
    assert _sent(h, producer, "/queue/q", b"memory only") == [None]
    assert link.bodies() == [b"kept", b"memory only"]


def test_a_message_waiting_for_its_write_is_not_also_read_back_from_the_store() -> None:
    """Concurrent store and dispatch off: a queue message waits in memory for its write, and the
    journal shows it to a page read at once. A dispatch pass in between must not read a second
    copy: that one would be delivered and acknowledged, and the first delivered again (not
    marked redelivered) once the write completed."""
    store = HeldStore(pages_to_disk=True)
    h = Harness(store, store={"concurrent_store_and_dispatch_queues": False})
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL)
    producer, _ = h.connect()
    h.send(producer, "/queue/q", b"first", persistent=True)
    ((_, _, first_tag, _),) = link.take()
    store.holding = True
    h.send(producer, "/queue/q", b"second", persistent=True)
    consumer.ack(first_tag)  # a dispatch pass while the write of "second" is in flight
    h.loop.run()
    deliveries = link.take()
    for _, _, tag, _ in deliveries:
        consumer.ack(tag)
    store.release()
    h.loop.run()
    deliveries += link.take()
    assert [(m.body, count) for _, m, _, count in deliveries] == [(b"second", 1)]
    assert h.broker.destinations["/queue/q"].depth == 0


class _ClosableStore(HeldStore):
    """A held, paging store that records whatever the broker asks of it after `close()` (the
    journal's index is gone by then)."""

    def __init__(self) -> None:
        super().__init__(pages_to_disk=True)
        self.closed = False
        self.after_close: list[str] = []

    def close(self) -> None:
        self.closed = True
        # The journal completes what it flushes at close: those completions come afterwards.
        self.release()

    def _touch(self, what: str) -> None:
        if self.closed:
            self.after_close.append(what)

    def add(self, message: StoredMessage, on_complete: Any, txid: str | None = None) -> WriteHandle:
        self._touch("add")
        return super().add(message, on_complete, txid)

    def remove(
        self, destination: str, seq: int, on_complete: Any = None, txid: str | None = None
    ) -> WriteHandle:
        self._touch("remove")
        return super().remove(destination, seq, on_complete, txid)

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        self._touch(f"load {destination}")
        return super().load(destination, after_seq, max_count, max_bytes)

    def mark_dispatched(self, destination: str, seq: int) -> WriteHandle:
        self._touch("mark_dispatched")
        return super().mark_dispatched(destination, seq)


@pytest.mark.parametrize("concurrent", [True, False])
def test_nothing_touches_the_store_after_the_broker_closed_it(concurrent: bool) -> None:
    """At a stop, closing the connections dead-letters what they held past `max_redeliveries`.
    What that leaves queued on the loop when the store is closed must not touch it: the queue's
    dispatch pass (memory is free again: it would read its backlog back), the DLQ's writes
    (with concurrent store and dispatch off, completed by the close's flush) and the passes
    they set off."""
    store = _ClosableStore()
    h = Harness(
        store,
        policy={"max_redeliveries": 0},
        limits={"destination_memory_limit_bytes": 250},
        store={"concurrent_store_and_dispatch_queues": concurrent},
    )
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(prefetch=3))
    producer, _ = h.connect()
    for n in range(6):
        h.send(producer, "/queue/q", b"%d" % n * 100, persistent=True)
    assert len(link.take()) == 3  # the other three wait in the store alone
    store.holding = True
    h.broker.shutting_down = True
    consumer.close()
    producer.close()
    assert h.broker.counters["dead_lettered"] == 3
    h.broker.close()
    h.loop.run()
    assert store.after_close == []


def test_a_failed_topic_write_is_never_delivered() -> None:
    store = FailingStore()
    h = Harness(store)
    keeper, _ = h.connect("k")
    keeper.subscribe("d", "/topic/t", AckMode.AUTO, SubscribeOptions(durable_name="n"))
    keeper.close()
    listener, link = h.connect()
    listener.subscribe("s", "/topic/t", AckMode.AUTO)
    producer, _ = h.connect()
    _sent(h, producer, "/topic/t", b"one", persistent=True)
    store.fail_writes()
    (error,) = _sent(h, producer, "/topic/t", b"two", persistent=True)
    assert error is not None
    assert link.bodies() == [b"one"]
    assert _sent(h, producer, "/topic/t", b"three") == [None]
    assert link.bodies() == [b"one", b"three"]


def test_a_failed_commit_shows_nothing_and_does_not_count_its_dedup_ids() -> None:
    store = FailingStore()
    h = Harness(store)
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/t", AckMode.CLIENT_INDIVIDUAL)
    producer, _ = h.connect()
    h.send(producer, "/queue/t", b"acked in the transaction", persistent=True)
    (first,) = link.take()
    consumer.begin("tx")
    consumer.ack(first[2], "tx")
    h.send(consumer, "/queue/t", b"sent", txid="tx", persistent=True, headers={"x-dedup-id": "k"})
    store.fail_writes()
    outcome: list[str] = []
    consumer.commit("tx", lambda: outcome.append("done"), lambda: outcome.append("failed"))
    h.loop.run()
    assert outcome == ["failed"]
    assert "k" not in h.broker.destinations["/queue/t"].dedup
    # The acknowledged message comes back; the sent one never shows.
    assert [(m.body, count) for _, m, _, count in link.take()] == [(b"acked in the transaction", 2)]
    assert h.broker.usage.used == len(b"acked in the transaction")


def test_transaction_message_count_is_bounded() -> None:
    h = Harness(limits={"max_transaction_messages": 3})
    producer, _ = h.connect()
    producer.begin("tx")
    for i in range(3):
        h.send(producer, "/queue/q", b"%d" % i, txid="tx")
    with pytest.raises(LimitExceeded, match="max_transaction_messages=3"):
        h.send(producer, "/queue/q", b"one too many", txid="tx")
    assert h.broker.counters["limit_max_transaction_messages"] == 1


def test_transaction_held_bytes_are_bounded_and_released() -> None:
    h = Harness(limits={"max_transaction_held_bytes": 4096})
    producer, _ = h.connect()
    producer.begin("tx")
    h.send(producer, "/queue/q", b"x" * 1000, txid="tx")
    assert h.broker.usage.used > 1000
    with pytest.raises(LimitExceeded, match="max_transaction_held_bytes=4096"):
        h.send(producer, "/queue/q", b"x" * 4000, txid="tx")
    assert h.broker.counters["limit_max_transaction_held_bytes"] == 1
    producer.abort("tx")
    assert h.broker.usage.used == 0
