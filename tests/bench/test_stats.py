"""The exactly-once verifier (the latency histogram's tests are in tests/test_histogram.py)."""

from __future__ import annotations

import pytest

from sluice.bench.stats import SeenTracker, Verification, verify


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
