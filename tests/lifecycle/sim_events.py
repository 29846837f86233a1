"""The events of a store's simulated life, and how a seed generates them.

An event is abstract: it names a destination by index and picks the messages it acts on by a
fraction, resolved when it runs against what the model holds then. So any sub-list of a life's
events is still a valid life (what shrinking needs), and an event's messages (ids, bodies) depend
only on its `uid`, never on which events ran before it.

`str(event)` is one line (`send#12 d=1 n=3 size=200 opt=2`) and `Event.parse` reads it back, so a
shrunk event list printed by a failure can be pasted into a regression test.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from dataclasses import dataclass

from sluice.config import JournalVerify, KiB, SyncPolicy

QUEUES = ("/queue/a", "/queue/b")
TOPICS = ("/topic/t", "/topic/u")
DESTS = QUEUES + TOPICS
DLQS = tuple(f"/queue/DLQ.{q.rsplit('/', 1)[1]}" for q in QUEUES)
ALL_DESTS = DESTS + DLQS
SUBS = (("c1", "s1"), ("c1", "s2"), ("c2", "s1"))
TX_SLOTS = 2


class Kind(enum.Enum):
    """What an event does. Store operations run as one step: submitted together while the
    journal's writer is paused (one batch), then awaited."""

    SEND = "send"  # n adds to a destination
    SEND_ACK = "send-ack"  # n adds and, in the same batch, removes of some (cancels pending adds)
    ACK = "ack"  # removes of n stored messages
    ACK_RANGE = "ack-range"  # remove_range up to a stored sequence
    DLQ = "dlq"  # a message moved to its DLQ (expired or redelivered too often), opt 1: transacted
    STREAM = "stream"  # chunks of a stream (stream headers, larger bodies)
    MARK = "mark"  # mark_dispatched (what was handed out before a stop is redelivered)
    TX_BEGIN = "tx-begin"
    TX_SEND = "tx-send"  # adds in a transaction (big ones cross a file rollover)
    TX_ACK = "tx-ack"  # a remove in a transaction
    TX_COMMIT = "tx-commit"
    TX_ABORT = "tx-abort"
    SUB_PUT = "sub-put"  # create or replace a durable subscription
    SUB_CURSOR = "sub-cursor"  # move a durable cursor (coalesced by the store)
    SUB_DELETE = "sub-delete"
    DELETE_DEST = "delete-dest"
    GC = "gc"  # collect and compact now
    CHECKPOINT = "checkpoint"
    RESTART = "restart"  # clean close, open
    CRASH = "crash"  # the next event crashes at its `after`-th gated call (or when it ends)
    FAULT = "fault"  # a fault at the `after`-th call of a kind within the next events
    DISK_FULL = "disk-full"  # the disk has `n` quarter-files of room left
    DISK_FREE = "disk-free"
    VERIFY = "verify"  # close, `sluice store verify`, open
    REBUILD = "rebuild"  # close, `sluice store rebuild-index`, open
    REPAIR = "repair"  # close, open with repair
    COMPACT = "compact"  # close, `sluice store compact`, open


JOURNAL_ONLY = frozenset(
    {
        Kind.GC,
        Kind.CHECKPOINT,
        Kind.CRASH,
        Kind.FAULT,
        Kind.DISK_FULL,
        Kind.DISK_FREE,
    }
)

# opt bits of SEND / SEND_ACK / TX_SEND / STREAM
OPT_NOT_PERSISTENT = 1
OPT_DEDUP = 2
OPT_EXPIRES = 4
# opt of CRASH: bit 0 torn write, bit 1 power loss
OPT_TORN = 1
OPT_POWER = 2
# FAULT: opt = index into FAULTS
FAULTS = (
    ("enospc", "write"),
    ("eio", "write"),
    ("short", "write"),
    ("fills", "write"),
    ("eio", "sync"),
    ("enospc", "meta"),
    ("eio", "meta"),
    ("eio", "read"),
)
FAULT_SPAN_EVENTS = 3


@dataclass(frozen=True)
class Event:
    """One event. Fields beyond `kind` and `uid` mean what the kind says (see `Kind`)."""

    kind: Kind
    uid: int
    d: int = 0  # destination (index into DESTS)
    n: int = 0  # count
    size: int = 0  # body bytes
    pick: float = 0.0  # which stored message(s): a fraction of what is there
    slot: int = 0  # transaction or subscription slot
    opt: int = 0  # kind-specific option bits
    after: int = 0  # CRASH / FAULT: which call

    def __str__(self) -> str:
        parts = [f"{self.kind.value}#{self.uid}"]
        for f in dataclasses.fields(self)[2:]:
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(
                    f"{f.name}={value:g}" if isinstance(value, float) else f"{f.name}={value}"
                )
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> Event:
        """Read back what `str()` wrote."""
        head, *rest = text.split()
        kind, uid = head.split("#")
        values: dict[str, object] = {}
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for item in rest:
            key, value = item.split("=")
            values[key] = float(value) if types[key] in ("float", float) else int(value)
        return cls(Kind(kind), int(uid), **values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class LifeConfig:
    """The store settings of one life."""

    file_bytes: int
    index_write_batch: int
    compaction_live_ratio: float
    archive: bool
    sync: SyncPolicy
    verify_journal: JournalVerify
    dedup_window: int
    sync_acks: bool = False

    def __str__(self) -> str:
        return (
            f"files {self.file_bytes // KiB} KiB, index batch {self.index_write_batch}, "
            f"compaction {self.compaction_live_ratio}, archive {self.archive}, "
            f"sync {self.sync.value}, verify {self.verify_journal.value}, "
            f"dedup window {self.dedup_window}, sync acks {self.sync_acks}"
        )


@dataclass(frozen=True)
class Life:
    """A seed's life: the store settings and the events."""

    seed: int
    config: LifeConfig
    events: tuple[Event, ...]


def generate(seed: int, *, min_events: int = 30, max_events: int = 90) -> Life:
    """The life of `seed`: the same at every call."""
    rng = random.Random(seed)
    config = LifeConfig(
        file_bytes=rng.choice((16, 24, 32, 48, 64)) * KiB,
        index_write_batch=rng.choice((3, 10, 40, 1000)),
        compaction_live_ratio=rng.choice((0.0, 0.2, 0.5, 0.5, 0.9)),
        archive=rng.random() < 0.2,
        sync=SyncPolicy.NEVER if rng.random() < 0.15 else SyncPolicy.ALWAYS,
        verify_journal=(
            JournalVerify.AFTER_CHECKPOINT if rng.random() < 0.3 else JournalVerify.FULL
        ),
        dedup_window=rng.choice((1, 3, 8)),
        # From a generator of its own: the lives of seeds drawn before it stay the same.
        sync_acks=random.Random(f"sync-acks-{seed}").random() < 0.25,
    )
    count = rng.randint(min_events, max_events)
    events = tuple(_event(rng, uid, config) for uid in range(count))
    return Life(seed, config, events)


_WEIGHTS: tuple[tuple[Kind, int], ...] = (
    (Kind.SEND, 24),
    (Kind.SEND_ACK, 5),
    (Kind.ACK, 14),
    (Kind.ACK_RANGE, 3),
    (Kind.DLQ, 3),
    (Kind.STREAM, 2),
    (Kind.MARK, 3),
    (Kind.TX_BEGIN, 3),
    (Kind.TX_SEND, 6),
    (Kind.TX_ACK, 3),
    (Kind.TX_COMMIT, 4),
    (Kind.TX_ABORT, 2),
    (Kind.SUB_PUT, 3),
    (Kind.SUB_CURSOR, 4),
    (Kind.SUB_DELETE, 1),
    (Kind.DELETE_DEST, 1),
    (Kind.GC, 5),
    (Kind.CHECKPOINT, 2),
    (Kind.RESTART, 3),
    (Kind.CRASH, 5),
    (Kind.FAULT, 5),
    (Kind.DISK_FULL, 1),
    (Kind.DISK_FREE, 1),
    (Kind.VERIFY, 1),
    (Kind.REBUILD, 1),
    (Kind.REPAIR, 1),
    (Kind.COMPACT, 1),
)
_KINDS = [k for k, _ in _WEIGHTS]
_CUMULATIVE = [w for _, w in _WEIGHTS]


def _body_size(rng: random.Random, config: LifeConfig) -> int:
    roll = rng.random()
    if roll < 0.7:
        return rng.randint(0, 600)
    if roll < 0.97:
        return rng.randint(600, 6000)
    # A record larger than a data file: it grows the file it goes into.
    return int(config.file_bytes * rng.uniform(1.0, 1.6))


def _send_opt(rng: random.Random) -> int:
    opt = 0
    if rng.random() < 0.15:
        opt |= OPT_NOT_PERSISTENT
    if rng.random() < 0.35:
        opt |= OPT_DEDUP
    if rng.random() < 0.2:
        opt |= OPT_EXPIRES
    return opt


def _event(rng: random.Random, uid: int, config: LifeConfig) -> Event:
    kind = rng.choices(_KINDS, weights=_CUMULATIVE)[0]
    d = rng.randrange(len(DESTS))
    pick = round(rng.random(), 3)
    if kind in (Kind.SEND, Kind.SEND_ACK):
        n = rng.randint(1, 4)
        return Event(
            kind, uid, d=d, n=n, size=_body_size(rng, config), opt=_send_opt(rng), pick=pick
        )
    if kind is Kind.ACK:
        return Event(kind, uid, d=d, n=rng.randint(1, 3), pick=pick)
    if kind in (Kind.ACK_RANGE, Kind.MARK, Kind.DELETE_DEST):
        return Event(kind, uid, d=d, pick=pick)
    if kind is Kind.DLQ:
        return Event(kind, uid, d=rng.randrange(len(QUEUES)), pick=pick, opt=rng.randint(0, 1))
    if kind is Kind.STREAM:
        return Event(kind, uid, d=d, n=rng.randint(2, 5), size=rng.randint(1000, 9000))
    if kind in (Kind.TX_BEGIN, Kind.TX_COMMIT, Kind.TX_ABORT):
        return Event(kind, uid, slot=rng.randrange(TX_SLOTS))
    if kind is Kind.TX_SEND:
        big = rng.random() < 0.25
        n = rng.randint(8, 24) if big else rng.randint(1, 3)
        size = (
            rng.randint(config.file_bytes // 8, config.file_bytes // 3)
            if big
            else (_body_size(rng, config))
        )
        return Event(
            kind, uid, d=d, n=n, size=size, slot=rng.randrange(TX_SLOTS), opt=_send_opt(rng)
        )
    if kind is Kind.TX_ACK:
        return Event(kind, uid, d=d, pick=pick, slot=rng.randrange(TX_SLOTS))
    if kind in (Kind.SUB_PUT, Kind.SUB_CURSOR, Kind.SUB_DELETE):
        return Event(
            kind,
            uid,
            d=rng.randrange(len(TOPICS)),
            n=rng.randint(0, 5),
            slot=rng.randrange(len(SUBS)),
        )
    if kind is Kind.CRASH:
        opt = OPT_TORN if rng.random() < 0.4 else 0
        if config.sync is SyncPolicy.ALWAYS and rng.random() < 0.4:
            opt |= OPT_POWER
        return Event(kind, uid, after=rng.choice((1, 2, 3, 5, 8, 13, 21, 40)), opt=opt)
    if kind is Kind.FAULT:
        return Event(kind, uid, opt=rng.randrange(len(FAULTS)), after=rng.randint(1, 6), pick=pick)
    if kind is Kind.DISK_FULL:
        return Event(kind, uid, n=rng.randint(0, 6))
    return Event(kind, uid)
