"""Counting what a run measured: a mergeable latency histogram (`sluice.histogram`, shared with
the broker) and the exactly-once verifier.

`SeenTracker` is one consumer's record of which (producer, sequence) pairs it received: a byte per
expected message. It also counts messages that came out of order (a sequence below one already
received from the same producer: not a duplicate, and not a failure) and duplicates that came
after the consumer's last new message. `verify` merges the trackers of all consumers, and of the
emptiness check that drains a queue after the consumers left, and counts what is missing, what
came more than once (within a consumer, across consumers, or late: after the last expected message
or left in the queue), and what was left queued without ever being delivered.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.histogram import LatencyHistogram, bucket_bounds, bucket_index, percentile

__all__ = [
    "LatencyHistogram",
    "SeenTracker",
    "Verification",
    "bucket_bounds",
    "bucket_index",
    "percentile",
    "verify",
]

_MAX_LISTED = 10  # missing sequence numbers named per producer in a report


class SeenTracker:
    """Which messages one consumer received: a byte per (producer, sequence) it may receive."""

    __slots__ = (
        "corrupt",
        "duplicates",
        "last_seq",
        "per_producer",
        "reordered",
        "seen",
        "trailing_duplicates",
        "unexpected",
        "unique",
    )

    def __init__(self, per_producer: Sequence[int]) -> None:
        self.per_producer = list(per_producer)
        self.seen = [bytearray(n) for n in self.per_producer]
        self.unique = 0
        self.duplicates = 0
        # Duplicates since the last new message: at the end, those that came after it.
        self.trailing_duplicates = 0
        # New messages with a sequence below one already received from the same producer.
        self.reordered = 0
        self.last_seq = [-1] * len(self.per_producer)
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
                self.trailing_duplicates += 1
                return False
            marks[seq] = 1
        except IndexError:
            self.unexpected += 1
            return False
        if seq < self.last_seq[producer]:
            self.reordered += 1
        else:
            self.last_seq[producer] = seq
        self.unique += 1
        self.trailing_duplicates = 0
        return True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe, compressed form (see `from_dict`)."""
        return {
            "per_producer": self.per_producer,
            "seen": [base64.b64encode(zlib.compress(bytes(m), 1)).decode() for m in self.seen],
            "unique": self.unique,
            "duplicates": self.duplicates,
            "trailing_duplicates": self.trailing_duplicates,
            "reordered": self.reordered,
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
        tracker.trailing_duplicates = int(data.get("trailing_duplicates", 0))
        tracker.reordered = int(data.get("reordered", 0))
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
    # Every extra delivery, late ones included.
    duplicates: int = 0
    # Of those: after a consumer's last new message, or found in the queue after the run.
    late_duplicates: int = 0
    # Of the missing: found in the queue after the run, never delivered while consumers waited.
    left_queued: int = 0
    # Delivered out of order (counted, not a failure).
    reordered: int = 0
    unexpected: int = 0
    corrupt: int = 0
    # Whether a queue was drained up to a marker after the run: None for a topic or when the
    # check could not run, else what it found.
    queue_checked: bool | None = None
    # Why the check failed (its marker never came back, say); a failure of the run.
    check_failure: str | None = None
    # producer id -> first few missing sequence numbers, for the report
    missing_examples: dict[int, list[int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every message arrived exactly once and nothing else arrived."""
        return not (
            self.missing
            or self.unsent
            or self.duplicates
            or self.unexpected
            or self.corrupt
            or self.check_failure
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
            "late_duplicates": self.late_duplicates,
            "left_queued": self.left_queued,
            "reordered": self.reordered,
            "unexpected": self.unexpected,
            "corrupt": self.corrupt,
            "queue_checked": self.queue_checked,
            "check_failure": self.check_failure,
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
            late_duplicates=int(data.get("late_duplicates", 0)),
            left_queued=int(data.get("left_queued", 0)),
            reordered=int(data.get("reordered", 0)),
            unexpected=int(data["unexpected"]),
            corrupt=int(data["corrupt"]),
            queue_checked=data.get("queue_checked"),
            check_failure=data.get("check_failure"),
            missing_examples={int(k): list(v) for k, v in data["missing_examples"].items()},
        )


def _missing_seqs(marks: bytes, limit: int) -> list[int]:
    found: list[int] = []
    index = marks.find(0)
    while index >= 0 and len(found) < limit:
        found.append(index)
        index = marks.find(0, index + 1)
    return found


def _count_group(
    result: Verification,
    group: list[SeenTracker],
    per_producer: Sequence[int],
    sent_counts: Sequence[int],
    leftover: SeenTracker | None,
) -> None:
    """Add to `result` what `group` (consumers that share the messages) received, producer by
    producer; `leftover` is a queue's emptiness check."""
    for producer, count in enumerate(per_producer):
        union = 0
        for part in group:
            # Each byte is 0 or 1, so the integer's bits stand for sequence numbers.
            bits = int.from_bytes(part.seen[producer], "little")
            result.duplicates += (union & bits).bit_count()
            union |= bits
        if leftover is not None:
            found = int.from_bytes(leftover.seen[producer], "little")
            late = (union & found).bit_count()
            result.duplicates += late
            result.late_duplicates += late
            result.left_queued += (found & ~union).bit_count()
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


def verify(
    trackers: Iterable[SeenTracker],
    per_producer: Sequence[int],
    *,
    every_consumer: bool = False,
    sent: Sequence[int] | None = None,
    leftover: SeenTracker | None = None,
) -> Verification:
    """Merge consumers' trackers into one verdict.

    On a queue (`every_consumer` False) each message must reach exactly one consumer; on a topic
    (`every_consumer` True) each consumer must receive every message exactly once. `sent[i]`, if
    given, is how many messages producer i sent (its sequences 0..sent[i]-1): the rest count as
    unsent, not missing. `leftover` is what the emptiness check drained from a queue after the
    consumers left: a message some consumer had is a late duplicate, any other one was left
    queued (and stays missing: no consumer got it while they waited).
    """
    parts = list(trackers)
    result = Verification()
    sent_counts = (
        list(per_producer)
        if sent is None
        else [min(s, n) for s, n in zip(sent, per_producer, strict=True)]
    )
    for part in [*parts, *([leftover] if leftover is not None else [])]:
        if list(part.per_producer) != list(per_producer):
            raise ValueError("trackers disagree on the number of messages per producer")
        result.duplicates += part.duplicates
        result.late_duplicates += part.trailing_duplicates
        result.reordered += part.reordered
        result.unexpected += part.unexpected
        result.corrupt += part.corrupt
    if leftover is not None:
        # Every duplicate the check itself saw came after the run.
        result.late_duplicates += leftover.duplicates - leftover.trailing_duplicates
    if every_consumer:
        result.expected = sum(per_producer) * len(parts)
        groups: list[list[SeenTracker]] = [[part] for part in parts]
    else:
        result.expected = sum(per_producer)
        groups = [parts]
    queue_leftover = leftover if not every_consumer else None
    for group in groups:
        _count_group(result, group, per_producer, sent_counts, queue_leftover)
    return result
