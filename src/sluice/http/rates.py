"""Rates for the API: the broker's totals and each destination's counts, sampled every
`SAMPLE_INTERVAL_S` on the loop, and the rate per second between the last two samples. (Metrics
give counters; Prometheus computes its own rates.)

The last `HISTORY_SAMPLES` samples of the whole broker (rates, depth, memory, store) are kept
for the console's charts, and the store's collections and compactions as they are seen to
happen (the last `HISTORY_STORE_EVENTS`): bounded, whatever the broker's uptime."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from sluice.core.broker import Broker
from sluice.core.views import DestinationView, Totals

__all__ = ["SAMPLE_INTERVAL_S", "RateSampler", "Rates", "Sample", "StoreEvent"]

SAMPLE_INTERVAL_S = 5.0
# 15 minutes of samples; 100 store events.
HISTORY_SAMPLES = 180
HISTORY_STORE_EVENTS = 100


@dataclass(frozen=True, slots=True)
class Rates:
    """Messages per second over the last sampling interval."""

    messages_in: float = 0.0
    delivered: float = 0.0
    acked: float = 0.0
    redelivered: float = 0.0
    dead_lettered: float = 0.0
    expired: float = 0.0


_ZERO = Rates()


@dataclass(frozen=True, slots=True)
class Sample:
    """The whole broker at one sample: its rates since the previous one, and its levels."""

    at_ms: int
    messages_in: float
    delivered: float
    acked: float
    messages_ready: int
    messages_in_flight: int
    memory_bytes: int
    store_bytes: int


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """Collections and compactions of the store seen between two samples: files deleted,
    archived, compacted, and checkpoints taken."""

    at_ms: int
    deleted_files: int
    archived_files: int
    compacted_files: int
    checkpoints: int


def _rates(before: Totals, after: Totals, seconds: float) -> Rates:
    if seconds <= 0:
        return _ZERO
    values = [
        max(0.0, (getattr(after, f.name) - getattr(before, f.name)) / seconds)
        for f in fields(Totals)
    ]
    return Rates(*(round(value, 3) for value in values))


class RateSampler:
    """Samples the broker's counts on a timer; answers the rates of the last interval."""

    def __init__(
        self,
        broker: Broker,
        loop: asyncio.AbstractEventLoop,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._broker = broker
        self._loop = loop
        self._interval_s = interval_s
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._taken_at = clock()
        self._totals = broker.totals()
        self._by_destination: dict[str, Totals] = self._destination_totals()
        self.broker_rates = _ZERO
        self._destination_rates: dict[str, Rates] = {}
        self.history: collections.deque[Sample] = collections.deque(maxlen=HISTORY_SAMPLES)
        self.store_events: collections.deque[StoreEvent] = collections.deque(
            maxlen=HISTORY_STORE_EVENTS
        )
        self._store_counts = self._store_totals()

    def _store_totals(self) -> tuple[int, int, int, int]:
        stats = self._broker.store.stats()
        return (
            stats.gc_deleted_files,
            stats.gc_archived_files,
            stats.compacted_files,
            stats.checkpoints,
        )

    @property
    def interval_s(self) -> float:
        """Seconds between samples."""
        return self._interval_s

    def _destination_totals(self, views: list[DestinationView] | None = None) -> dict[str, Totals]:
        if views is None:
            views = self._broker.destination_views()
        return {view.name: view.totals for view in views}

    def start(self) -> None:
        """Sample every interval from now on."""
        self._timer = self._loop.call_later(self._interval_s, self._sample)

    def stop(self) -> None:
        """Sample no more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sample(self) -> None:
        self.sample()
        self._timer = self._loop.call_later(self._interval_s, self._sample)

    def sample(self) -> None:
        """Take a sample now: the rates are those since the previous one."""
        now = self._clock()
        seconds = now - self._taken_at
        totals = self._broker.totals()
        views = self._broker.destination_views()
        by_destination = self._destination_totals(views)
        self.broker_rates = _rates(self._totals, totals, seconds)
        previous = self._by_destination
        self._destination_rates = {
            name: _rates(previous[name], counts, seconds)
            for name, counts in by_destination.items()
            if name in previous
        }
        self._taken_at, self._totals, self._by_destination = now, totals, by_destination
        self._record(views)

    def _record(self, views: list[DestinationView]) -> None:
        broker = self._broker
        now_ms = broker.now_ms()
        ready = in_flight = 0
        for view in views:
            ready += view.messages_ready
            in_flight += view.messages_in_flight
        rates = self.broker_rates
        self.history.append(
            Sample(
                now_ms,
                rates.messages_in,
                rates.delivered,
                rates.acked,
                ready,
                in_flight,
                broker.usage.used,
                broker.store_disk.held_bytes,
            )
        )
        counts = self._store_totals()
        if counts != self._store_counts:
            deltas = [max(0, a - b) for a, b in zip(counts, self._store_counts, strict=True)]
            self.store_events.append(StoreEvent(now_ms, *deltas))
            self._store_counts = counts

    def destination_rates(self, name: str) -> Rates:
        """The rates of one destination (zero for one younger than the last interval)."""
        return self._destination_rates.get(name, _ZERO)
