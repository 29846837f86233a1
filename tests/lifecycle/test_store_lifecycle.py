"""Seeded lives of the message store (`store_sim`), against every store behind the contract
suite (memory, journal and PostgreSQL), checked against a model after every step and restart.

- By default: a fixed set of seeds per store (about a minute in all).
- `--seed N`: replays seed N on both stores, traced (add `-s` to see the trace of a passing run).
- `--run-slow --sim-minutes M`: random seeds for M minutes; prints lives, events, faults and
  failures, each with its seed and shrunk event list.

A failure prints the seed, the check that failed and a shrunk event list. Seeds that fail on store
bugs not fixed yet are left out of the default set and kept below as strict xfail tests; so are
the bugs a life steps around by default (`store_sim.Known`). See docs/store-simulation.md.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgserver import PgServer
from sluice.config import KiB, StoreConfig, SyncPolicy
from sluice.store.api import StoredMessage
from sluice.store.journal import files, tools
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore

from .sim_events import OPT_POWER, OPT_TORN, Event, Kind, generate
from .sim_harness import Known, StoreKind
from .sim_model import Model
from .sim_postgres import PgTarget
from .store_sim import run_life, shrink, simulate

# Journal seeds among 1-800 that fail on a store bug not fixed yet (none now).
FAILING_JOURNAL_SEEDS: set[int] = set()
JOURNAL_SEEDS = [seed for seed in range(1, 401) if seed not in FAILING_JOURNAL_SEEDS]
JOURNAL_CHUNKS = 10
MEMORY_SEEDS = range(1, 1001)
# PostgreSQL lives in the default run (about 20 s): among 1-30, those that restart the server
# at most once (2 s each), together holding every kind of crash (`sim_postgres`). All of 1-30
# passed when this was written; `--run-slow` runs random ones.
POSTGRES_SEEDS = [3, 5, 6, 7, 8, 9, 10, 12, 14, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 30]
SHRINK_S = 30.0


@pytest.fixture
def pg(pg_server: PgServer) -> PgTarget:
    return PgTarget(pg_server.url(), pg_server.restart_immediate)


def _seed_option(request: pytest.FixtureRequest) -> int | None:
    value = request.config.getoption("seed")
    return None if value is None else int(value)


def _run(kind: StoreKind, seeds: list[int], *, traced: bool, pg: PgTarget | None = None) -> None:
    failures = []
    for seed in seeds:
        report = simulate(kind, seed, shrink_s=SHRINK_S, trace=traced, pg=pg)
        if traced:
            print(f"--- {kind.value} store, seed {seed}: {generate(seed).config}")
            print("\n".join(report.result.trace))
        if report.failed:
            failures.append(report.text)
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("chunk", range(JOURNAL_CHUNKS))
def test_journal_lives(chunk: int, request: pytest.FixtureRequest) -> None:
    """The journal store through the default seeds (or `--seed N`)."""
    seed = _seed_option(request)
    if seed is not None:
        if chunk:
            pytest.skip("--seed replays one seed")
        _run(StoreKind.JOURNAL, [seed], traced=True)
        return
    _run(StoreKind.JOURNAL, JOURNAL_SEEDS[chunk::JOURNAL_CHUNKS], traced=False)


def test_memory_lives(request: pytest.FixtureRequest) -> None:
    """The memory store through the same lives (journal-only events do nothing there)."""
    seed = _seed_option(request)
    seeds = [seed] if seed is not None else list(MEMORY_SEEDS)
    _run(StoreKind.MEMORY, seeds, traced=seed is not None)


def test_postgres_lives(request: pytest.FixtureRequest, pg: PgTarget) -> None:
    """The PostgreSQL store through the same lives: its crashes drop the store without closing
    it, terminate its connection mid-batch, or crash the server (`sim_postgres`); the file-level
    events do nothing there."""
    seed = _seed_option(request)
    seeds = [seed] if seed is not None else POSTGRES_SEEDS
    _run(StoreKind.POSTGRES, seeds, traced=seed is not None, pg=pg)


def test_postgres_lives_crash_in_every_way(pg: PgTarget) -> None:
    """The default PostgreSQL seeds crash the broker side plainly, mid-batch and with the server."""
    opts = Counter(
        ev.opt & (OPT_TORN | OPT_POWER)
        for seed in POSTGRES_SEEDS
        for ev in generate(seed).events
        if ev.kind is Kind.CRASH
    )
    assert {0, OPT_TORN, OPT_POWER} <= set(opts), opts
    life = generate(24)  # crashes mid-batch, with the server, and both at once
    result = run_life(StoreKind.POSTGRES, life, trace=True, pg=pg)
    assert result.failure is None
    assert any("connection terminated" in line for line in result.trace)
    assert any("crashed, the server too" in line for line in result.trace)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_random_postgres_lives_for_minutes(request: pytest.FixtureRequest, pg: PgTarget) -> None:
    """Random seeds against the PostgreSQL store for `--sim-minutes` (1 if not given), in this
    process (lives share the session's server, which some of them crash)."""
    minutes = float(request.config.getoption("sim_minutes") or 1.0)
    rng = random.SystemRandom()
    deadline = time.monotonic() + minutes * 60
    lives = events = 0
    failures = []
    while time.monotonic() < deadline:
        report = simulate(StoreKind.POSTGRES, rng.randrange(1 << 32), shrink_s=60.0, pg=pg)
        lives += 1
        events += report.result.events
        if report.failed:
            failures.append(report.text)
    print(f"\npostgres store lifecycle: {lives} lives, {events} events, {len(failures)} failures")
    assert not failures, "\n\n".join(failures)


# -- the simulation itself ---------------------------------------------------------------------


def test_a_seed_replays_exactly() -> None:
    """The same seed makes the same file calls, outcomes and recoveries at every run."""
    seed = next(s for s in JOURNAL_SEEDS if sum(e.kind is Kind.CRASH for e in generate(s).events))
    first = run_life(StoreKind.JOURNAL, generate(seed), trace=True)
    second = run_life(StoreKind.JOURNAL, generate(seed), trace=True)
    assert first.failure is None
    assert first.crashes >= 1
    assert first.trace == second.trace


def test_events_print_and_parse_back() -> None:
    for seed in range(20):
        for event in generate(seed).events:
            assert Event.parse(str(event)) == event


class _Forgetful(MemoryStore):
    """A memory store that loses its oldest message at every reopen."""

    opened = 0

    def open(self, sink):  # type: ignore[no-untyped-def]
        self.opened += 1
        if self.opened > 1:
            for messages in self._destinations.values():
                if messages:
                    messages.popitem(0)
                    break
        return super().open(sink)


class _Deaf(MemoryStore):
    """A memory store that acknowledges removes without removing anything."""

    def remove(self, destination, seq, on_complete=None, txid=None):  # type: ignore[no-untyped-def]
        return self._complete(on_complete)


@pytest.mark.parametrize(
    ("store", "events", "check"),
    [
        (_Forgetful, ["send#0 n=3 size=10", "restart#1"], "lost"),
        (_Deaf, ["send#0 n=3 size=10", "ack#1 n=1"], "resurrected"),
    ],
)
def test_the_checks_catch_a_faulty_store(
    store: type[MemoryStore], events: list[str], check: str
) -> None:
    life = generate(1)
    result = run_life(
        StoreKind.MEMORY,
        life,
        [Event.parse(e) for e in events],
        make_memory=lambda window: store(dedup_window=window),
    )
    assert result.failure is not None
    assert result.failure.check == check
    assert run_life(StoreKind.MEMORY, life, [Event.parse(e) for e in events]).failure is None


def test_a_lying_sync_loses_receipted_messages_at_power_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The power-loss crash drops what was not synced: a store that reports writes synced
    without syncing loses them, and the check says so."""

    def lying_sync(head: files.HeadFile) -> None:
        head.unsynced = False

    life = generate(next(s for s in range(100) if generate(s).config.index_write_batch == 1000))
    events = [
        Event.parse(e)
        for e in ["send#0 n=2 size=100", "crash#1 opt=2 after=100", "send#2 n=1 size=5"]
    ]
    assert run_life(StoreKind.JOURNAL, life, events).failure is None
    monkeypatch.setattr(files.HeadFile, "sync", lying_sync)
    result = run_life(StoreKind.JOURNAL, life, events)
    assert result.failure is not None
    assert result.failure.check == "lost"


def test_a_power_cut_may_undo_an_ack_nobody_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ack written without a sync of its own (`sync_acks = false`) is undone by a power cut
    before a later sync: its message comes back, which the model allows (redelivered, never
    lost); a model that took such acks as synced finds the message resurrected."""
    life = next(
        life
        for life in map(generate, range(1, 200))
        if life.config.sync is SyncPolicy.ALWAYS
        and not life.config.sync_acks
        and life.config.index_write_batch == 1000
    )
    events = [
        Event.parse(e)
        for e in [
            "send#0 n=2 size=100",
            "ack#1 n=1",
            "crash#2 opt=2 after=1",
            "send#3 n=1 size=5",
        ]
    ]
    assert run_life(StoreKind.JOURNAL, life, events).failure is None
    monkeypatch.setattr(Model, "lose_unsynced", Model.synced)
    result = run_life(StoreKind.JOURNAL, life, events)
    assert result.failure is not None
    assert result.failure.check == "resurrected"


def test_a_store_that_retries_a_failed_sync_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed-fsync trap: after fdatasync fails the data may be gone however often it is
    retried; a store that retries and reports success is caught."""
    real_sync = files.HeadFile.sync

    def retrying_sync(head: files.HeadFile) -> None:
        try:
            real_sync(head)
        except Exception:
            real_sync(head)

    life = generate(1)
    events = [
        Event.parse(e)
        for e in [
            "fault#0 opt=4 after=1",
            "send#1 n=1 size=100",
            "crash#2 opt=2 after=100",
            "send#3 n=1 size=5",
        ]
    ]
    assert run_life(StoreKind.JOURNAL, life, events).failure is None
    monkeypatch.setattr(files.HeadFile, "sync", retrying_sync)
    result = run_life(StoreKind.JOURNAL, life, events)
    assert result.failure is not None
    assert result.failure.check == "unreported"


def test_shrinking_keeps_the_failure_and_drops_the_rest() -> None:
    life = generate(3)

    def make(window: int) -> MemoryStore:
        return _Forgetful(dedup_window=window)

    result = run_life(StoreKind.MEMORY, life, make_memory=make)
    assert result.failure is not None
    shrunk, runs = shrink(StoreKind.MEMORY, life, result, 20.0, make_memory=make)
    assert len(shrunk) < result.failed_at + 1
    assert runs > 1
    again = run_life(StoreKind.MEMORY, life, shrunk, make_memory=make)
    assert again.failure is not None
    assert again.failure.check == result.failure.check


# -- store bugs the simulation found, not fixed yet ------------------------------------------


class KnownIssueStillThere(AssertionError):
    """The life fails the known issue's check (any other failure fails the test for real)."""


def _expect_clean(result_failure: object, check: str) -> None:
    if result_failure is None:
        return
    if getattr(result_failure, "check", None) == check:
        raise KnownIssueStillThere(str(result_failure))
    raise AssertionError(f"fails another check than {check!r}: {result_failure}")


# (issue, seed whose configuration the events run with, shrunk events, the check it fails)
KNOWN_ISSUES = [
    (
        Known.LONG_DEDUP_WINDOW,
        0,
        ["send#19 d=1 n=4 size=62 pick=0.718 opt=2", "rebuild#37"],
        "dedup",
    ),
    (
        Known.ZERO_MARK_PINS,
        57,
        [
            "mark#26 d=1 pick=0.149",
            "tx-send#29 d=3 n=2 size=2087",
            "stream#30 d=1 n=3 size=3957",
            "compact#34",
        ],
        "compact-loop",
    ),
    (
        Known.INDEX_LEFT_OPEN,
        479,
        ["tx-send#24 d=1 n=3 size=144 slot=1 opt=4", "fault#35 pick=0.112 after=1", "rebuild#36"],
        "index-left-open",
    ),
    (
        Known.REQUEST_ERRORS_IGNORED,
        2232,
        [
            "send-ack#7 d=1 n=4 size=226 pick=0.59",
            "tx-send#11 d=3 n=1 size=3637",
            "stream#12 d=3 n=4 size=4912",
            "send-ack#16 n=4 size=4650 pick=0.3 opt=1",
            "ack#30 d=3 n=3 pick=0.331",
            "fault#32 pick=0.671 opt=4 after=4",
            "checkpoint#33",
            "gc#34",
        ],
        "unreported",
    ),
    (
        Known.CLOSE_STOPS_EARLY,
        121,
        ["fault#0 pick=0.185 opt=6 after=1", "verify#2"],
        "close-leak",
    ),
]
_KNOWN_IDS = [f"{case[0].value}-{case[1]}" for case in KNOWN_ISSUES]


@pytest.mark.parametrize(("issue", "seed", "events", "check"), KNOWN_ISSUES, ids=_KNOWN_IDS)
def test_fixed_known_issue_stays_fixed(
    issue: Known, seed: int, events: list[str], check: str
) -> None:
    """Once stepped around by default (`store_sim.Known`), now fixed: the life passes with no
    workaround at all."""
    result = run_life(
        StoreKind.JOURNAL, generate(seed), [Event.parse(e) for e in events], known=frozenset()
    )
    assert result.failure is None, f"{issue.value}: {result.failure}"


# Store bugs the simulation found that are fixed: (seed, shrunk events, what it was). Each must
# pass (with the workarounds of the issues still open).
FIXED_CASES = [
    (
        2,
        ["crash#3 opt=3 after=3", "tx-send#4 d=1 n=13 size=2607 slot=1 opt=4", "crash#5 after=13"],
        "HeadFile.rollover closed the head descriptor before the next file was open; after a "
        "failed rollover close() closed the number again",
    ),
    (
        134,
        [
            "send#11 d=1 n=2 size=4887 pick=0.597 opt=6",
            "tx-send#17 n=1 size=349 slot=1",
            "send-ack#19 d=3 n=4 size=289 pick=0.577 opt=6",
            "stream#31 d=1 n=2 size=1971",
            "send#32 n=4 size=1213 pick=0.581",
            "ack#33 n=3 pick=0.565",
            "fault#34 pick=0.124 after=6",
            "verify#35",
            "stream#36 n=4 size=8401",
            "fault#37 pick=0.133 opt=4 after=3",
            "gc#38",
            "ack-range#39 d=3 pick=0.948",
        ],
        "a rollover that failed in compaction left the writer going with the closed head "
        "descriptor, and the next batch was written to it (another file's number by then)",
    ),
]


@pytest.mark.parametrize(
    ("seed", "events", "what"), FIXED_CASES, ids=[f"seed-{case[0]}" for case in FIXED_CASES]
)
def test_fixed_store_bug_stays_fixed(seed: int, events: list[str], what: str) -> None:
    result = run_life(StoreKind.JOURNAL, generate(seed), [Event.parse(e) for e in events])
    assert result.failure is None, f"{what}: {result.failure}"


# (seed, shrunk events, the check it failed, what went wrong): fixed since, kept as regressions.
_TX_ACK_CYCLE = (
    "compaction copied a message that an open transaction acknowledged into a file newer than "
    "the ack; at the commit the ack's file depended on the copy's file, which also acked "
    "messages of the ack's file, and the two waited for each other for ever (compaction now "
    "leaves files holding such messages alone: gc.compaction_targets)"
)

_ABORT_SYNC = (
    "a start whose abort records for open transactions failed to sync (EIO) took the failure "
    "for an unusable index and rebuilt it: the rebuild read the unsynced abort records back from "
    "the page cache and committed an index claiming them; after a power loss the start stopped "
    "on data the index held and the file did not (a journal failure now fails the start)"
)

FIXED_FAILING_CASES = [
    (
        12233716,
        [
            "disk-full#1 n=5",
            "stream#5 d=1 n=5 size=8248",
            "stream#9 d=2 n=4 size=5816",
            "send#26 d=2 n=1 size=76651 pick=0.45",
            "send-ack#29 d=3 n=4 size=239 pick=0.828 opt=4",
            "compact#30",
            "rebuild#41",
        ],
        "dest-info",
        "rebuild-index took over the sequences the old index held alone only for destinations "
        "the journal had: a topic whose every add was cancelled or refused on the full disk "
        "vanished, and its sequences could be handed out again",
    ),
    (
        430,
        [
            "tx-send#4 d=3 n=24 size=8440 slot=1 opt=2",
            "restart#9",
            "fault#38 pick=0.836 opt=4 after=3",
            "gc#39",
        ],
        "exception",
        "Maintenance.retire_files with archiving: an error after the files were moved (EIO syncing "
        "archive/) skips state.files_gone; every later collection archives them again and "
        "fails on os.truncate (FileNotFoundError), which fails the writer on the timer path",
    ),
    (
        419,
        [
            "disk-full#21 n=3",
            "send#27 d=3 n=1 size=92 pick=0.816 opt=4",
            "send-ack#28 n=1 size=96521 pick=0.413 opt=2",
        ],
        "lost",
        "a remove refused for lack of room (DiskFullError) of a message written but not yet in "
        "a committed index: dropping the remove's overlay entry, which had replaced the add's, "
        "hides the message from load() until the next index commit",
    ),
    (
        892,
        [
            "send#0 d=2 n=1 size=10",
            "disk-full#1",
            "send#2 n=4 size=5000",
            "send#4 n=4 size=5000",
            "send-ack#3 d=2 n=2 size=5000",
            "restart#5",
        ],
        "last-seq",
        "adds cancelled in a batch refused for lack of room never reach note_cancelled "
        "(Writer._process returns after _refuse), so no DEST_SEQ records their sequences: after "
        "a clean restart last_seq is below sequences already handed out",
    ),
    (
        658,
        [
            "delete-dest#7 d=1 pick=0.248",
            "stream#8 d=1 n=5 size=5462",
            "ack-range#17 d=1 pick=0.307",
        ],
        "lost",
        "remove_range after a delete and new messages, before the index commits: "
        "Overlay.set_floor keeps the delete's MAX_SEQ floor and drops the new messages' entries, "
        "so load() hides them until the next commit",
    ),
    (
        786,
        ["send-ack#55 d=2 n=4 size=295 pick=0.585", "delete-dest#56 d=2 pick=0.459"],
        "deleted-back",
        "a destination deleted after one of its adds was cancelled comes back (empty, last_seq "
        "of the cancelled add): the next checkpoint writes a DEST_SEQ for it "
        "(take_cancelled_seqs), which creates it again",
    ),
    (
        1124,
        [
            "send#5 d=2 n=4 size=1783 pick=0.347",
            "send#20 d=3 n=2 size=5502 pick=0.234 opt=2",
            "delete-dest#27 d=3 pick=0.86",
            "send#34 d=1 n=2 size=3735 pick=0.494",
            "send#40 d=3 n=1 size=3572 pick=0.4",
            "send-ack#43 d=3 n=2 size=475 pick=0.734 opt=2",
            "tx-ack#44 d=1 pick=0.441",
            "gc#51",
            "tx-commit#53",
            "stream#64 d=2 n=4 size=7361",
        ],
        "disk",
        "a transacted ack of a message that compaction moves before the commit: the ack's file "
        "and the copy's file depend on each other (FileInfo.deps) and neither is ever collected",
    ),
    (
        1729680961,
        [
            "send#2 d=1 n=3 size=75 pick=0.535 opt=2",
            "fault#3 pick=0.177 opt=5 after=2",
            "send#4 n=3 size=5130 pick=0.319 opt=2",
            "crash#8 opt=1 after=1",
            "send#9 n=3 size=584 pick=0.412 opt=2",
        ],
        "open",
        "HeadFile.rollover renamed the spare to db-2.log, then opening it failed with ENOSPC: the "
        "batch was refused and the store went on appending to db-1.log behind a newer file; a "
        "crash tearing one of those appends left damage that is not at the tail of the newest "
        "file, and the start stopped on it (CorruptionError in the middle of db-1.log)",
    ),
    (
        3612451224,
        [
            "stream#44 d=3 n=5 size=6413",
            "ack-range#54 d=3 pick=0.805",
            "stream#62 d=2 n=4 size=4359",
            "fault#69 pick=0.253 opt=4 after=3",
            "crash#70 opt=3 after=40",
            "gc#71",
        ],
        "exception",
        "a harness bug: FaultFS.sync kept a failed fsync of journal/ (after archiving) among the "
        "paths whose unsynced bytes a power loss drops, and the crash image then opened the "
        "directory for writing (IsADirectoryError)",
    ),
    (
        2307112017,
        [
            "send#1 d=3 n=2 size=258 pick=0.906 opt=6",
            "send#4 d=2 n=2 size=356 pick=0.785 opt=3",
            "send#5 n=3 size=442 pick=0.959",
            "send#7 d=3 n=4 size=389 pick=0.744 opt=2",
            "send#8 d=2 n=4 size=2867 pick=0.833 opt=1",
            "send-ack#12 n=1 size=235 pick=0.952 opt=6",
            "send#14 n=1 size=391 pick=0.269 opt=1",
            "dlq#15 pick=0.522",
            "send#16 n=1 size=1296 pick=0.496",
            "send#27 d=1 n=4 size=259 pick=0.153 opt=2",
            "ack#29 d=1 n=3 pick=0.91",
            "send-ack#30 d=3 n=3 size=1907 pick=0.324",
            "dlq#31 d=1 pick=0.681 opt=1",
            "send#37 d=1 n=4 size=372 pick=0.851 opt=1",
            "stream#39 d=2 n=4 size=7191",
            "send#49 d=1 n=2 size=507 pick=0.501 opt=4",
            "sub-put#51 d=1 n=4 slot=1",
            "ack#52 d=2 n=3 pick=0.554",
            "tx-send#53 d=2 n=2 size=4281 slot=1",
            "send#54 d=2 n=4 size=3885 pick=0.384",
            "restart#57",
            "send#58 d=1 n=2 size=266 pick=0.061 opt=2",
            "send#59 d=1 n=4 size=2102 pick=0.402",
            "tx-send#65 d=3 n=2 size=515 slot=1",
            "send#66 d=1 n=4 size=210 pick=0.549 opt=4",
            "stream#67 d=2 n=2 size=2589",
            "send#69 d=3 n=2 size=4195 pick=0.066 opt=2",
            "tx-send#70 n=1 size=479",
        ],
        "disk",
        "a drained store kept a chain of old files, each holding an ack of a message in the one "
        "before: compaction_targets skipped a file while the file it depends on was still there, "
        "even when that file was compacted and deleted in the same collection, so each "
        "collection freed one file of the chain (seeds 559 and 748 too)",
    ),
    (
        1538911728,
        [
            "send-ack#1 d=1 n=1 size=33786 pick=0.951",
            "tx-ack#6 d=1 pick=0.624 slot=1",
            "send#12 d=3 n=3 size=595 pick=0.711 opt=6",
            "send#13 d=1 n=1 size=5727 pick=0.134 opt=6",
            "send#16 d=3 n=3 size=291 pick=0.214 opt=2",
            "send#17 d=2 n=2 size=2165 pick=0.021 opt=2",
            "delete-dest#20 d=1 pick=0.218",
            "tx-send#21 d=2 n=2 size=4940 slot=1 opt=2",
            "send#23 d=1 n=3 size=434 pick=0.714 opt=2",
            "tx-commit#26 slot=1",
            "ack-range#39 d=2 pick=0.991",
            "send-ack#44 d=3 n=3 size=38646 pick=0.309",
        ],
        "disk",
        "a transacted ack of a message whose destination was deleted and created again before "
        "the commit removed the new message of the same sequence, and tied the ack's file to the "
        "new message's file, which held an ack of the old file's messages: neither was ever "
        "collected; a delete now drops open transactions' removes of its messages",
    ),
    (
        2127822068,
        [
            "disk-full#7 n=2",
            "send-ack#8 d=3 n=3 size=206 pick=0.007",
            "send#24 d=1 n=1 size=39214 pick=0.009",
            "restart#34",
        ],
        "last-seq",
        "adds cancelled while the disk was full: the checkpoint that writes their DEST_SEQ found "
        "no room (the head file full, no next file) and was skipped, at close too, so the "
        "sequences were handed out again after the restart; the index now holds them "
        "(JournalState.hold_seqs) until a checkpoint with room writes the record",
    ),
    (
        2407397000,
        [
            "disk-full#8 n=1",
            "send#9 d=1 n=2 size=251 pick=0.43 opt=2",
            "send#15 d=2 n=2 size=56640 pick=0.931",
            "send-ack#17 d=1 n=4 size=228 pick=0.467",
            "restart#19",
        ],
        "last-seq",
        "adds cancelled while the disk was full: the checkpoint that writes their DEST_SEQ found "
        "no room (the head file full, no next file) and was skipped, at close too, so the "
        "sequences were handed out again after the restart; the index now holds them "
        "(JournalState.hold_seqs) until a checkpoint with room writes the record",
    ),
    (
        2945052868,
        [
            "send#3 d=1 n=2 size=492 pick=0.312 opt=2",
            "send#12 d=1 n=3 size=5608 pick=0.792",
            "send#16 d=2 n=3 size=382 pick=0.979 opt=1",
            "ack#19 d=1 n=2 pick=0.864",
            "disk-full#20 n=1",
            "send-ack#21 d=1 n=4 size=547 pick=0.855 opt=2",
            "sub-put#22 n=4 slot=2",
            "sub-put#24 d=1 slot=1",
            "tx-send#32 n=3 size=3220 slot=1",
            "ack#33 d=1 n=2 pick=0.147",
            "send#42 d=3 n=4 size=318 pick=0.551",
            "crash#45 opt=1 after=5",
            "send#46 d=1 n=1 size=3556 pick=0.481",
            "gc#47",
            "send#48 n=3 size=170 pick=0.919 opt=1",
            "dlq#51 pick=0.139",
            "send#52 n=2 size=1533 pick=0.098 opt=6",
            "tx-ack#53 d=1 pick=0.385",
            "disk-full#54 n=3",
            "ack#55 d=2 n=2 pick=0.57",
            "send-ack#58 d=2 n=2 size=508 pick=0.945",
            "send#59 n=1 size=5294 pick=0.577 opt=2",
            "send#61 n=4 size=275 pick=0.433 opt=4",
            "send#63 d=1 n=2 size=66 pick=0.407 opt=2",
            "sub-delete#64 d=1 n=3 slot=2",
            "send#65 d=3 n=4 size=356 pick=0.768 opt=7",
            "send-ack#67 n=2 size=87 pick=0.284",
            "restart#71",
        ],
        "last-seq",
        "adds cancelled while the disk was full: the checkpoint that writes their DEST_SEQ found "
        "no room (the head file full, no next file) and was skipped, at close too, so the "
        "sequences were handed out again after the restart; the index now holds them "
        "(JournalState.hold_seqs) until a checkpoint with room writes the record",
    ),
    (
        3547334020,
        [
            "send#32 d=3 n=3 size=189 pick=0.456 opt=2",
            "disk-full#33 n=1",
            "send-ack#40 n=3 size=16740 pick=0.523",
            "verify#41",
        ],
        "last-seq",
        "adds cancelled while the disk was full: the checkpoint that writes their DEST_SEQ found "
        "no room (the head file full, no next file) and was skipped, at close too, so the "
        "sequences were handed out again after the restart; the index now holds them "
        "(JournalState.hold_seqs) until a checkpoint with room writes the record",
    ),
    (
        4202105186,
        [
            "mark#0 d=3 pick=0.643",
            "send-ack#3 d=1 n=3 size=4101 pick=0.281",
            "send#33 d=2 n=3 size=1467 pick=0.585",
            "disk-full#34 n=4",
            "tx-send#37 d=1 n=3 size=4942 slot=1 opt=4",
            "send#39 d=1 n=2 size=563 pick=0.638 opt=2",
            "ack#40 d=2 n=3 pick=0.609",
            "delete-dest#41 d=2 pick=0.884",
            "sub-cursor#42 n=5 slot=2",
            "tx-send#43 d=3 n=24 size=3856 opt=2",
            "restart#44",
            "send#45 d=2 n=4 size=3176 pick=0.093 opt=2",
            "checkpoint#49",
            "ack#52 d=2 n=3 pick=0.345",
            "gc#58",
            "send-ack#62 d=3 n=4 size=2243 pick=0.259 opt=1",
            "restart#63",
        ],
        "last-seq",
        "adds cancelled while the disk was full: the checkpoint that writes their DEST_SEQ found "
        "no room (the head file full, no next file) and was skipped, at close too, so the "
        "sequences were handed out again after the restart; the index now holds them "
        "(JournalState.hold_seqs) until a checkpoint with room writes the record",
    ),
    (
        4221610490,
        [
            "send#6 d=2 n=1 size=34 pick=0.653 opt=4",
            "disk-full#14 n=6",
            "send#18 d=3 n=2 size=19621 pick=0.67",
            "send-ack#21 d=2 n=3 size=254 pick=0.104",
            "verify#23",
        ],
        "last-seq",
        "adds cancelled while the disk was full: the checkpoint that writes their DEST_SEQ found "
        "no room (the head file full, no next file) and was skipped, at close too, so the "
        "sequences were handed out again after the restart; the index now holds them "
        "(JournalState.hold_seqs) until a checkpoint with room writes the record",
    ),
    (
        2217552266,
        [
            "send#14 d=2 n=1 size=455 pick=0.218 opt=1",
            "tx-send#16 n=17 size=5790 slot=1 opt=2",
            "restart#19",
            "tx-ack#20 d=2 pick=0.648",
            "send#22 d=3 n=3 size=4394 pick=0.691",
            "gc#23",
            "ack#24 d=3 n=2 pick=0.234",
            "tx-commit#25",
            "stream#26 d=1 n=4 size=5415",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        2272023122,
        [
            "stream#1 d=1 n=2 size=8255",
            "ack#5 d=1 n=2 pick=0.468",
            "send#9 d=1 n=2 size=3168 pick=0.642",
            "send#18 d=3 n=2 size=1689 pick=0.424 opt=3",
            "fault#23 pick=0.008 opt=3 after=1",
            "crash#24 after=8",
            "gc#25",
            "send#26 d=3 n=1 size=4825 pick=0.288 opt=2",
            "send#33 n=3 size=440 pick=0.575",
            "tx-ack#34 d=1 pick=0.983 slot=1",
            "tx-send#35 d=3 n=2 size=1915 slot=1",
            "send#36 n=2 size=512 pick=0.537",
            "tx-send#40 n=2 size=567",
            "ack#41 d=3 n=1 pick=0.366",
            "gc#42",
            "tx-send#43 d=3 n=10 size=2141 slot=1",
            "tx-commit#58 slot=1",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        935614134,
        [
            "disk-full#10",
            "send#13 n=2 size=2207 pick=0.873",
            "tx-send#16 d=3 n=20 size=5854 slot=1 opt=2",
            "sub-put#19 n=5 slot=1",
            "send#20 n=2 size=291 pick=0.612",
            "send#28 d=1 n=2 size=225 pick=0.714",
            "send#29 d=1 n=4 size=247 pick=0.741",
            "stream#30 d=2 n=3 size=1871",
            "send#34 d=1 n=4 size=351 pick=0.51 opt=3",
            "stream#36 n=3 size=1081",
            "tx-send#39 d=3 n=2 size=360 opt=1",
            "tx-ack#40 d=2 pick=0.013 slot=1",
            "send#42 d=1 n=4 size=518 pick=0.9 opt=7",
            "send#44 n=3 size=424 pick=0.929",
            "gc#45",
            "dlq#48 pick=0.773 opt=1",
            "tx-send#49 d=2 n=19 size=7231",
            "tx-commit#51 slot=1",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        1853707627,
        [
            "send-ack#5 d=1 n=1 size=3861 pick=0.359 opt=1",
            "tx-send#10 d=3 n=14 size=14375 slot=1 opt=2",
            "send#11 d=3 n=2 size=3378 pick=0.045 opt=5",
            "stream#16 n=4 size=5742",
            "crash#18 after=3",
            "send-ack#20 n=2 size=3969 pick=0.817 opt=6",
            "dlq#27 pick=0.523",
            "tx-ack#29 pick=0.075 slot=1",
            "stream#30 n=4 size=4777",
            "send#35 d=3 n=4 size=5007 pick=0.996 opt=2",
            "dlq#37 d=1 pick=0.671 opt=1",
            "gc#38",
            "tx-commit#43 slot=1",
            "dlq#67 pick=0.628",
            "tx-begin#68",
            "send#69 d=3 n=2 size=52 pick=0.154",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        2714789614,
        [
            "send-ack#0 d=2 n=4 size=38 pick=0.103",
            "stream#5 n=3 size=8396",
            "tx-ack#11 d=2 pick=0.07 slot=1",
            "stream#13 d=1 n=3 size=8194",
            "ack-range#16 pick=0.903",
            "gc#18",
            "send#20 n=4 size=503 pick=0.446",
            "send#21 d=3 n=1 size=4879 pick=0.376 opt=4",
            "tx-commit#33 slot=1",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        1265523915,
        [
            "send#0 d=2 n=4 size=5523 pick=0.677 opt=6",
            "send#1 d=3 n=3 size=440 pick=0.683",
            "fault#2 pick=0.512 opt=5 after=1",
            "tx-send#24 d=2 n=3 size=3889 slot=1",
            "tx-send#25 n=3 size=435 slot=1",
            "ack#26 d=2 n=3 pick=0.266",
            "gc#31",
            "tx-ack#37 d=3 pick=0.04",
            "tx-send#43 d=3 n=24 size=2631 slot=1 opt=4",
            "ack#44 d=2 n=1 pick=0.308",
            "gc#45",
            "send#46 d=2 n=3 size=5288 pick=0.344 opt=6",
            "tx-commit#52",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        3119812227,
        [
            "stream#1 d=2 n=3 size=2376",
            "send#6 d=1 n=1 size=1849 pick=0.771",
            "tx-send#7 d=3 n=3 size=10 slot=1 opt=1",
            "send#8 d=2 n=4 size=35 pick=0.829 opt=6",
            "send#9 d=2 n=4 size=2082 pick=0.77",
            "tx-send#10 d=1 n=2 size=1719 slot=1 opt=2",
            "send#13 d=2 n=2 size=546 pick=0.276 opt=3",
            "send#21 n=4 size=358 pick=0.144 opt=6",
            "ack#22 n=2 pick=0.226",
            "send#25 d=1 n=3 size=29734 pick=0.923 opt=1",
            "ack-range#27 d=2 pick=0.792",
            "stream#28 d=1 n=2 size=4931",
            "compact#31",
            "tx-ack#38 pick=0.334 slot=1",
            "send#39 d=3 n=2 size=317 pick=0.879 opt=2",
            "send#40 d=1 n=2 size=5279 pick=0.183 opt=6",
            "ack#46 d=2 n=3 pick=0.38",
            "gc#47",
            "tx-commit#48 slot=1",
            "send#49 n=4 size=598 pick=0.35",
            "send#50 n=4 size=2642 pick=0.806 opt=1",
            "dlq#54 d=1 pick=0.881 opt=1",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        3412998878,
        [
            "send#1 d=1 n=4 size=455 pick=0.682 opt=2",
            "tx-send#7 n=18 size=3892 opt=2",
            "send#9 n=3 size=519 pick=0.385 opt=3",
            "send-ack#10 d=3 n=4 size=60 pick=0.39 opt=2",
            "stream#11 d=2 n=3 size=6127",
            "ack#12 d=2 n=3 pick=0.341",
            "tx-ack#21 d=3 pick=0.156 slot=1",
            "tx-commit#27",
            "tx-send#28 d=3 n=11 size=4956 slot=1 opt=3",
            "gc#31",
            "ack#32 n=2 pick=0.589",
            "dlq#36 pick=0.861 opt=1",
            "tx-commit#38 slot=1",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        127890295,
        [
            "send#17 d=2 n=4 size=2980 pick=0.079 opt=4",
            "tx-send#19 d=3 n=18 size=6205 slot=1",
            "send#23 d=1 n=4 size=2545 pick=0.67",
            "send#32 d=3 n=3 size=301 pick=0.86 opt=2",
            "send#35 d=2 n=2 size=51496 pick=0.548",
            "send#36 n=2 size=219 pick=0.505 opt=2",
            "repair#40",
            "send-ack#41 n=1 size=3113 pick=0.799",
            "tx-send#42 n=2 size=5611 opt=2",
            "tx-ack#43 d=3 pick=0.622 slot=1",
            "dlq#44 d=1 pick=0.553 opt=1",
            "send-ack#50 n=2 size=478 pick=0.41 opt=3",
            "gc#51",
            "send#52 d=3 n=1 size=492 pick=0.859 opt=4",
            "tx-abort#53",
            "send-ack#55 d=3 n=3 size=322 pick=0.061 opt=6",
            "send#56 d=1 n=2 size=4003 pick=0.327 opt=4",
            "dlq#58 d=1 pick=0.657",
            "stream#71 n=2 size=3526",
            "tx-commit#74 slot=1",
            "send#75 d=2 n=3 size=492 pick=0.319 opt=6",
        ],
        "disk",
        _TX_ACK_CYCLE,
    ),
    (
        2226366891,
        [
            "send#1 d=3 n=1 size=227 pick=0.982",
            "ack#3 d=3 n=1 pick=0.632",
            "send#4 d=3 n=4 size=204 pick=0.685 opt=7",
            "sub-cursor#5",
            "send#8 d=2 n=2 size=427 pick=0.808",
            "mark#9 d=1 pick=0.552",
            "tx-send#10 d=1 n=13 size=5595 opt=6",
            "sub-cursor#11 d=1 n=3 slot=2",
            "send#12 d=1 n=1 size=135 pick=0.804",
            "sub-put#13 d=1 n=4 slot=2",
            "send#14 n=2 size=2738 pick=0.428",
            "tx-ack#15 d=2 pick=0.043",
            "send#16 d=3 n=2 size=2273 pick=0.857 opt=4",
            "stream#17 d=2 n=3 size=5659",
            "delete-dest#18 d=3 pick=0.851",
            "send#20 d=3 n=4 size=1576 pick=0.612 opt=4",
            "ack#22 d=3 n=2 pick=0.117",
        ],
        "resurrected",
        "every overlay removal was the same None, so the index commit that held an old remove of "
        "/topic/u #1 (before a delete) dropped the entry of a newer remove of the new #1 that "
        "the index did not hold yet: the acknowledged message showed in load() until the next "
        "commit; each removal now has its own overlay.Removed marker",
    ),
    (
        3718535680,
        [
            "tx-send#3 d=2 n=2 size=47747 slot=1",
            "tx-commit#5 slot=1",
            "ack#6 d=2 n=3 pick=0.985",
            "gc#10",
            "rebuild#11",
        ],
        "dest-info",
        "a destination whose last sequence came from a TX_COMMIT in a later file than its ADDs: "
        "the sequence pin was on the commit's file, which does not name the destination, so "
        "once the messages were acknowledged collection deleted the ADDs' files and a rebuild "
        "lost the destination and its last_seq; the pin is now on the ADD's file "
        "(JournalState._put_message), and the commit's file depends on it",
    ),
    (
        2692307166,
        [
            "send#2 d=1 n=1 size=2776 pick=0.969 opt=6",
            "disk-full#4 n=4",
            "tx-send#7 n=11 size=6246 slot=1",
            "mark#8 pick=0.19",
            "restart#9",
            "send#10 d=3 n=4 size=550 pick=0.254",
            "stream#11 d=3 n=2 size=5491",
            "gc#12",
            "ack#13 d=1 n=3 pick=0.055",
            "send#15 d=3 n=1 size=511 pick=0.976",
            "send#18 d=2 n=3 size=1032 pick=0.12",
            "tx-ack#20 d=3 pick=0.329 slot=1",
            "crash#21 opt=1 after=8",
            "delete-dest#24 pick=0.922",
            "send#25 d=2 n=2 size=109 pick=0.812 opt=4",
            "send#27 n=4 size=96 pick=0.404 opt=4",
            "send-ack#28 d=2 n=1 size=3246 pick=0.13",
            "sub-cursor#30 d=1 n=4 slot=1",
            "send#31 d=3 n=1 size=28 pick=0.382 opt=1",
            "rebuild#32",
        ],
        "last-seq",
        "a cancelled sequence that no DEST_SEQ could record for lack of room is held in the "
        "index alone (JournalState.hold_seqs); rebuild-index threw that index away, so "
        "last_seq went back below a sequence already handed out; the rebuild now takes the "
        "held sequences over from the old index (Index.peek_held_seqs)",
    ),
    (
        2072828600,
        [
            "disk-full#18 n=5",
            "send#24 d=1 n=4 size=235 pick=0.711",
            "send#36 n=2 size=4283 pick=0.576",
            "send#37 d=1 n=2 size=3231 pick=0.166 opt=4",
            "send#53 d=2 n=1 size=17452 pick=0.912",
            "send-ack#55 d=1 n=2 size=11 pick=0.446",
            "rebuild#59",
        ],
        "last-seq",
        "a cancelled sequence that no DEST_SEQ could record for lack of room is held in the "
        "index alone (JournalState.hold_seqs); rebuild-index threw that index away, so "
        "last_seq went back below a sequence already handed out; the rebuild now takes the "
        "held sequences over from the old index (Index.peek_held_seqs)",
    ),
    (
        1722432961,
        [
            "tx-send#12 d=1 n=1 size=29 slot=1 opt=2",
            "fault#26 pick=0.54 opt=4 after=1",
            "restart#27",
            "crash#38 opt=3 after=8",
        ],
        "open",
        _ABORT_SYNC,
    ),
    (
        1334976997,
        [
            "send#25 d=1 n=3 size=479 pick=0.061 opt=4",
            "tx-ack#44 d=1 pick=0.264 slot=1",
            "fault#46 pick=0.028 opt=4 after=1",
            "repair#47",
            "crash#57 opt=3 after=13",
        ],
        "open",
        _ABORT_SYNC,
    ),
    (
        973649212,
        [
            "tx-send#3 d=2 n=2 size=3610 slot=1 opt=3",
            "fault#4 pick=0.352 opt=4 after=1",
            "verify#5",
            "crash#16 opt=2 after=5",
        ],
        "open",
        _ABORT_SYNC,
    ),
    (
        2617634439,
        [
            "send#8 d=1 n=3 size=482 pick=0.868 opt=1",
            "send-ack#28 d=2 n=1 size=5620 pick=0.217 opt=2",
            "send-ack#29 n=1 size=172 pick=0.888 opt=2",
            "stream#30 d=1 n=3 size=4114",
            "tx-ack#35 pick=0.306",
            "send#37 d=3 n=3 size=2379 pick=0.605",
            "delete-dest#38 pick=0.001",
            "send#39 d=2 n=1 size=3626 pick=0.701",
            "send#40 n=2 size=351 pick=0.778 opt=2",
            "tx-commit#44",
            "ack#46 d=1 n=2 pick=0.555",
            "ack#48 n=2 pick=0.29",
            "gc#49",
            "rebuild#61",
            "send#62 d=1 n=2 size=5267 pick=0.771 opt=2",
        ],
        "disk",
        "a transacted ack of /queue/a #1, then /queue/a deleted and created again (a new #1) "
        "before the commit, and the old #1's file collected: rebuild-index met a DEST_DELETE of "
        "a destination it did not know and kept the open transaction's remove, so the commit "
        "took the new #1 (lost) and tied the remove's file to it, while that file acked a "
        "message of the remove's file: two files kept for ever (the delete now drops the "
        "removes whether or not the index knows the destination: JournalState._dest_delete)",
    ),
]


@pytest.mark.parametrize(
    ("seed", "events", "check", "symptom"),
    FIXED_FAILING_CASES,
    ids=[f"seed-{case[0]}" for case in FIXED_FAILING_CASES],
)
def test_fixed_seed_stays_fixed(seed: int, events: list[str], check: str, symptom: str) -> None:
    """A seed that failed on a store bug, fixed since."""
    life = generate(seed)
    result = run_life(StoreKind.JOURNAL, life, [Event.parse(e) for e in events], known=frozenset())
    assert result.failure is None, f"{symptom}: {result.failure}"


# PostgreSQL lives that failed on the model, fixed since: (seed, shrunk events, what it was).
PG_MODEL_CASES = [
    (
        1525256437,
        [
            "send#29 d=2 n=2 size=480 pick=0.776 opt=4",
            "send#50 n=4 size=48 pick=0.403",
            "ack#66 n=2 pick=0.03",
            "crash#67 opt=2 after=1",
            "tx-ack#68 d=2 pick=0.863",
        ],
        "the model took a transacted remove for a synced write, so the lazy removes before it for "
        "durable; the PostgreSQL store keeps such a remove for its commit and writes nothing, and "
        "the server's crash undid them (a message came back, as a lazy ack allows)",
    ),
]


@pytest.mark.parametrize(
    ("seed", "events", "what"), PG_MODEL_CASES, ids=[f"seed-{c[0]}" for c in PG_MODEL_CASES]
)
def test_postgres_model_case_stays_fixed(
    pg: PgTarget, seed: int, events: list[str], what: str
) -> None:
    result = run_life(StoreKind.POSTGRES, generate(seed), [Event.parse(e) for e in events], pg=pg)
    assert result.failure is None, f"{what}: {result.failure}"


# Store bugs found and not fixed yet: (seed, shrunk events, check, symptom), each a strict xfail
# (none now; the test then shows as skipped, for an empty parameter set).
OPEN_FAILING_CASES: list[tuple[int, list[str], str, str]] = []


@pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="store bugs not fixed yet (OPEN_FAILING_CASES)"
)
@pytest.mark.parametrize(
    ("seed", "events", "check", "symptom"),
    OPEN_FAILING_CASES,
    ids=[f"seed-{case[0]}" for case in OPEN_FAILING_CASES],
)
def test_open_store_bug(seed: int, events: list[str], check: str, symptom: str) -> None:
    """A seed that fails on a store bug not fixed yet: once fixed, move it to
    FIXED_FAILING_CASES."""
    life = generate(seed)
    result = run_life(StoreKind.JOURNAL, life, [Event.parse(e) for e in events], known=frozenset())
    assert result.failure is None, f"{check}: {symptom}: {result.failure}"


def _by_hand(data_dir: Path, *, compaction_live_ratio: float) -> StoreConfig:
    """A journal of 16 KiB files whose collections and checkpoints run only when called."""
    return StoreConfig(
        data_dir=data_dir,
        journal_file_bytes=16 * KiB,
        gc_interval_s=3600.0,
        checkpoint_interval_s=3600.0,
        compaction_live_ratio=compaction_live_ratio,
    )


def _open(config: StoreConfig) -> JournalStore:
    store = JournalStore(config)
    store.open(lambda handles: None)
    return store


def test_a_rebuild_keeps_a_remove_that_opens_a_file(tmp_path: Path) -> None:
    """Found by the simulation (seed 502 before the disk-full rework), reproduced directly: a
    data file whose first record is a REMOVE loses its dependency on the file of the ADD when
    the index is rebuilt (replay registers a file only after its records, and
    `Tables.add_deps` skips files it does not know). GC then deletes the REMOVE's file
    while the ADD's file stays (another message pins it), and the next rebuild brings the
    acknowledged message back."""
    file_bytes = 16 * KiB
    config = _by_hand(tmp_path, compaction_live_ratio=0.0)

    def queue_x(store: JournalStore) -> list[int]:
        return [m.seq for m in store.load("/queue/x", 0, 100, 1 << 30)]

    store = _open(config)
    store.add(StoredMessage("/queue/x", 1, "acked", 1, {}, b"a" * 100), None)
    store.add(StoredMessage("/queue/x", 2, "kept", 1, {}, b"k" * 100), None)
    store.checkpoint()
    _, start = store.head_position
    store.add(StoredMessage("/queue/y", 1, "f", 1, {}, b""), None)
    store.checkpoint()
    overhead = store.head_position[1] - start
    seq = 2
    while store.head_position[0] == 1:  # fill file 1 until a REMOVE no longer fits in it
        room = file_bytes - store.head_position[1] - overhead - 12
        if room < 0:
            break
        store.add(StoredMessage("/queue/y", seq, "f", 1, {}, b"f" * min(room, 4000)), None)
        store.checkpoint()
        seq += 1
    assert store.head_position[0] == 1
    store.remove("/queue/x", 1)
    store.checkpoint()
    assert store.head_position[0] == 2  # the REMOVE opened file 2
    store.remove_range("/queue/y", seq)
    for n in range(1, 41):
        store.add(StoredMessage("/queue/w", n, "w", 1, {}, b"w" * 1500), None)
    store.remove_range("/queue/w", 40)
    store.close()
    tools.rebuild_index(tmp_path, config)
    store = _open(config)
    assert queue_x(store) == [2]
    store.gc()
    store.close()
    tools.rebuild_index(tmp_path, config)
    store = _open(config)
    try:
        assert queue_x(store) == [2]
    finally:
        store.close()


def test_a_rebuild_drops_a_transacted_remove_of_a_deleted_destination(tmp_path: Path) -> None:
    """Seed 2617634439, reproduced directly: an open transaction acks /queue/x #1, the
    destination is deleted (which drops that remove), collection deletes the file of the old
    message, and /queue/x is created again with a new #1 before the commit. A rebuild met the
    DEST_DELETE of a destination it did not know (its records were gone) and kept the remove,
    so the commit took the new #1: a receipted message lost, and the remove's file made to
    depend on the new message's file, while that file depended on the remove's (an ack of a
    message there): neither was ever collected."""
    config = _by_hand(tmp_path, compaction_live_ratio=0.5)

    def fill_to(store: JournalStore, destination: str, file_no: int) -> None:
        """Messages until the head is in `file_no`, then acked."""
        seq = 0
        while store.head_position[0] < file_no:
            seq += 1
            store.add(StoredMessage(destination, seq, "f", 1, {}, b"f" * 4000), None)
            store.checkpoint()
        store.remove_range(destination, seq)

    store = _open(config)
    store.add(StoredMessage("/queue/x", 1, "old", 1, {}, b"old"), None)
    fill_to(store, "/queue/f", 2)
    store.add(StoredMessage("/queue/y", 1, "y", 1, {}, b"y"), None)
    store.begin("t1")
    store.remove("/queue/x", 1, txid="t1")
    store.delete_destination("/queue/x")
    assert store.gc().deleted == [1]  # the old #1 and its destination's records go
    fill_to(store, "/queue/g", 3)
    store.add(StoredMessage("/queue/x", 1, "new", 1, {}, b"new"), None)
    store.commit("t1", [], None)
    store.remove("/queue/y", 1)  # file 3 depends on file 2
    store.checkpoint()
    assert store.head_position[0] == 3
    store.close()
    tools.rebuild_index(tmp_path, config)
    store = _open(config)
    try:
        assert [m.body for m in store.load("/queue/x", 0, 100, 1 << 30)] == [b"new"]
        store.remove("/queue/x", 1)
        fill_to(store, "/queue/h", 4)
        store.gc()
        assert files.list_files(tmp_path / "journal") == [4]
    finally:
        store.close()


# -- as long as asked ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    """What a worker sends back about one life (plain data: it crosses processes)."""

    kind: str
    events: int
    faults: dict[str, int]
    known: dict[str, int]
    crashes: int
    failure: str


def _quiet_worker() -> None:
    """Workers keep the store's log to themselves (a failure's report says what matters)."""
    logging.getLogger("sluice").addHandler(logging.NullHandler())
    logging.getLogger("sluice").propagate = False


def _one_life(kind: StoreKind, seed: int) -> _Outcome:
    report = simulate(kind, seed, shrink_s=60.0)
    r = report.result
    return _Outcome(kind.value, r.events, dict(r.faults), dict(r.known), r.crashes, report.text)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_random_lives_for_minutes(request: pytest.FixtureRequest) -> None:
    """Random seeds against both stores (the journal four times out of five) for
    `--sim-minutes` (1 if not given), one worker process per CPU; prints what ran and every
    failure with its seed and shrunk events."""
    minutes = float(request.config.getoption("sim_minutes") or 1.0)
    workers = os.cpu_count() or 1
    rng = random.SystemRandom()
    started = time.monotonic()
    deadline = started + minutes * 60
    lives: Counter[str] = Counter()
    events = crashes = 0
    faults: Counter[str] = Counter()
    known: Counter[str] = Counter()
    failures: list[str] = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_quiet_worker) as pool:
        running: set[Future[_Outcome]] = set()
        while running or time.monotonic() < deadline:
            while time.monotonic() < deadline and len(running) < 2 * workers:
                kind = StoreKind.MEMORY if rng.random() < 0.2 else StoreKind.JOURNAL
                running.add(pool.submit(_one_life, kind, rng.randrange(1 << 32)))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                outcome = future.result()
                lives[outcome.kind] += 1
                events += outcome.events
                crashes += outcome.crashes
                faults.update(outcome.faults)
                known.update(outcome.known)
                if outcome.failure:
                    failures.append(outcome.failure)
    took = (time.monotonic() - started) / 60
    total = sum(lives.values())
    print(
        f"\nstore lifecycle: {total} lives ({dict(lives)}) in {took:.1f} min on {workers} "
        f"processes: {total / took:.0f} lives/min, {events / took:.0f} events/min, "
        f"{sum(faults.values()) / took:.0f} faults injected/min ({dict(faults)}), "
        f"{crashes} crashes, known issues met {dict(known)}, {len(failures)} failures"
    )
    for text in failures:
        print("\n" + text)
    assert not failures, "\n\n".join(failures)
