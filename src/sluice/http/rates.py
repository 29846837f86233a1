"""Rates for the API: the broker's totals and each destination's counts, sampled every
`SAMPLE_INTERVAL_S` on the loop, and the rate per second between the last two samples. (Metrics
give counters; Prometheus computes its own rates.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from sluice.core.broker import Broker
from sluice.core.views import Totals

__all__ = ["SAMPLE_INTERVAL_S", "RateSampler", "Rates"]

SAMPLE_INTERVAL_S = 5.0


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

    def _destination_totals(self) -> dict[str, Totals]:
        return {view.name: view.totals for view in self._broker.destination_views()}

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
        by_destination = self._destination_totals()
        self.broker_rates = _rates(self._totals, totals, seconds)
        previous = self._by_destination
        self._destination_rates = {
            name: _rates(previous[name], counts, seconds)
            for name, counts in by_destination.items()
            if name in previous
        }
        self._taken_at, self._totals, self._by_destination = now, totals, by_destination

    def destination_rates(self, name: str) -> Rates:
        """The rates of one destination (zero for one younger than the last interval)."""
        return self._destination_rates.get(name, _ZERO)
