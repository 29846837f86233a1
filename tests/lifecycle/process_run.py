"""Running lives: one (`run_life`), or one checked and, on failure, shrunk and reported
(`check_life`). Shrinking is delta debugging (`ddmin`) over the event list, with the life's
settings fixed, keeping the smallest list that still fails the same check within a time budget.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lifecycle.process_events import Event, Settings, generate
from lifecycle.process_model import SimFailure
from lifecycle.process_sim import Life, LifeStats, Tamper


def run_life(
    seed: int,
    workdir: Path,
    *,
    settings: Settings | None = None,
    events: list[Event] | None = None,
    tamper: Tamper | None = None,
) -> LifeStats:
    """Run one life (the seed's own events unless `events` is given); raises `SimFailure`."""
    drawn_settings, drawn_events = generate(seed)
    life = Life(
        seed,
        settings or drawn_settings,
        drawn_events if events is None else events,
        workdir,
        tamper=tamper,
    )
    return life.run()


def _workdirs(root: Path, prefix: str) -> Iterator[Path]:
    n = 0
    while True:
        n += 1
        path = root / f"{prefix}-{n}"
        yield path
        shutil.rmtree(path, ignore_errors=True)


def ddmin(
    events: list[Event], fails: Callable[[list[Event]], bool], deadline: float
) -> tuple[list[Event], int]:
    """Delta debugging: drop chunks of events, halving the chunks when none can go, while
    `fails` still holds; stops at `deadline` (monotonic). Returns the smallest failing list
    found and the number of candidates tried."""
    current = list(events)
    tries = 0
    chunks = 2
    while current and time.monotonic() < deadline:
        size = max(1, -(-len(current) // chunks))
        for start in range(0, len(current), size):
            if time.monotonic() >= deadline:
                break
            candidate = current[:start] + current[start + size :]
            tries += 1
            if fails(candidate):
                current = candidate
                chunks = max(chunks - 1, 2)
                break
        else:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return current, tries


def shrink(
    seed: int,
    settings: Settings,
    events: list[Event],
    check: str,
    root: Path,
    budget_s: float,
    *,
    tamper: Tamper | None = None,
) -> tuple[list[Event], int]:
    """The smallest sub-list of a failed life's events that still fails the same `check`,
    found within `budget_s`, and the number of lives tried."""
    workdirs = _workdirs(root, f"shrink-{seed}")

    def fails(candidate: list[Event]) -> bool:
        try:
            run_life(seed, next(workdirs), settings=settings, events=candidate, tamper=tamper)
        except SimFailure as failure:
            return failure.check == check
        return False

    return ddmin(events, fails, time.monotonic() + budget_s)


def report(
    seed: int,
    settings: Settings,
    failure: SimFailure,
    events: list[Event],
    shrunk: list[Event],
    tries: int,
) -> str:
    """The message of a failed life: seed, check, shrunk events."""
    notes = "\n".join(getattr(failure, "__notes__", []))
    lines = [
        f"lifecycle simulation failed: seed {seed}",
        f"replay: pytest tests/lifecycle/test_process_lifecycle.py -k test_life --seed {seed}",
        f"check: {failure.check}",
        f"{failure.detail}",
        notes,
        f"settings: {settings!r}",
        f"shrunk to {len(shrunk)} of {len(events)} events ({tries} lives tried):"
        if tries
        else f"events ({len(events)}, not shrunk: this check was shrunk before):",
        *[f"    {event!r}," for event in shrunk],
    ]
    return "\n".join(line for line in lines if line)


def check_life(
    seed: int,
    root: Path,
    *,
    shrink_budget_s: float = 120.0,
    tamper: Tamper | None = None,
    events: list[Event] | None = None,
    shrunk_checks: set[str] | None = None,
) -> LifeStats:
    """Run life `seed`; on failure shrink it and raise an `AssertionError` with the report.
    `shrunk_checks`: checks already shrunk in this session, not shrunk again (the set grows)."""
    settings, drawn = generate(seed)
    events = drawn if events is None else events
    try:
        return run_life(
            seed, root / f"life-{seed}", settings=settings, events=events, tamper=tamper
        )
    except SimFailure as failure:
        budget = shrink_budget_s
        if shrunk_checks is not None:
            if failure.check in shrunk_checks:
                budget = 0.0
            shrunk_checks.add(failure.check)
        shrunk, tries = shrink(seed, settings, events, failure.check, root, budget, tamper=tamper)
        raise AssertionError(report(seed, settings, failure, events, shrunk, tries)) from None
