"""`DiskBudget`: a store's room against its limit and the free disk, episodes of being full."""

from __future__ import annotations

import collections
import dataclasses
import logging

import pytest

from sluice.config import MiB, StoreFullPolicy
from sluice.core.disk import DiskBudget
from sluice.store.api import StoreStats
from sluice.store.memory import MemoryStore

from .fakes import Harness

FILE = 4 * MiB
RESERVE = 8 * MiB


def _budget(limit_bytes: int = 0) -> tuple[DiskBudget, collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()

    def count(name: str, n: int) -> None:
        counts[name] += n

    budget = DiskBudget(
        "the store",
        "persistent producers",
        counter="store",
        limit_name="store.max_bytes",
        limit_bytes=limit_bytes,
        reserve_bytes=RESERVE,
        resume_bytes=FILE,
        policy=StoreFullPolicy.BLOCK,
        count=count,
    )
    return budget, counts


def _stats(free: int, preallocated: int = 0, data: int = 0, no_space: bool = False) -> StoreStats:
    return StoreStats(
        disk_free_bytes=free, preallocated_bytes=preallocated, data_bytes=data, no_space=no_space
    )


def test_room_counts_preallocated_space_and_keeps_the_reserve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget, counts = _budget()
    budget.measure(_stats(free=10 * MiB, preallocated=2 * MiB), now=0.0)
    assert budget.room_bytes == 4 * MiB
    assert not budget.is_full(0.0)
    # Accepted bytes use the room up between measures.
    budget.note_accepted(3 * MiB)
    assert not budget.is_full(0.1)
    with caplog.at_level(logging.WARNING, logger="sluice.core.disk"):
        budget.note_accepted(MiB)
        assert budget.is_full(0.2)
        assert budget.is_full(0.3)
    assert counts["store_full_episodes"] == 1
    assert caplog.text.count("the store is full") == 1  # once per episode
    assert "store.reserve_bytes=8.0 MiB" in caplog.text
    assert "persistent producers are paused" in caplog.text


def test_an_episode_ends_once_a_file_of_room_is_back(caplog: pytest.LogCaptureFixture) -> None:
    budget, counts = _budget()
    assert not budget.measure(_stats(free=RESERVE), now=0.0)
    assert budget.full
    budget.paused_producer()
    # Some room, not a file's worth: still full (collection frees whole files).
    assert not budget.measure(_stats(free=RESERVE + MiB), now=1.0)
    assert budget.full
    with caplog.at_level(logging.INFO, logger="sluice.core.disk"):
        assert budget.measure(_stats(free=RESERVE + FILE), now=2.5)
    assert not budget.full
    assert "has room again (4.0 MiB) after 2.5 s full: 1 producers were paused" in caplog.text
    assert counts == {"store_full_episodes": 1, "flow_paused_disk": 1}


def test_no_space_for_the_next_file_holds_the_store_full() -> None:
    budget, _ = _budget()
    budget.measure(_stats(free=100 * MiB, no_space=True), now=0.0)
    assert budget.full
    assert not budget.measure(_stats(free=100 * MiB, no_space=True), now=1.0)
    assert budget.measure(_stats(free=100 * MiB), now=2.0)
    # A refused write makes it full at once, until a measure finds room.
    budget.out_of_space(3.0)
    assert budget.is_full(3.0)
    assert budget.measure(_stats(free=100 * MiB), now=3.5)


def test_max_bytes_bounds_what_the_store_holds() -> None:
    budget, counts = _budget(limit_bytes=64 * MiB)
    budget.measure(_stats(free=1000 * MiB, data=60 * MiB), now=0.0)
    assert budget.room_bytes == 4 * MiB
    budget.note_accepted(4 * MiB)
    assert budget.is_full(0.1)
    error = budget.refusal()
    assert error.limit == "store.max_bytes"
    assert error.value == 64 * MiB
    assert str(error) == (
        "limit store.max_bytes=67108864 exceeded: the store is full: it holds 60.0 MiB"
    )
    assert counts["sends_refused_store_full"] == 1
    # Resuming needs a quarter of the limit or a file, whichever is less (here, the file).
    assert not budget.measure(_stats(free=1000 * MiB, data=62 * MiB), now=1.0)
    assert budget.measure(_stats(free=1000 * MiB, data=60 * MiB), now=2.0)


def test_a_store_without_a_disk_is_never_full() -> None:
    budget, _ = _budget(limit_bytes=1)
    budget.measure(StoreStats(), now=0.0)
    budget.note_accepted(10 * MiB)
    assert not budget.is_full(0.1)


class _DiskStore(MemoryStore):
    """A memory store that reports the disk a test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.free = 100 * MiB

    def stats(self) -> StoreStats:
        stats = dataclasses.replace(super().stats())
        stats.disk_free_bytes = self.free
        return stats


def test_the_broker_measures_again_before_it_calls_the_store_full() -> None:
    """Between two measures the broker estimates the room left from what it accepted. When the
    estimate runs out it measures again: space that came back since the last measure (a file
    deleted by someone else) is found, and no producer is held or refused for a full disk."""
    store = _DiskStore()
    h = Harness(message_store=store)
    broker = h.broker
    reserve = broker.store_disk.reserve_bytes
    store.free = reserve + MiB  # room: 1 MiB
    broker.disks.measure()
    assert not broker.disk_full(persistent=True)
    broker.store_disk.note_accepted(2 * MiB)  # more than the last measure's room
    store.free = reserve + 100 * MiB  # and the disk has room again, unmeasured yet
    assert not broker.disk_full(persistent=True)
    assert broker.store_disk.episodes == 0
    # A disk that really is full still starts an episode at once.
    store.free = reserve - MiB
    broker.store_disk.note_accepted(200 * MiB)
    assert broker.disk_full(persistent=True)
    assert broker.store_disk.episodes == 1
