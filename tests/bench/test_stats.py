"""The latency histogram and the exactly-once verifier."""

from __future__ import annotations

import random

import pytest

from sluice.bench.stats import (
    LatencyHistogram,
    SeenTracker,
    Verification,
    bucket_bounds,
    bucket_index,
    percentile,
    verify,
)


def test_nearest_rank_percentile() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 99.9) == 100
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([5], 50) == 5
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_buckets_are_contiguous_and_contain_their_values() -> None:
    previous_high = -1
    for index in range(bucket_index(10**12) + 1):
        low, high = bucket_bounds(index)
        assert low == previous_high + 1
        assert bucket_index(low) == index
        assert bucket_index(high) == index
        # Wide buckets stay within 1/128 of their values.
        assert high - low <= max(0, low // 128)
        previous_high = high


@pytest.mark.parametrize("value", [0, 1, 255, 256, 257, 511, 512, 1000, 123_456, 2**40 + 3])
def test_bucket_of_a_value(value: int) -> None:
    low, high = bucket_bounds(bucket_index(value))
    assert low <= value <= high


def test_histogram_percentiles_are_within_one_percent_of_exact() -> None:
    rng = random.Random(7)
    values = [int(rng.lognormvariate(6, 1.5)) for _ in range(20_000)]
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    ordered = sorted(values)
    for p in (1, 50, 90, 99, 99.9, 100):
        exact = percentile(ordered, p)
        approx = histogram.percentile(p)
        assert exact <= approx <= exact * 1.008 + 1, p
    assert histogram.max_value == ordered[-1]
    assert histogram.min_value == ordered[0]
    assert histogram.percentile(100) == ordered[-1]
    assert histogram.mean == pytest.approx(sum(values) / len(values))


def test_histogram_merge_equals_recording_everything() -> None:
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for value in range(0, 5000, 7):
        a.record(value)
        both.record(value)
    for value in range(3, 90_000, 11):
        b.record(value)
        both.record(value)
    a.merge(b)
    assert a.to_dict() == both.to_dict()
    assert LatencyHistogram.from_dict(a.to_dict()).to_dict() == both.to_dict()


def test_empty_histogram_and_negative_values() -> None:
    histogram = LatencyHistogram()
    assert histogram.percentile(99) == 0
    histogram.record(-5)
    assert histogram.min_value == 0
    assert histogram.percentile(50) == 0
    with pytest.raises(ValueError):
        histogram.percentile(-1)


def _tracker(per_producer: list[int], pairs: list[tuple[int, int]]) -> SeenTracker:
    tracker = SeenTracker(per_producer)
    for producer, seq in pairs:
        tracker.add(producer, seq)
    return tracker


def test_everything_once_verifies() -> None:
    per_producer = [3, 2]
    a = _tracker(per_producer, [(0, 0), (0, 2), (1, 1)])
    b = _tracker(per_producer, [(0, 1), (1, 0)])
    result = verify([a, b], per_producer)
    assert result.ok
    assert (result.expected, result.received, result.missing, result.duplicates) == (5, 5, 0, 0)


def test_loss_is_detected_and_named() -> None:
    per_producer = [5]
    result = verify([_tracker(per_producer, [(0, 0), (0, 1), (0, 4)])], per_producer)
    assert not result.ok
    assert result.missing == 2
    assert result.missing_examples == {0: [2, 3]}


def test_duplicate_within_a_consumer_is_detected() -> None:
    tracker = SeenTracker([2])
    assert tracker.add(0, 0)
    assert not tracker.add(0, 0)
    assert tracker.add(0, 1)
    result = verify([tracker], [2])
    assert result.duplicates == 1
    assert result.missing == 0
    assert not result.ok


def test_duplicate_across_consumers_is_detected() -> None:
    per_producer = [3]
    a = _tracker(per_producer, [(0, 0), (0, 1)])
    b = _tracker(per_producer, [(0, 1), (0, 2)])
    result = verify([a, b], per_producer)
    assert result.duplicates == 1
    assert result.missing == 0
    assert not result.ok


def test_unexpected_and_corrupt_messages_fail_verification() -> None:
    tracker = SeenTracker([1])
    assert tracker.add(0, 0)
    assert not tracker.add(0, 1)  # beyond the producer's count
    assert not tracker.add(3, 0)  # no such producer
    assert not tracker.add(0, -1)
    result = verify([tracker], [1])
    assert result.unexpected == 3
    assert not result.ok
    clean = SeenTracker([1])
    clean.add(0, 0)
    clean.corrupt = 1
    assert not verify([clean], [1]).ok


def test_topic_needs_every_message_at_every_consumer() -> None:
    per_producer = [2]
    full = _tracker(per_producer, [(0, 0), (0, 1)])
    half = _tracker(per_producer, [(0, 1)])
    result = verify([full, half], per_producer, every_consumer=True)
    assert result.expected == 4
    assert result.received == 3
    assert result.missing == 1
    assert result.duplicates == 0  # the same message at two topic consumers is no duplicate
    assert verify([full, full], per_producer, every_consumer=True).ok


def test_tracker_survives_json_form() -> None:
    tracker = _tracker([4, 100_000], [(0, 3), (1, 99_999), (1, 5)])
    tracker.add(1, 5)
    tracker.corrupt = 2
    copy = SeenTracker.from_dict(tracker.to_dict())
    assert copy.seen == tracker.seen
    assert (copy.unique, copy.duplicates, copy.corrupt) == (3, 1, 2)


def test_malformed_tracker_is_refused() -> None:
    data = SeenTracker([4]).to_dict()
    data["per_producer"] = [5]
    with pytest.raises(ValueError, match="malformed"):
        SeenTracker.from_dict(data)


def test_trackers_must_agree_on_counts() -> None:
    with pytest.raises(ValueError):
        verify([SeenTracker([1]), SeenTracker([2])], [1])


def test_unsent_messages_are_not_counted_missing() -> None:
    per_producer = [10, 4]
    tracker = _tracker(per_producer, [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)])
    result = verify([tracker], per_producer, sent=[3, 4])
    assert result.unsent == 7
    assert result.missing == 1
    assert result.missing_examples == {0: [1]}
    assert not result.ok
    assert verify([tracker], per_producer).missing == 8
    assert Verification.from_dict(result.to_dict()) == result


def test_reordered_messages_are_counted_apart_from_duplicates() -> None:
    tracker = SeenTracker([4])
    for seq in (1, 0, 2, 3):
        assert tracker.add(0, seq)
    assert (tracker.unique, tracker.reordered, tracker.duplicates) == (4, 1, 0)
    result = verify([tracker], [4])
    assert result.ok  # out of order is counted, not a failure
    assert result.reordered == 1


def test_duplicates_after_the_last_new_message_are_late() -> None:
    tracker = SeenTracker([3])
    tracker.add(0, 0)
    tracker.add(0, 0)  # a duplicate while messages still come: not late
    tracker.add(0, 1)
    tracker.add(0, 2)
    tracker.add(0, 1)  # after the last new one
    assert (tracker.duplicates, tracker.trailing_duplicates) == (2, 1)
    copy = SeenTracker.from_dict(tracker.to_dict())
    assert (copy.trailing_duplicates, copy.reordered) == (1, 0)
    result = verify([copy], [3])
    assert (result.duplicates, result.late_duplicates) == (2, 1)
    assert not result.ok


def test_what_the_emptiness_check_drains_is_a_late_duplicate_or_left_queued() -> None:
    per_producer = [4]
    consumer = _tracker(per_producer, [(0, 0), (0, 1), (0, 3)])
    drained = _tracker(per_producer, [(0, 1), (0, 2)])
    result = verify([consumer], per_producer, leftover=drained)
    assert (result.duplicates, result.late_duplicates) == (1, 1)  # message 1 again
    assert result.left_queued == 1  # message 2, never delivered while the consumer waited
    assert result.missing == 1
    assert result.received == 3
    assert not result.ok
    # A duplicate within what was drained is late too.
    drained.add(0, 2)
    again = verify([consumer], per_producer, leftover=drained)
    assert (again.duplicates, again.late_duplicates) == (2, 2)
    clean = verify([consumer], per_producer, leftover=SeenTracker(per_producer))
    assert (clean.duplicates, clean.left_queued, clean.missing) == (0, 0, 1)


def test_a_failed_check_fails_the_verdict() -> None:
    tracker = _tracker([1], [(0, 0)])
    result = verify([tracker], [1])
    assert result.ok
    result.check_failure = "queue check: its marker did not come back"
    assert not result.ok
    assert Verification.from_dict(result.to_dict()) == result
