"""Process-level lifecycle simulation: a real broker subprocess, stomp.py clients, SIGKILLs.

- `test_life`: a fixed list of seeds (about a minute in all); `--seed N` runs seed N instead.
- `test_random_lives` (`--run-slow --sim-minutes M`): random seeds for M minutes, each life
  summarised; every failure shrunk and reported at the end.
- `test_known_failure`: shrunk lives that find bugs not fixed yet (strict xfail).
- `test_fixed_bug_stays_fixed`: shrunk lives that found bugs fixed since; they must pass.
- Tests of the simulation itself: damage it must notice, and shrinking.

How to run and replay: docs/lifecycle-simulation.md.
"""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lifecycle.process_events import (
    Consume,
    Crash,
    DiskFull,
    DurableCreate,
    Event,
    Restart,
    Send,
    Settings,
    Stop,
    Transaction,
    WaitGc,
)
from lifecycle.process_io import small_disk_available
from lifecycle.process_model import SimFailure
from lifecycle.process_run import check_life, ddmin, run_life

# The default run: together about a minute. They cover crashes under load, mid-commit and
# mid-stop kills, offline tools between runs, --repair, durable subscriptions, dedup resends,
# large transactions across rollover, and GC with compaction.
DEFAULT_SEEDS = [1, 5, 7, 12, 14, 26, 33]


@dataclass(frozen=True)
class KnownFailure:
    """A shrunk life that finds a broker or store bug not fixed yet. It must keep failing with
    `check` until the fix lands; then the strict xfail turns into an error, and the life moves
    to `FIXED_BUGS`: a regression test that must pass (`check` and `bug` say what it found)."""

    name: str
    settings: Settings
    events: tuple[Event, ...]
    check: str
    bug: str
    needs_small_disk: bool = False


# Known failures whose bug was fixed: the same lives, which must now pass.
FIXED_BUGS = [
    KnownFailure(
        "csd-off-redelivers-acked",
        Settings(csd_queues=False),
        (Crash("mixed", 144, seed=152314202),),
        "acked-redelivered",
        "with concurrent_store_and_dispatch_queues=false a queue message waiting for its write "
        "was also read back from the store by a page read (Queue.accept kept it out of "
        "_unwritten): delivered twice, the second time without redelivered:true, even after "
        "its ACK was receipted",
    ),
    KnownFailure(
        "durable-cursor-ahead-after-restart",
        Settings(),
        (Send("/topic/sim.t1", 10, True, 600), DurableCreate("d2"), Stop()),
        "not-delivered",
        "a topic's sequence restarted from what the store held: a durable subscription created "
        "after unstored messages (or past non-persistent ones) had its cursor ahead of it and "
        "missed what was published after a restart (Topic.restore_durable now numbers on from "
        "the cursor)",
    ),
    KnownFailure(
        "index-enospc-fails-store",
        Settings(small_disk=True, store_full="block"),
        (Send("/queue/sim.q0", 30, True, 600), DiskFull(0, 100, 32 * 1024, acks=20)),
        "disk-full-failed-store",
        "an index checkpoint that met ENOSPC (another process, or the temp store's "
        "preallocation, took the reserve) killed the journal writer (lmdb.DiskError) and "
        "persistent sends were refused until a restart; it is now a full disk, retried",
        needs_small_disk=True,
    ),
    KnownFailure(
        "index-short-write-fails-store",
        Settings(
            gc_interval_s=1.0,
            index_write_batch=1000,
            sync="periodic",
            csd_queues=False,
            verify_journal="after_checkpoint",
            small_disk=True,
        ),
        (
            Transaction(
                ("/topic/sim.t1", "/queue/sim.q2"),
                2,
                12288,
                "/queue/sim.q2",
                0,
                dedup=True,
                outcome="commit",
                restart=Restart(tool="verify"),
            ),
            DiskFull(0, 51, 4096, acks=20),
        ),
        "disk-full-failed-store",
        "an index commit on a full disk that LMDB reported as EIO (a page write cut short) "
        "failed the store; on a filesystem with next to nothing free it is a full disk",
        needs_small_disk=True,
    ),
]

KNOWN_FAILURES: list[KnownFailure] = []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`life_seed` is the `--seed` to replay, or every default seed."""
    if "life_seed" in metafunc.fixturenames:
        replay = metafunc.config.getoption("seed")
        metafunc.parametrize("life_seed", DEFAULT_SEEDS if replay is None else [replay])


@pytest.mark.crash
def test_life(life_seed: int, tmp_path: Path) -> None:
    stats = check_life(life_seed, tmp_path, shrink_budget_s=120.0)
    print(stats.summary())
    # check_life raised if any check failed; a life that sent nothing would have proven little.
    assert stats.sent > 0


@pytest.mark.crash
@pytest.mark.parametrize(
    "known",
    [
        pytest.param(
            known,
            id=known.name,
            marks=pytest.mark.xfail(strict=True, raises=SimFailure, reason=known.bug),
        )
        for known in KNOWN_FAILURES
    ],
)
def test_known_failure(known: KnownFailure, tmp_path: Path) -> None:
    if known.needs_small_disk and not small_disk_available():
        pytest.skip("needs a tmpfs mount (root on Linux)")
    try:
        run_life(1, tmp_path / "life", settings=known.settings, events=list(known.events))
    except SimFailure as exc:
        failure = exc
    else:
        return  # fixed: the strict xfail reports it
    # Failing some other way means the harness or the bug changed: an error, not an xfail.
    assert failure.check == known.check, f"expected {known.check}, got {failure}"
    raise failure


@pytest.mark.crash
@pytest.mark.parametrize("fixed", [pytest.param(fixed, id=fixed.name) for fixed in FIXED_BUGS])
def test_fixed_bug_stays_fixed(fixed: KnownFailure, tmp_path: Path) -> None:
    if fixed.needs_small_disk and not small_disk_available():
        pytest.skip("needs a tmpfs mount (root on Linux)")
    try:
        stats = run_life(1, tmp_path / "life", settings=fixed.settings, events=list(fixed.events))
    except SimFailure as exc:
        raise AssertionError(f"{fixed.name} is back ({fixed.bug}): {exc}") from None
    assert stats.sent > 0


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(0)
def test_random_lives(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    minutes = request.config.getoption("sim_minutes") or 2.0
    deadline = time.monotonic() + minutes * 60
    rng = random.SystemRandom()
    lives = events = crashes = 0
    life_seconds = 0.0
    failures: list[str] = []
    shrunk_checks: set[str] = set()  # one shrink per kind of failure is enough
    started = time.monotonic()
    while time.monotonic() < deadline:
        seed = rng.randrange(1 << 31)
        root = tmp_path / f"seed-{seed}"
        try:
            stats = check_life(seed, root, shrink_budget_s=180.0, shrunk_checks=shrunk_checks)
        except AssertionError as exc:
            failures.append(str(exc))
            print(f"FAILED {exc}\n", flush=True)
        else:
            lives += 1
            events += stats.events
            crashes += stats.crashes
            life_seconds += stats.seconds
            print(stats.summary(), flush=True)
            shutil.rmtree(root, ignore_errors=True)
    total_min = (time.monotonic() - started) / 60
    life_min = max(life_seconds / 60, 1e-9)
    print(
        f"{lives} lives passed: {events} events, {crashes} crashes in {life_min:.1f} min "
        f"({lives / life_min:.1f} lives/min, {events / life_min:.0f} events/min); "
        f"{len(failures)} failed; {total_min:.1f} min in all, shrinking included"
    )
    assert not failures, "\n\n".join(failures)


def _lose_the_journal(data_dir: Path) -> None:
    """What a careless operator does between two runs."""
    shutil.rmtree(data_dir / "journal", ignore_errors=True)
    shutil.rmtree(data_dir / "index", ignore_errors=True)


@pytest.mark.crash
def test_a_lost_journal_is_noticed(tmp_path: Path) -> None:
    events: list[Event] = [Send("/queue/sim.q1", 5, True, 100), Stop()]
    with pytest.raises(SimFailure) as failure:
        run_life(7, tmp_path / "life", events=events, tamper=_lose_the_journal)
    assert failure.value.check == "lost"
    assert "/queue/sim.q1: 5 required messages missing" in failure.value.detail


def test_ddmin_keeps_only_what_the_failure_needs() -> None:
    needed: list[Event] = [Send("/queue/sim.q0", 3, True, 100), Stop()]
    noise: list[Event] = [WaitGc(), *(Consume("/queue/sim.q2", 5, 5, seed=n) for n in range(9))]
    events = [*noise[:4], needed[0], *noise[4:7], needed[1], *noise[7:]]
    tried: list[list[Event]] = []

    def fails(candidate: list[Event]) -> bool:
        tried.append(candidate)
        return all(event in candidate for event in needed)

    shrunk, tries = ddmin(events, fails, time.monotonic() + 10)
    assert shrunk == needed
    assert tries == len(tried)
    assert all(len(c) < len(events) for c in tried)


def test_ddmin_stops_at_its_deadline() -> None:
    events: list[Event] = [WaitGc()] * 8
    shrunk, tries = ddmin(events, lambda candidate: True, time.monotonic() - 1)
    assert (shrunk, tries) == (events, 0)
