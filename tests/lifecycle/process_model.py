"""The model of the process-level lifecycle simulation: plain data of what the broker must hold.

Every message the simulation sends carries `x-sim-id` and has an entry here with its fate:

- PENDING: on the wire, its outcome not known yet.
- REQUIRED: receipted (or committed) and not acknowledged: it must be delivered. A non-persistent
  one is required only until the broker restarts (the temp store does not survive one).
- MAYBE: may exist or not (its receipt was lost to a crash, it was non-persistent and the broker
  restarted, or it may have expired): never delivered twice without `redelivered:true`.
- ACKED: acknowledged with a receipt: a queue never delivers it again.
- FORBIDDEN: must never be delivered (its transaction was aborted, it was dropped as a duplicate,
  it had expired before it was sent).

Durable subscriptions keep a fate per message of their topic. Queue messages dead-lettered past
`max_redeliveries` (or expired) are looked for in the dead-letter queue too. Rules checked on every
delivery (`observe_*`) and after every sweep of all destinations (`check_sweep`); a broken rule
raises `SimFailure` naming the check.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

QUEUES = ("/queue/sim.q0", "/queue/sim.q1", "/queue/sim.q2")
TOPICS = ("/topic/sim.t0", "/topic/sim.t1")
# Durable subscriptions (all of client id `sim`): name -> topic.
DURABLES = {"d0": TOPICS[0], "d1": TOPICS[0], "d2": TOPICS[1]}
DLQ_PREFIX = "/queue/DLQ."
TOPIC_DLQ_PREFIX = "/queue/DLQ.Topic."


def dlq_of(destination: str) -> str:
    """The dead-letter queue of a queue or topic (the broker's default prefixes)."""
    kind, _, name = destination[1:].partition("/")
    return (DLQ_PREFIX if kind == "queue" else TOPIC_DLQ_PREFIX) + name


class SimFailure(Exception):
    """A rule of the model was broken: `check` names the rule, `detail` what happened."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


class Fate(enum.Enum):
    """What the model knows of one message (see the module docstring)."""

    PENDING = "pending"
    REQUIRED = "required"
    MAYBE = "maybe"
    ACKED = "acked"
    FORBIDDEN = "forbidden"


class Expiry(enum.Enum):
    """The `expires` a message was sent with."""

    NONE = "none"
    SHORT = "short"  # a second or so ahead: it may expire before anyone takes it
    PAST = "past"  # already expired when sent: never delivered, dead-lettered if stored


@dataclass
class SimMessage:
    """One message sent by the simulation."""

    msg_id: int
    destination: str
    persistent: bool
    size: int
    expiry: Expiry
    run: int  # the broker run it was sent in
    fate: Fate = Fate.PENDING
    why: str = ""  # why FORBIDDEN
    order: int = 0  # its place in its destination's FIFO (set when it becomes visible)
    dedup: str | None = None
    tx: int | None = None
    deliveries: int = 0  # from its queue, over the whole life
    run_deliveries: int = 0  # from its queue, since the broker last started
    possibly_dlq: bool = False  # may have been dead-lettered (or expired) by now
    ever_seen: bool = False  # delivered from its queue or seen in its DLQ at some point
    ack_in_flight: bool = False  # an ACK was sent whose answer may be lost
    must_reach_dlq: bool = False  # persistent, receipted and expired on arrival
    history: list[str] = field(default_factory=list)  # what happened to it, for reports

    def note(self, run: int, what: str) -> None:
        """Add to the history."""
        self.history.append(f"r{run}:{what}")


@dataclass
class DurableModel:
    """One durable subscription: whether it exists and the fate of each topic message for it."""

    name: str
    topic: str
    exists: bool = False
    deleted: bool = False  # deleted by a receipted UNSUBSCRIBE and not created since
    fates: dict[int, Fate] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)
    possibly_dlq: set[int] = field(default_factory=set)


@dataclass
class Sweep:
    """What one sweep of every destination delivered, by subscription, in order."""

    queues: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)
    durables: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)
    dlqs: dict[str, list[int]] = field(default_factory=dict)
    deleted_durables: dict[str, list[int]] = field(default_factory=dict)


class Model:
    """Everything the simulation knows must, may or must not exist. Thread-safe through `lock`
    (background producers and consumers of a crash share it with the main thread)."""

    def __init__(self, max_redeliveries: int) -> None:
        self.lock = threading.RLock()
        self.max_redeliveries = max_redeliveries
        self.messages: dict[int, SimMessage] = {}
        self.durables = {name: DurableModel(name, topic) for name, topic in DURABLES.items()}
        self.dedup_groups: dict[tuple[str, str], list[int]] = {}
        self.dedup_required: set[tuple[str, str]] = set()
        self.unknown_commits: list[list[int]] = []  # transactions whose COMMIT had no answer
        self.run = 0
        self.crash_runs: list[int] = []  # runs that ended with a SIGKILL
        self._next_id = 0
        self._next_order = 0
        self._next_dedup = 0

    # -- sending --------------------------------------------------------------------------------

    def new_message(
        self,
        destination: str,
        *,
        persistent: bool,
        size: int,
        expiry: Expiry = Expiry.NONE,
        dedup: str | None = None,
        tx: int | None = None,
    ) -> SimMessage:
        """Register a message about to be sent (PENDING)."""
        with self.lock:
            self._next_id += 1
            msg = SimMessage(
                self._next_id, destination, persistent, size, expiry, self.run, dedup=dedup, tx=tx
            )
            self.messages[msg.msg_id] = msg
            if dedup is not None:
                self.dedup_groups.setdefault((destination, dedup), []).append(msg.msg_id)
            return msg

    def new_dedup_id(self) -> str:
        """A fresh `x-dedup-id`."""
        with self.lock:
            self._next_dedup += 1
            return f"dd{self._next_dedup}"

    def dedup_ids(self, destination: str) -> list[str]:
        """The dedup ids used on a destination, oldest first."""
        with self.lock:
            return [d for (dest, d) in self.dedup_groups if dest == destination]

    def group_accepted(self, destination: str, dedup: str, before: int) -> bool | None:
        """Did the broker surely take a message with this dedup id (sent before message
        `before`)? True: surely; False: surely not (every earlier one aborted); None: unknown."""
        with self.lock:
            members = [self.messages[i] for i in self.dedup_groups.get((destination, dedup), [])]
            earlier = [m for m in members if m.msg_id < before]
            if any(m.fate in (Fate.REQUIRED, Fate.ACKED) or m.ever_seen for m in earlier):
                return True
            if all(m.fate is Fate.FORBIDDEN and m.why == "aborted" for m in earlier):
                return False
            return None

    def visible(self, msg: SimMessage, *, receipted: bool) -> None:
        """The message's SEND (or its transaction's COMMIT) was answered (`receipted`) or its
        answer was lost: it takes its place in the FIFO and, for a topic, in the durable
        subscriptions that exist."""
        with self.lock:
            self._next_order += 1
            msg.order = self._next_order
            msg.note(self.run, "receipted" if receipted else "unanswered")
            if msg.fate in (Fate.FORBIDDEN, Fate.ACKED):  # a consumer may beat the receipt
                return
            if msg.expiry is Expiry.PAST:
                msg.fate, msg.why = Fate.FORBIDDEN, "expired"
                msg.must_reach_dlq = receipted and msg.persistent and msg.destination in QUEUES
                return
            certain = receipted and msg.expiry is Expiry.NONE and not msg.ack_in_flight
            msg.fate = Fate.REQUIRED if certain else Fate.MAYBE
            if msg.expiry is Expiry.SHORT:
                msg.possibly_dlq = True
            if msg.destination in TOPICS:
                for sub in self.durables.values():
                    if sub.exists and sub.topic == msg.destination:
                        sub.fates[msg.msg_id] = msg.fate
                        if msg.expiry is Expiry.SHORT:
                            sub.possibly_dlq.add(msg.msg_id)

    def forbid(self, msg: SimMessage, why: str) -> None:
        """The message must never be delivered (`why`: aborted, duplicate)."""
        with self.lock:
            msg.fate, msg.why = Fate.FORBIDDEN, why
            msg.note(self.run, why)

    def unanswered(self, msg: SimMessage) -> None:
        """A SEND whose answer never came (a crash, an ERROR): it may or may not exist."""
        with self.lock:
            if msg.fate is Fate.PENDING:
                self.visible(msg, receipted=False)

    # -- consuming ------------------------------------------------------------------------------

    def surely_available(self, queue: str) -> int:
        """Messages of a queue that must be there for a consumer now (not possibly expired or
        dead-lettered): a consumer may wait for this many without a deadline being a guess."""
        with self.lock:
            return sum(
                1
                for m in self.messages.values()
                if m.destination == queue
                and m.fate is Fate.REQUIRED
                and not m.possibly_dlq
                and m.expiry is Expiry.NONE
            )

    def durable_surely_available(self, name: str) -> int:
        """The same for a durable subscription."""
        with self.lock:
            sub = self.durables[name]
            return sum(
                1
                for i, fate in sub.fates.items()
                if fate is Fate.REQUIRED and i not in sub.possibly_dlq
            )

    def _lookup(self, sim_id: int, where: str) -> SimMessage:
        msg = self.messages.get(sim_id)
        if msg is None:
            raise SimFailure("unknown-message", f"{where} delivered x-sim-id {sim_id}, never sent")
        return msg

    def observe_queue(self, queue: str, sim_id: int, redelivered: bool) -> SimMessage:
        """A queue delivered a message: check it may be delivered, and how."""
        with self.lock:
            msg = self._lookup(sim_id, queue)
            where = f"{queue} message {self._describe(sim_id)}"
            if msg.destination != queue:
                raise SimFailure("wrong-destination", f"{where} was sent to {msg.destination}")
            if msg.fate is Fate.ACKED:
                raise SimFailure("acked-redelivered", f"{where} came back after a receipted ACK")
            if msg.fate is Fate.FORBIDDEN:
                raise SimFailure(f"forbidden-{msg.why}", f"{where} delivered though {msg.why}")
            if msg.fate is Fate.PENDING and msg.tx is not None:
                raise SimFailure("uncommitted-visible", f"{where} delivered before its COMMIT")
            if msg.deliveries and not redelivered:
                raise SimFailure(
                    "redelivered-unmarked",
                    f"{where} delivered again ({msg.deliveries} before) without redelivered:true",
                )
            msg.deliveries += 1
            msg.run_deliveries += 1
            msg.note(self.run, "delivered" + ("(r)" if redelivered else ""))
            msg.possibly_dlq = msg.expiry is not Expiry.NONE
            msg.ever_seen = True
            return msg

    def observe_durable(self, name: str, sim_id: int, redelivered: bool) -> SimMessage:
        """A durable subscription delivered a message."""
        with self.lock:
            sub = self.durables[name]
            msg = self._lookup(sim_id, f"durable {name}")
            where = f"durable {name} message {self._describe(sim_id)}"
            if msg.destination != sub.topic:
                raise SimFailure("wrong-destination", f"{where} was sent to {msg.destination}")
            fate = sub.fates.get(sim_id)
            if fate is None or msg.fate is Fate.FORBIDDEN:
                why = msg.why if msg.fate is Fate.FORBIDDEN else "the subscription did not exist"
                raise SimFailure("durable-not-owed", f"{where} delivered though {why}")
            seen = sub.deliveries.get(sim_id, 0)
            if (seen or fate is Fate.ACKED) and not redelivered:
                raise SimFailure(
                    "redelivered-unmarked",
                    f"{where} delivered again ({seen} before, {fate.value}) "
                    "without redelivered:true",
                )
            sub.deliveries[sim_id] = seen + 1
            msg.ever_seen = True
            msg.note(self.run, f"{name}:delivered" + ("(r)" if redelivered else ""))
            return msg

    def observe_dlq(self, dlq: str, sim_id: int, original: str | None) -> SimMessage:
        """A dead-letter queue holds a message."""
        with self.lock:
            msg = self._lookup(sim_id, dlq)
            where = f"{dlq} message {self._describe(sim_id)}"
            if original != msg.destination or dlq_of(msg.destination) != dlq:
                raise SimFailure(
                    "wrong-destination",
                    f"{where} (x-original-destination {original}) was sent to {msg.destination}",
                )
            if msg.fate is Fate.FORBIDDEN and msg.why != "expired":
                raise SimFailure(f"forbidden-{msg.why}", f"{where} dead-lettered though {msg.why}")
            if msg.fate is Fate.PENDING and msg.tx is not None:
                raise SimFailure("uncommitted-visible", f"{where} dead-lettered before COMMIT")
            msg.ever_seen = True
            msg.note(self.run, "in-dlq")
            return msg

    def acked(self, msg: SimMessage) -> None:
        """A queue message's ACK was receipted."""
        with self.lock:
            msg.fate = Fate.ACKED
            msg.ack_in_flight = False
            msg.note(self.run, "acked")

    def ack_sent(self, msg: SimMessage) -> None:
        """An ACK is on its way and its answer may be lost to a crash: the message may be gone."""
        with self.lock:
            msg.note(self.run, "ack-sent")
            msg.ack_in_flight = True
            if msg.fate is Fate.REQUIRED:
                msg.fate = Fate.MAYBE

    def dlq_acked(self, msg: SimMessage) -> None:
        """A message's dead-letter copy was acknowledged: nothing more is owed of it."""
        with self.lock:
            msg.note(self.run, "dlq-acked")
            if msg.fate in (Fate.REQUIRED, Fate.MAYBE):
                msg.fate = Fate.ACKED
            msg.must_reach_dlq = False
            for sub in self.durables.values():
                if sub.fates.get(msg.msg_id) in (Fate.REQUIRED, Fate.MAYBE):
                    sub.fates[msg.msg_id] = Fate.ACKED

    def durable_acked(self, name: str, sim_id: int) -> None:
        """A durable subscription's ACK was receipted."""
        with self.lock:
            self.durables[name].fates[sim_id] = Fate.ACKED
            self.messages[sim_id].note(self.run, f"{name}:acked")

    def requeued(self, msg: SimMessage) -> None:
        """A delivered queue message went back unacknowledged (NACK, disconnect, abort): past
        `max_redeliveries` deliveries it goes to the DLQ instead. The broker counts deliveries
        since it started, plus one for a message that may have been delivered before a restart."""
        with self.lock:
            if msg.run_deliveries + 1 > self.max_redeliveries:
                msg.possibly_dlq = True
            msg.note(self.run, "requeued" + ("(dlq?)" if msg.possibly_dlq else ""))

    def durable_requeued(self, name: str, sim_id: int, attempts: int) -> None:
        """A durable subscription's message was NACKed `attempts` times while attached."""
        with self.lock:
            if attempts + 1 > self.max_redeliveries:
                self.durables[name].possibly_dlq.add(sim_id)

    # -- durable subscriptions ------------------------------------------------------------------

    def durable_created(self, name: str) -> None:
        """A durable subscription was created (its SUBSCRIBE receipted): it starts at the end."""
        with self.lock:
            sub = self.durables[name]
            sub.exists, sub.deleted = True, False
            sub.fates.clear()
            sub.deliveries.clear()
            sub.possibly_dlq.clear()

    def durable_deleted(self, name: str) -> None:
        """A durable subscription was deleted (UNSUBSCRIBE with its name, receipted)."""
        with self.lock:
            sub = self.durables[name]
            sub.exists, sub.deleted = False, True
            sub.fates.clear()
            sub.deliveries.clear()
            sub.possibly_dlq.clear()

    # -- restarts -------------------------------------------------------------------------------

    def restarted(self, crashed: bool) -> None:
        """The broker was stopped (or killed) and started again."""
        with self.lock:
            if crashed:
                self.crash_runs.append(self.run)
            self.run += 1
            for msg in self.messages.values():
                msg.run_deliveries = 0
                if msg.fate is Fate.PENDING and msg.tx is None:
                    self.visible(msg, receipted=False)
                if msg.fate is Fate.REQUIRED and not msg.persistent:
                    msg.fate = Fate.MAYBE
            for sub in self.durables.values():
                for i, fate in sub.fates.items():
                    if fate is Fate.REQUIRED and not self.messages[i].persistent:
                        sub.fates[i] = Fate.MAYBE

    def crashed_since(self, run: int) -> bool:
        """Did the broker crash in or after broker run `run`?"""
        return any(r >= run for r in self.crash_runs)

    # -- sweeps ---------------------------------------------------------------------------------

    def check_sweep(self, sweep: Sweep, *, final: bool) -> None:
        """After a sweep of every destination (after a restart, or the final drain): everything
        required is there exactly once, in order; dead-letter copies are not duplicated without a
        crash; a deleted durable subscription holds nothing. `final`: the sweep acknowledged
        everything, so the whole-life rules (dedup groups, unanswered commits) are checked too."""
        with self.lock:
            for queue, items in sweep.queues.items():
                self._check_queue_sweep(queue, items, sweep.dlqs.get(dlq_of(queue), []))
            for name, items in sweep.durables.items():
                sub = self.durables[name]
                self._check_durable_sweep(sub, items, sweep.dlqs.get(dlq_of(sub.topic), []))
            for name, held in sweep.deleted_durables.items():
                if held:
                    raise SimFailure(
                        "durable-deleted-came-back",
                        f"durable {name}, deleted with a receipted UNSUBSCRIBE, still held "
                        f"messages {sorted(held)[:8]}",
                    )
            for dlq, ids in sweep.dlqs.items():
                self._check_dlq_sweep(dlq, ids, final=final)
            if final:
                self._check_groups()

    def _check_queue_sweep(
        self, queue: str, items: list[tuple[int, bool]], dlq_ids: list[int]
    ) -> None:
        ids = [i for i, _ in items]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise SimFailure("duplicate", f"{queue} delivered {twice[:8]} twice in one sweep")
        orders = [self.messages[i].order for i in ids]
        for before, after, i in zip(orders, orders[1:], ids[1:], strict=False):
            if after < before:
                raise SimFailure(
                    "fifo",
                    f"{queue} delivered message {i} after a message sent later (order {ids[:40]})",
                )
        present = set(ids) | set(dlq_ids)
        missing = sorted(
            m.msg_id
            for m in self.messages.values()
            if m.destination == queue
            and m.fate is Fate.REQUIRED
            and m.msg_id not in present
            and (m.persistent or m.run == self.run)
        )
        if missing:
            info = [self._describe(i) for i in missing[:5]]
            raise SimFailure(
                "lost", f"{queue}: {len(missing)} required messages missing, e.g. {info}"
            )

    def _check_durable_sweep(
        self, sub: DurableModel, items: list[tuple[int, bool]], dlq_ids: list[int]
    ) -> None:
        ids = [i for i, _ in items]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise SimFailure(
                "duplicate", f"durable {sub.name} delivered {twice[:8]} twice in one sweep"
            )
        present = set(ids) | set(dlq_ids)
        missing = sorted(
            i for i, fate in sub.fates.items() if fate is Fate.REQUIRED and i not in present
        )
        if missing:
            info = [self._describe(i) for i in missing[:5]]
            raise SimFailure(
                "lost",
                f"durable {sub.name}: {len(missing)} required messages missing, e.g. {info}",
            )

    def _check_dlq_sweep(self, dlq: str, ids: list[int], *, final: bool) -> None:
        for i in sorted(set(ids)):
            msg = self.messages[i]
            copies = ids.count(i)
            # Copy and remove are two writes: a crash between them may leave a second copy.
            if copies > 1 and not self.crashed_since(msg.run) and msg.destination in QUEUES:
                raise SimFailure(
                    "dlq-duplicate", f"{dlq} holds {copies} copies of message {i} without a crash"
                )
        if final:
            present = set(ids)
            missing = [
                m.msg_id
                for m in self.messages.values()
                if m.must_reach_dlq and dlq_of(m.destination) == dlq and m.msg_id not in present
            ]
            if missing:
                raise SimFailure(
                    "expired-not-dead-lettered",
                    f"{dlq}: expired receipted messages {missing[:8]} never dead-lettered",
                )

    def _check_groups(self) -> None:
        for (dest, dedup), members in self.dedup_groups.items():
            seen = [i for i in members if self.messages[i].ever_seen]
            if len(seen) > 1:
                raise SimFailure(
                    "dedup", f"{dest}: x-dedup-id {dedup} delivered as {len(seen)} messages {seen}"
                )
            if not seen and (dest, dedup) in self.dedup_required:
                raise SimFailure(
                    "lost",
                    f"{dest}: x-dedup-id {dedup} was receipted but none of {members} exists",
                )
        for members in self.unknown_commits:
            seen = [i for i in members if self.messages[i].ever_seen]
            if seen and len(seen) != len(members):
                raise SimFailure(
                    "tx-partial",
                    f"a transaction interrupted in COMMIT shows {len(seen)} of {len(members)} "
                    f"messages: {seen[:8]}",
                )

    def _describe(self, msg_id: int) -> str:
        m = self.messages[msg_id]
        kind = "persistent" if m.persistent else "non-persistent"
        return (
            f"#{msg_id} ({kind}, {m.size} B, run {m.run}, delivered {m.deliveries}x"
            + (f", tx {m.tx}" if m.tx is not None else "")
            + (f", dedup {m.dedup}" if m.dedup else "")
            + f"; {' '.join(m.history[-12:])})"
        )

    # -- summaries ------------------------------------------------------------------------------

    def count(self, fates: Iterable[Fate]) -> int:
        """Messages whose fate is one of `fates`."""
        wanted = set(fates)
        with self.lock:
            return sum(1 for m in self.messages.values() if m.fate in wanted)
