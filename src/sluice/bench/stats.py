"""Counting what a run measured: a mergeable latency histogram and the exactly-once verifier.

`LatencyHistogram` is log-linear (as HdrHistogram): values below 256 are exact, larger ones fall
into buckets at most 1/128 of their value wide, so a percentile is off by under 0.8 % whatever the
range, memory stays bounded, and histograms from many processes add up.

`SeenTracker` is one consumer's record of which (producer, sequence) pairs it received: a byte per
expected message. `verify` merges the trackers of all consumers and counts what is missing and what
came more than once, within a consumer or across consumers.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LatencyHistogram",
    "SeenTracker",
    "Verification",
    "bucket_bounds",
    "bucket_index",
    "percentile",
    "verify",
]

_SUB_BITS = 7
_SUB_COUNT = 1 << _SUB_BITS  # 128 buckets per power of two
_LINEAR_LIMIT = 2 * _SUB_COUNT  # values below this have a bucket each
_MAX_LISTED = 10  # missing sequence numbers named per producer in a report


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


class SeenTracker:
    """Which messages one consumer received: a byte per (producer, sequence) it may receive."""

    __slots__ = ("corrupt", "duplicates", "per_producer", "seen", "unexpected", "unique")

    def __init__(self, per_producer: Sequence[int]) -> None:
        self.per_producer = list(per_producer)
        self.seen = [bytearray(n) for n in self.per_producer]
        self.unique = 0
        self.duplicates = 0
        # Well-formed bodies naming a producer or sequence outside the run.
        self.unexpected = 0
        # Bodies that are not what the load generator sends (size, magic, filler).
        self.corrupt = 0

    def add(self, producer: int, seq: int) -> bool:
        """Record a message; True if it is new, False for a duplicate or an unexpected one."""
        try:
            marks = self.seen[producer]
            if seq < 0:
                raise IndexError(seq)
            if marks[seq]:
                self.duplicates += 1
                return False
            marks[seq] = 1
        except IndexError:
            self.unexpected += 1
            return False
        self.unique += 1
        return True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe, compressed form (see `from_dict`)."""
        return {
            "per_producer": self.per_producer,
            "seen": [base64.b64encode(zlib.compress(bytes(m), 1)).decode() for m in self.seen],
            "unique": self.unique,
            "duplicates": self.duplicates,
            "unexpected": self.unexpected,
            "corrupt": self.corrupt,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeenTracker:
        """Rebuild a tracker from `to_dict` output; raises ValueError if it does not add up."""
        tracker = cls(data["per_producer"])
        for index, text in enumerate(data["seen"]):
            marks = zlib.decompress(base64.b64decode(text))
            if len(marks) != tracker.per_producer[index] or marks.strip(b"\x00\x01"):
                raise ValueError(f"tracker of producer {index} is malformed")
            tracker.seen[index] = bytearray(marks)
        tracker.unique = int(data["unique"])
        tracker.duplicates = int(data["duplicates"])
        tracker.unexpected = int(data["unexpected"])
        tracker.corrupt = int(data["corrupt"])
        return tracker


@dataclass
class Verification:
    """The exactly-once verdict over all consumers of a run."""

    expected: int = 0
    received: int = 0
    missing: int = 0
    # Messages the producers never sent (a run cut short); not a broker fault, but not a pass.
    unsent: int = 0
    duplicates: int = 0
    unexpected: int = 0
    corrupt: int = 0
    # producer id -> first few missing sequence numbers, for the report
    missing_examples: dict[int, list[int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every message arrived exactly once and nothing else arrived."""
        return not (
            self.missing or self.unsent or self.duplicates or self.unexpected or self.corrupt
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form."""
        return {
            "ok": self.ok,
            "expected": self.expected,
            "received": self.received,
            "missing": self.missing,
            "unsent": self.unsent,
            "duplicates": self.duplicates,
            "unexpected": self.unexpected,
            "corrupt": self.corrupt,
            "missing_examples": {str(k): v for k, v in self.missing_examples.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verification:
        """Rebuild a verdict from `to_dict` output."""
        return cls(
            expected=int(data["expected"]),
            received=int(data["received"]),
            missing=int(data["missing"]),
            unsent=int(data["unsent"]),
            duplicates=int(data["duplicates"]),
            unexpected=int(data["unexpected"]),
            corrupt=int(data["corrupt"]),
            missing_examples={int(k): list(v) for k, v in data["missing_examples"].items()},
        )


def _missing_seqs(marks: bytes, limit: int) -> list[int]:
    found: list[int] = []
    index = marks.find(0)
    while index >= 0 and len(found) < limit:
        found.append(index)
        index = marks.find(0, index + 1)
    return found


def verify(
    trackers: Iterable[SeenTracker],
    per_producer: Sequence[int],
    *,
    every_consumer: bool = False,
    sent: Sequence[int] | None = None,
) -> Verification:
    """Merge consumers' trackers into one verdict.

    On a queue (`every_consumer` False) each message must reach exactly one consumer; on a topic
    (`every_consumer` True) each consumer must receive every message exactly once. `sent[i]`, if
    given, is how many messages producer i sent (its sequences 0..sent[i]-1): the rest count as
    unsent, not missing.
    """
    parts = list(trackers)
    result = Verification()
    sent_counts = (
        list(per_producer)
        if sent is None
        else [min(s, n) for s, n in zip(sent, per_producer, strict=True)]
    )
    for part in parts:
        if list(part.per_producer) != list(per_producer):
            raise ValueError("trackers disagree on the number of messages per producer")
        result.duplicates += part.duplicates
        result.unexpected += part.unexpected
        result.corrupt += part.corrupt
    if every_consumer:
        result.expected = sum(per_producer) * len(parts)
        groups: list[list[SeenTracker]] = [[part] for part in parts]
    else:
        result.expected = sum(per_producer)
        groups = [parts]
    for group in groups:
        for producer, count in enumerate(per_producer):
            union = 0
            for part in group:
                # Each byte is 0 or 1, so the integer's bits stand for sequence numbers.
                bits = int.from_bytes(part.seen[producer], "little")
                result.duplicates += (union & bits).bit_count()
                union |= bits
            result.received += union.bit_count()
            sent_count = sent_counts[producer]
            result.unsent += count - sent_count
            # Only the bytes of sequences that were sent: received is at most sent_count.
            received = (union & ((1 << (8 * sent_count)) - 1)).bit_count()
            if received < sent_count:
                result.missing += sent_count - received
                marks = union.to_bytes(count, "little")[:sent_count]
                examples = result.missing_examples.setdefault(producer, [])
                examples.extend(_missing_seqs(marks, _MAX_LISTED - len(examples)))
    return result
