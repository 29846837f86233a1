"""A latency histogram of bounded size whose percentiles are within 1 % of the exact ones.

`LatencyHistogram` is log-linear (as HdrHistogram): values below 256 are exact, larger ones fall
into buckets at most 1/128 of their value wide, so a percentile is off by under 0.8 % whatever the
range; it holds one count per bucket in use (at most 128 per power of two of the largest value, so
about 3,600 for nanoseconds up to 10 s), and histograms from many processes add up (`merge`).

Shared by the load generator (`sluice.bench`, microseconds) and the broker's per-hop latency of
persistent sends (`sluice.server.hops`, nanoseconds); it imports nothing of Sluice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["LatencyHistogram", "bucket_bounds", "bucket_index", "percentile"]

_SUB_BITS = 7
_SUB_COUNT = 1 << _SUB_BITS  # 128 buckets per power of two
_LINEAR_LIMIT = 2 * _SUB_COUNT  # values below this have a bucket each


def bucket_index(value: int) -> int:
    """The bucket of a non-negative integer value."""
    if value < _LINEAR_LIMIT:
        return value if value > 0 else 0
    shift = value.bit_length() - _SUB_BITS - 1
    return _LINEAR_LIMIT + (shift - 1) * _SUB_COUNT + ((value >> shift) - _SUB_COUNT)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The smallest and largest value that fall into bucket `index`."""
    if index < _LINEAR_LIMIT:
        return index, index
    shift, offset = divmod(index - _LINEAR_LIMIT, _SUB_COUNT)
    shift += 1
    mantissa = offset + _SUB_COUNT
    return mantissa << shift, ((mantissa + 1) << shift) - 1


def percentile(sorted_values: Sequence[int | float], p: float) -> int | float:
    """Nearest-rank percentile of already sorted values (p in 0..100); the exact reference."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class LatencyHistogram:
    """Counts of non-negative integer values (the load generator records microseconds)."""

    __slots__ = ("counts", "max_value", "min_value", "sum_values", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.sum_values = 0
        self.min_value = 0
        self.max_value = 0

    def record(self, value: int) -> None:
        """Count one value; a negative value (clock skew) counts as 0."""
        value = max(value, 0)
        if value < _LINEAR_LIMIT:
            index = value
        else:
            shift = value.bit_length() - _SUB_BITS - 1
            index = _LINEAR_LIMIT + (shift - 1) * _SUB_COUNT + ((value >> shift) - _SUB_COUNT)
        counts = self.counts
        counts[index] = counts.get(index, 0) + 1
        if self.total == 0 or value < self.min_value:
            self.min_value = value
        self.max_value = max(self.max_value, value)
        self.total += 1
        self.sum_values += value

    def merge(self, other: LatencyHistogram) -> None:
        """Add another histogram's counts to this one."""
        if other.total == 0:
            return
        counts = self.counts
        for index, count in other.counts.items():
            counts[index] = counts.get(index, 0) + count
        if self.total == 0 or other.min_value < self.min_value:
            self.min_value = other.min_value
        self.max_value = max(self.max_value, other.max_value)
        self.total += other.total
        self.sum_values += other.sum_values

    def percentile(self, p: float) -> int:
        """The value at percentile `p` (0..100): the top of its bucket, never above the maximum."""
        if self.total == 0:
            return 0
        if not 0 <= p <= 100:
            raise ValueError(f"percentile must be within 0..100, got {p}")
        rank = max(1, math.ceil(p / 100 * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                high = bucket_bounds(index)[1]
                return min(max(high, self.min_value), self.max_value)
        return self.max_value

    @property
    def mean(self) -> float:
        """The exact mean of the recorded values."""
        return self.sum_values / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form (see `from_dict`)."""
        return {
            "counts": sorted(self.counts.items()),
            "total": self.total,
            "sum": self.sum_values,
            "min": self.min_value,
            "max": self.max_value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyHistogram:
        """Rebuild a histogram from `to_dict` output."""
        histogram = cls()
        histogram.counts = {int(index): int(count) for index, count in data["counts"]}
        histogram.total = int(data["total"])
        histogram.sum_values = int(data["sum"])
        histogram.min_value = int(data["min"])
        histogram.max_value = int(data["max"])
        return histogram
