"""The events of a process-level life and how a seed makes them.

A life is its `Settings` (the broker's store and policy knobs) and a list of events, all drawn
from `random.Random(seed)` before anything runs. Each event carries what it needs to run the same
way whatever came before it (its own `seed` for per-message choices), so any sub-list is a valid
life too: that is what shrinking relies on. Events that find nothing to do (a consume of an
empty queue, a durable subscription that does not exist) do nothing.

The `repr` of an event is valid Python: a shrunk list can be pasted into a regression test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from lifecycle.process_model import DURABLES, QUEUES, TOPICS

KiB = 1024
MiB = 1024 * KiB
JOURNAL_FILE_BYTES = 1 * MiB  # the smallest the broker accepts: rollover within short lives
SMALL_DISK_BYTES = 96 * MiB


@dataclass(frozen=True)
class Settings:
    """The broker configuration of one life."""

    gc_interval_s: float = 0.5
    checkpoint_interval_s: float = 0.3
    index_write_batch: int = 100
    compaction_live_ratio: float = 0.2
    archive: bool = False
    sync: str = "always"
    csd_queues: bool = True
    csd_topics: bool = False
    max_redeliveries: int = 3
    verify_journal: str = "full"
    small_disk: bool = False
    store_full: str = "block"  # block | error: what a producer meets on a full disk

    def config_toml(self, data_dir: Path) -> str:
        """The broker's TOML file for this life."""
        return "\n".join(
            [
                "[store]",
                'kind = "journal"',
                f'data_dir = "{data_dir}"',
                f"journal_file_bytes = {JOURNAL_FILE_BYTES}",
                f"gc_interval_s = {self.gc_interval_s}",
                f"checkpoint_interval_s = {self.checkpoint_interval_s}",
                f"index_write_batch = {self.index_write_batch}",
                f"compaction_live_ratio = {self.compaction_live_ratio}",
                f"archive = {str(self.archive).lower()}",
                f'sync = "{self.sync}"',
                "sync_interval_ms = 50",
                f"concurrent_store_and_dispatch_queues = {str(self.csd_queues).lower()}",
                f"concurrent_store_and_dispatch_topics = {str(self.csd_topics).lower()}",
                f'verify_journal = "{self.verify_journal}"',
                f'store_full = "{self.store_full}"',
                "lmdb_map_bytes = 1073741824",
                "[policy]",
                f"max_redeliveries = {self.max_redeliveries}",
                "stream_idle_timeout_s = 2.0",
                "",
            ]
        )


@dataclass(frozen=True)
class Restart:
    """How the broker comes back after a stop or a crash: an offline tool first (`none`,
    `verify`, `rebuild-index`, `compact`), then a start, with `--repair` or not."""

    tool: str = "none"
    repair: bool = False


@dataclass(frozen=True)
class Send:
    """`count` messages to a queue or topic, pipelined, each with a receipt."""

    dest: str
    count: int
    persistent: bool
    size: int
    expiry: str = "none"  # none | short | past
    dedup: bool = False


@dataclass(frozen=True)
class Resend:
    """Send again `count` x-dedup-ids used before on a queue (picked with `seed`)."""

    dest: str
    count: int
    seed: int


@dataclass(frozen=True)
class Consume:
    """Take up to `count` messages from a queue (client-individual), acknowledging, NACKing or
    leaving each as `seed` says, then unsubscribe."""

    dest: str
    count: int
    prefetch: int
    seed: int


@dataclass(frozen=True)
class DurableCreate:
    """Create a durable subscription (if it does not exist) and detach."""

    name: str


@dataclass(frozen=True)
class DurableConsume:
    """Attach to a durable subscription and take up to `count` messages, as `Consume`."""

    name: str
    count: int
    prefetch: int
    seed: int


@dataclass(frozen=True)
class DurableDelete:
    """Delete a durable subscription (UNSUBSCRIBE with its name)."""

    name: str


@dataclass(frozen=True)
class Transaction:
    """BEGIN, `sends` SENDs over `dests`, ACKs of up to `acks` messages of `acks_from`, then
    `outcome`: commit, abort, disconnect, crash_open (SIGKILL before COMMIT) or crash_commit
    (SIGKILL right after sending COMMIT, its answer unknown)."""

    dests: tuple[str, ...]
    sends: int
    size: int
    acks_from: str
    acks: int
    dedup: bool
    outcome: str
    restart: Restart = Restart()


@dataclass(frozen=True)
class Stream:
    """A stream of `chunks` chunks to a queue, in a transaction or live; an incomplete live
    stream ends with its producer's disconnect (the broker appends an abort marker)."""

    dest: str
    chunks: int
    chunk_bytes: int
    transactional: bool
    complete: bool


@dataclass(frozen=True)
class WaitGc:
    """Wait (bounded) until the journal's GC has run again."""


@dataclass(frozen=True)
class Crash:
    """SIGKILL the broker, then restart it. `during`: idle; sends (a background producer, killed
    after its `receipts`-th receipt); mixed (a background producer and consumer); gc (right after
    a GC pass); stop (SIGKILL in the middle of a clean stop)."""

    during: str
    receipts: int
    seed: int
    restart: Restart = Restart()


@dataclass(frozen=True)
class Stop:
    """A clean stop (SIGTERM, exit code 0), `sluice store verify`, then restart."""

    restart: Restart = Restart()


@dataclass(frozen=True)
class DiskFull:
    """Fill the disk (a tmpfs) to `leave_bytes` free; send persistent messages of `size` bytes
    one by one until one is refused or held back (at most `sends`); ACK up to `acks` messages
    (they must go through: the reserve is for them); free the disk: a held-back producer must
    go on by itself and a new SEND must be receipted, without a restart; then `restart` if
    given. A no-op where no tmpfs can be mounted."""

    leave_bytes: int
    sends: int
    size: int
    acks: int = 0
    restart: Restart | None = None


Event = (
    Send
    | Resend
    | Consume
    | DurableCreate
    | DurableConsume
    | DurableDelete
    | Transaction
    | Stream
    | WaitGc
    | Crash
    | Stop
    | DiskFull
)


def _size(rng: random.Random) -> int:
    return rng.choices([40, 600, 3000, 12 * KiB, 40 * KiB], weights=[3, 3, 3, 3, 2])[0]


def _restart(rng: random.Random) -> Restart:
    tool = rng.choices(["none", "verify", "rebuild-index", "compact"], weights=[5, 2, 2, 1])[0]
    return Restart(tool, rng.random() < 0.2)


def _send(rng: random.Random) -> Event:
    topic = rng.random() < 0.3
    dest = rng.choice(TOPICS if topic else QUEUES)
    persistent = rng.random() < 0.8
    expiry = rng.choices(["none", "short", "past"], weights=[10, 1, 1])[0]
    dedup = not topic and persistent and expiry == "none" and rng.random() < 0.25
    count = rng.choice([1, 3, 10, 30, 80, 150])
    return Send(dest, count, persistent, _size(rng), expiry, dedup)


def _transaction(rng: random.Random) -> Event:
    big = rng.random() < 0.25  # large enough to span a rollover of the 1 MiB files
    dests = tuple(rng.sample(QUEUES + TOPICS, rng.randint(1, 2)))
    outcome = rng.choices(
        ["commit", "abort", "disconnect", "crash_open", "crash_commit"], weights=[8, 3, 2, 1, 1]
    )[0]
    return Transaction(
        dests=dests,
        sends=rng.randint(40, 70) if big else rng.randint(1, 12),
        size=rng.choice([24 * KiB, 32 * KiB]) if big else _size(rng),
        acks_from=rng.choice(QUEUES),
        acks=rng.choice([0, 0, 2, 5]),
        dedup=rng.random() < 0.3,
        outcome=outcome,
        restart=_restart(rng),
    )


def _event(rng: random.Random, settings: Settings) -> Event:
    kinds = {
        "send": 24,
        "resend": 4,
        "consume": 14,
        "durable_create": 4,
        "durable_consume": 7,
        "durable_delete": 2,
        "transaction": 8,
        "stream": 3,
        "wait_gc": 3,
        "crash": 6,
        "stop": 4,
        "disk_full": 3 if settings.small_disk else 0,
    }
    kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
    seed = rng.randrange(1 << 30)
    durable = rng.choice(sorted(DURABLES))
    if kind == "send":
        return _send(rng)
    if kind == "resend":
        return Resend(rng.choice(QUEUES), rng.randint(1, 6), seed)
    if kind == "consume":
        return Consume(
            rng.choice(QUEUES), rng.choice([1, 5, 20, 100]), rng.choice([1, 5, 50]), seed
        )
    if kind == "durable_create":
        return DurableCreate(durable)
    if kind == "durable_consume":
        return DurableConsume(durable, rng.choice([1, 5, 20, 100]), rng.choice([1, 5, 50]), seed)
    if kind == "durable_delete":
        return DurableDelete(durable)
    if kind == "transaction":
        return _transaction(rng)
    if kind == "stream":
        return Stream(
            rng.choice(QUEUES),
            rng.randint(2, 12),
            rng.choice([4 * KiB, 64 * KiB]),
            transactional=rng.random() < 0.5,
            complete=rng.random() < 0.8,
        )
    if kind == "wait_gc":
        return WaitGc()
    if kind == "crash":
        during = rng.choices(["idle", "sends", "mixed", "gc", "stop"], weights=[2, 4, 3, 1, 1])[0]
        return Crash(during, rng.randint(1, 150), seed, _restart(rng))
    if kind == "stop":
        return Stop(_restart(rng))
    return DiskFull(
        leave_bytes=rng.choice([0, 256 * KiB, 1 * MiB]),
        sends=rng.randint(20, 100),
        size=rng.choice([4 * KiB, 32 * KiB]),
        acks=rng.choice([0, 5, 20]),
        restart=_restart(rng) if rng.random() < 0.4 else None,
    )


def generate(seed: int, events: int | None = None) -> tuple[Settings, list[Event]]:
    """The settings and events of life `seed` (`events` overrides its drawn length)."""
    rng = random.Random(seed)
    settings = Settings(
        gc_interval_s=rng.choice([0.3, 0.5, 1.0]),
        checkpoint_interval_s=rng.choice([0.1, 0.3, 1.0]),
        index_write_batch=rng.choice([16, 100, 1000]),
        compaction_live_ratio=rng.choice([0.2, 0.5, 0.8]),
        archive=rng.random() < 0.25,
        sync=rng.choice(["always", "periodic", "never"]),
        csd_queues=rng.random() < 0.7,
        csd_topics=rng.random() < 0.3,
        max_redeliveries=rng.choice([2, 3, 6]),
        verify_journal=rng.choice(["full", "after_checkpoint"]),
        small_disk=rng.random() < 0.3,
        store_full=rng.choice(["block", "error"]),
    )
    count = events if events is not None else rng.randint(15, 35)
    return settings, [_event(rng, settings) for _ in range(count)]
