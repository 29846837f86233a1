"""The log-linear latency histogram shared by the load generator and the broker: its buckets,
its percentiles against the exact ones, merging, and the ranges each of its users records."""

from __future__ import annotations

import random

import pytest

from sluice.histogram import LatencyHistogram, bucket_bounds, bucket_index, percentile


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


def test_nanoseconds_from_one_microsecond_to_ten_seconds() -> None:
    # The broker records hops in nanoseconds: log-uniform values over the whole range it sees.
    rng = random.Random(11)
    values = [int(10 ** rng.uniform(3, 10)) for _ in range(50_000)]
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    ordered = sorted(values)
    for p in (50, 90, 99, 99.9):
        exact = percentile(ordered, p)
        assert exact <= histogram.percentile(p) <= exact * 1.008, p
    assert histogram.percentile(100) == histogram.max_value == ordered[-1]
    # Bounded whatever the number of values: one count per bucket in use, at most the buckets
    # of everything up to 10 s.
    assert len(histogram.counts) <= bucket_index(10**10) + 1 <= 3600


def test_percentiles_of_a_known_set() -> None:
    histogram = LatencyHistogram()
    for value in [1000] * 90 + [2000] * 9 + [1_000_000]:
        histogram.record(value)
    # The top of each value's bucket, which is within 1/128 of it.
    assert 1000 <= histogram.percentile(50) <= 1008
    assert 1000 <= histogram.percentile(90) <= 1008
    assert 2000 <= histogram.percentile(91) <= 2016
    assert 2000 <= histogram.percentile(99) <= 2016
    assert histogram.percentile(99.9) == histogram.percentile(100) == 1_000_000
    assert histogram.total == 100
    assert histogram.mean == pytest.approx((90_000 + 18_000 + 1_000_000) / 100)
