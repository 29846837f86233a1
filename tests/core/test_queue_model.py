"""A stateful property test: random sends, subscribes, acks, nacks and disconnects on one queue,
checked against a simple model. No message is lost, none is delivered twice unless marked
redelivered, order holds within a priority and within a group, and a group sticks to one consumer
while that consumer stays (groups never close here: nothing sends JMSXGroupSeq -1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluice.core.connection import BrokerConnection, SubscribeOptions
from sluice.core.message import AckMode

from .fakes import FakeLink, Harness

QUEUE = "/queue/model"
MAX_REDELIVERIES = 3


@dataclass
class Consumer:
    number: int
    conn: BrokerConnection
    link: FakeLink
    seen: int = 0  # deliveries already checked
    # tag -> message id, in delivery order
    unacked: dict[int, str] = field(default_factory=dict)


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(policy={"max_redeliveries": MAX_REDELIVERIES})
        self.producer, _ = self.h.connect()
        self.consumers: list[Consumer] = []
        self.sent: dict[str, tuple[int, str | None, int]] = {}  # id -> (priority, group, n)
        self.acked: set[str] = set()
        self.dead: set[str] = set()
        self.delivered_once: set[str] = set()
        self.count = 0
        self.count_consumers = 0
        # The last first-time delivery, per (consumer, priority) for messages without a group
        # and per (group, priority) for grouped ones.
        self.last_first: dict[tuple[object, int], int] = {}
        # group -> number of the consumer that owns it (until that consumer leaves).
        self.group_owner: dict[str, int] = {}

    @rule(priority=st.sampled_from([0, 4, 9]), group=st.sampled_from([None, None, "g1", "g2"]))
    def send(self, priority: int, group: str | None) -> None:
        headers = {"JMSXGroupID": group} if group else {}
        message = self.h.send(
            self.producer, QUEUE, b"%d" % self.count, priority=priority, headers=headers
        )
        self.sent[message.message_id] = (priority, group, self.count)
        self.count += 1
        self.collect()

    @precondition(lambda self: len(self.consumers) < 3)
    @rule(prefetch=st.integers(1, 4), mode=st.sampled_from(["client-individual", "client"]))
    def subscribe(self, prefetch: int, mode: str) -> None:
        conn, link = self.h.connect()
        conn.subscribe("s", QUEUE, AckMode(mode), SubscribeOptions(prefetch=prefetch))
        self.consumers.append(Consumer(self.count_consumers, conn, link))
        self.count_consumers += 1
        self.h.loop.run()
        self.collect()

    def _settle(self, data: st.DataObject, *, accept: bool) -> None:
        """ACK (accept) or NACK a random in-flight delivery, cumulatively in `client` mode."""
        consumer = data.draw(st.sampled_from([c for c in self.consumers if c.unacked]))
        tag = data.draw(st.sampled_from(list(consumer.unacked)))
        cumulative = consumer.conn.subs["s"].ack_mode is AckMode.CLIENT
        if accept:
            consumer.conn.ack(tag)
        else:
            consumer.conn.nack(tag)
        for t in list(consumer.unacked):
            if t == tag or (cumulative and t < tag):
                message_id = consumer.unacked.pop(t)
                if accept:
                    self.acked.add(message_id)
        self.h.loop.run()
        self.collect()

    @precondition(lambda self: any(c.unacked for c in self.consumers))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        self._settle(data, accept=True)

    @precondition(lambda self: any(c.unacked for c in self.consumers))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        self._settle(data, accept=False)

    @precondition(lambda self: bool(self.consumers))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(self.consumers))
        consumer.conn.close()
        self.consumers.remove(consumer)
        self.group_owner = {g: n for g, n in self.group_owner.items() if n != consumer.number}
        self.h.loop.run()
        self.collect()

    def collect(self) -> None:
        """Check every new delivery against the model."""
        for consumer in self.consumers:
            for _, message, tag, count in consumer.link.delivered[consumer.seen :]:
                mid = message.message_id
                assert mid in self.sent, "delivered a message nobody sent"
                group = self.sent[mid][1]
                if group is not None:
                    owner = self.group_owner.setdefault(group, consumer.number)
                    assert owner == consumer.number, "a group moved while its consumer stayed"
                assert mid not in self.acked, "delivered a message after it was acknowledged"
                if count == 1:
                    assert mid not in self.delivered_once, "delivered twice without the mark"
                    self.delivered_once.add(mid)
                    priority, group, n = self.sent[mid]
                    key = (group if group is not None else consumer.number, priority)
                    assert self.last_first.get(key, -1) < n, "order broken"
                    self.last_first[key] = n
                consumer.unacked[tag] = mid
            consumer.seen = len(consumer.link.delivered)
        self.dead = {m.message_id for _, m, _, _ in self._dlq_messages()}

    def _dlq_messages(self) -> list[tuple[str, object, int, int]]:
        dlq = self.h.broker.destinations.get("/queue/DLQ.model")
        if dlq is None:
            return []
        return [("", m, 0, 0) for m in dlq.pending.values()]  # type: ignore[attr-defined]

    @invariant()
    def nothing_lost(self) -> None:
        queue = self.h.broker.destinations.get(QUEUE)
        if queue is None:
            return
        pending = {m.message_id for m in queue.pending.values()}  # type: ignore[attr-defined]
        inflight = {mid for c in self.consumers for mid in c.unacked.values()}
        for mid in self.sent:
            where = [mid in self.acked, mid in pending, mid in inflight, mid in self.dead]
            assert sum(where) == 1, (mid, where)

    @invariant()
    def memory_accounts_for_what_is_held(self) -> None:
        held = len(self.sent) - len(self.acked) - len(self.dead)
        if held == 0:
            dlq = self.h.broker.destinations.get("/queue/DLQ.model")
            dlq_bytes = dlq.usage.used if dlq is not None else 0
            assert self.h.broker.usage.used == dlq_bytes


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
