"""An operator's operations on a queue's messages (`sluice.core.operations`), in the core with a
fake loop: seeded random lives in which producers send, a consumer takes, acknowledges and
leaves, paging reads and evicts, and moves run in steps whose COMMIT completes while all that
goes on; at the end every message sent was acknowledged exactly once, from its queue or from the
target it was moved to, and the queue's counts agree with what the store holds. Also the evicted
index's `find` and `remove` against a model."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sluice.core.message import AckMode
from sluice.core.operations import Action, MessageFilter, MessageOperation
from sluice.core.paging import Evicted
from sluice.core.paging import pending_key as _key
from sluice.core.picking import Place
from sluice.core.queue import Queue
from sluice.store.api import StoreCapabilities, StoredMessage
from sluice.store.memory import MemoryStore

from .fakes import FakeLink, Harness

SOURCE = "/queue/src"
TARGET = "/queue/dst"
_BIG = 1 << 40


class _PagingStore(MemoryStore):
    """A memory store the broker pages to, which reads back copies as a disk store does (the
    plain memory store hands back the objects it was given)."""

    capabilities = StoreCapabilities(pages_to_disk=True, durable=False, data_files=False)

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        return [
            StoredMessage(
                m.destination,
                m.seq,
                m.message_id,
                m.timestamp_ms,
                dict(m.headers),
                m.body,
                expires_ms=m.expires_ms,
                priority=m.priority,
                persistent=m.persistent,
            )
            for m in super().load(destination, after_seq, max_count, max_bytes)
        ]


def _stored(h: Harness, name: str) -> list[str]:
    return [m.message_id for m in h.store.load(name, 0, 1 << 30, _BIG)]


class _Life:
    """One random life of a queue with a consumer and an operator."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.h = Harness(_PagingStore(), limits={"destination_memory_limit_bytes": 6000})
        self.producer, _ = self.h.connect()
        self.sent: list[str] = []
        self.acked: dict[str, int] = {}
        self.consumer: Any = None
        self.link: FakeLink | None = None
        self.steps_open = 0
        self.moved = 0

    @property
    def queue(self) -> Queue:
        queue = self.h.broker.destinations[SOURCE]
        assert isinstance(queue, Queue)
        return queue

    def send(self) -> None:
        for _ in range(self.rnd.randrange(1, 30)):
            body = b"%05d" % len(self.sent) + b"x" * self.rnd.randrange(50, 400)
            headers = {"k": self.rnd.choice("ab")}
            message = self.h.message(SOURCE, body, headers=headers, persistent=True)
            self.producer.send(message, lambda handle: None)
            self.sent.append(message.message_id)

    def subscribe(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.consumer, self.link = self.h.connect()
        prefetch = self.rnd.choice([1, 5, 50])
        self.consumer.subscribe("s", SOURCE, AckMode.CLIENT_INDIVIDUAL)
        self.consumer.subs["s"].prefetch = prefetch

    def ack_some(self) -> None:
        if self.link is None:
            return
        for _sub, message, tag, _count in self.link.take():
            if self.rnd.random() < 0.7:
                self.acked[message.message_id] = self.acked.get(message.message_id, 0) + 1
                self.consumer.ack(tag)
            else:
                self.consumer.nack(tag)

    def leave(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = self.link = None

    def evict(self) -> None:
        queue = self.queue
        stored = [m for m in queue.pending.values() if m.in_store]
        for message in self.rnd.sample(stored, min(len(stored), self.rnd.randrange(0, 20))):
            queue._evict(_key(message), message)

    def step(self) -> None:
        selection = (
            MessageFilter() if self.rnd.random() < 0.3 else MessageFilter(headers=(("k", "a"),))
        )
        operation = MessageOperation(
            self.h.broker, self.queue, Action.MOVE, selection, lambda m: TARGET
        )
        self.steps_open += 1

        def written(ok: bool) -> None:
            assert ok
            self.steps_open -= 1

        after = self.rnd.choice([0, self.rnd.randrange(0, max(1, self.queue.last_seq))])
        self.moved += operation.step(after, written).acted

    def run_some(self) -> None:
        ready = self.h.loop.ready
        for _ in range(self.rnd.randrange(0, 8)):
            if not ready:
                break
            ready.popleft()()

    def check_counts(self) -> None:
        """At rest, the queue counts what the store holds for it."""
        view = self.queue.view()
        assert view.messages_ready + view.messages_in_flight == len(_stored(self.h, SOURCE))
        assert self.queue.stored_ahead >= 0

    def drain(self) -> None:
        """Take everything left, from the queue and from the target."""
        self.leave()
        self.h.loop.run()
        reader, link = self.h.connect()
        # A message refused max_redeliveries times went to its dead-letter queue.
        for name in (SOURCE, TARGET, "/queue/DLQ.src", "/queue/DLQ.dst"):
            if name in self.h.broker.destinations:
                reader.subscribe(name, name, AckMode.CLIENT_INDIVIDUAL)
        self.h.loop.run()
        while True:
            taken = link.take()
            if not taken:
                break
            for _sub, message, tag, _count in taken:
                self.acked[message.message_id] = self.acked.get(message.message_id, 0) + 1
                reader.ack(tag)
            self.h.loop.run()


@pytest.mark.parametrize("seed", range(40))
def test_moves_amid_traffic_lose_and_duplicate_nothing(seed: int) -> None:
    life = _Life(seed)
    actions = [
        (life.send, 5),
        (life.subscribe, 1),
        (life.ack_some, 4),
        (life.leave, 1),
        (life.evict, 2),
        (life.step, 3),
        (life.run_some, 8),
    ]
    choices = [action for action, weight in actions for _ in range(weight)]
    life.send()
    for _ in range(200):
        life.rnd.choice(choices)()
        if not life.steps_open and not life.h.loop.ready:
            life.check_counts()
    life.h.loop.run()
    assert life.steps_open == 0
    life.check_counts()
    assert life.moved > 0
    life.drain()
    assert sorted(life.acked) == sorted(life.sent)
    assert set(life.acked.values()) == {1}, "a message was acknowledged twice"
    assert _stored(life.h, SOURCE) == []
    assert _stored(life.h, TARGET) == []
    view = life.queue.view()
    assert (view.messages_ready, view.messages_paged, view.paged_bytes) == (0, 0, 0)
    assert not life.queue._claimed
    assert life.queue.pins == 0


def test_a_failed_step_gives_every_message_back_to_its_place() -> None:
    life = _Life(0)
    life.send()
    life.send()
    life.h.loop.run()
    queue = life.queue
    stored = [m for m in queue.pending.values() if m.in_store]
    for message in stored[:5]:
        queue._evict(_key(message), message)
    before = [(m.seq, m.message_id) for m in (f.message for f in queue.window(0, 1000).found)]
    places = {f.message.seq: f.place for f in queue.window(0, 1000).found}
    assert len(set(places.values())) == 3  # pending, evicted, unread
    view = queue.view()
    outcome: list[bool] = []
    operation = MessageOperation(
        life.h.broker, queue, Action.MOVE, MessageFilter(), lambda m: TARGET
    )
    # The store takes the step's records and refuses its COMMIT.
    store = life.h.store
    commit = store.commit

    def fail_commit(txid: str, seqs: Any, on_complete: Any) -> Any:
        store.abort(txid)
        handle = commit("nothing", [], on_complete)
        handle.error = OSError("injected")
        return handle

    store.commit = fail_commit  # type: ignore[method-assign]
    result = operation.step(0, outcome.append)
    assert result.acted == len(before)
    assert not queue.pending  # nothing of it can be delivered while the step is open
    life.h.loop.run()
    assert outcome == [False]
    after = [(m.seq, m.message_id) for m in (f.message for f in queue.window(0, 1000).found)]
    assert after == before
    # Each waits again: where it was, or in memory if paging passed it meanwhile.
    for found in queue.window(0, 1000).found:
        assert found.place in (places[found.message.seq], Place.PENDING)
    assert queue.view().messages_ready == view.messages_ready == len(_stored(life.h, SOURCE))
    assert life.h.broker.destinations[TARGET].view().messages_ready == 0
    assert queue.pins == 0


@pytest.mark.parametrize("seed", range(10))
def test_evicted_find_and_remove_match_a_model(seed: int) -> None:
    rnd = random.Random(seed)
    index = Evicted(1000)
    model: dict[int, str | None] = {}
    for _ in range(400):
        seq = rnd.randrange(1, 100)
        group = model.get(seq, rnd.choice([None, "a", "b"]))
        if rnd.random() < 0.5:
            index.add(seq, group, 2, seq * 10)
            model[seq] = group
        else:
            assert index.remove(seq, group) == (seq in model)
            model.pop(seq, None)
        for probe in range(1, 100):
            expected = (2, probe * 10) if probe in model else None
            assert index.find(probe, model.get(probe, "a")) == (
                expected if probe in model else None
            )
        assert len(index) == len(model)
        assert index.nbytes == sum(s * 10 for s in model)
        for group in (None, "a", "b"):
            seqs = sorted(s for s, g in model.items() if g == group)
            first = index.first(group)
            assert first == ((seqs[0], 2, seqs[0] * 10) if seqs else None)
        named = sorted(
            (min(s for s, g in model.items() if g == group), group)
            for group in ("a", "b")
            if group in model.values()
        )
        assert list(index.groups_in_order()) == [g for _, g in named]
