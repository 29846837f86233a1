"""The broker process's use of the cyclic garbage collector (`sluice.cli.collector`): survivors
of full collections are frozen, reference counting still frees them, and reference cycles frozen
before they became garbage are freed once the bound makes everything thawed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sluice.cli.collector import FreezeSurvivors


class _Node:
    """Something a weak reference can watch, that may refer to another."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def freezer() -> Iterator[FreezeSurvivors]:
    # Only the tests' own collections run, and a bound of 500 objects frozen after incomplete
    # ones (this process holds tens of thousands).
    installed = FreezeSurvivors()
    gc.disable()
    installed.install()
    installed.growth_factor = 500 / installed.complete_survivors
    try:
        yield installed
    finally:
        installed.uninstall()
        gc.enable()
    assert installed.on_collection not in gc.callbacks
    assert gc.get_freeze_count() == 0


def _tracked(obj: object) -> bool:
    """Is `obj` among the objects collections see (not frozen)?"""
    return any(seen is obj for seen in gc.get_objects())


def test_the_start_is_a_complete_collection_whose_survivors_are_frozen(
    freezer: FreezeSurvivors,
) -> None:
    assert freezer.complete_collections == 1
    assert freezer.complete_survivors > 1000
    assert gc.get_freeze_count() > 1000


def test_what_survives_a_full_collection_is_frozen(freezer: FreezeSurvivors) -> None:
    kept = _Node()
    assert _tracked(kept)
    gc.collect(1)  # a young collection freezes nothing
    assert _tracked(kept)
    gc.collect()
    assert not _tracked(kept)
    assert freezer.full_collections == 2


def test_reference_counting_frees_a_frozen_object(freezer: FreezeSurvivors) -> None:
    kept = _Node()
    gc.collect()
    assert not _tracked(kept)
    gone = weakref.ref(kept)
    del kept
    assert gone() is None  # at once, as an acknowledged message is


def test_a_frozen_cycle_is_freed_by_the_complete_collection_after_the_bound(
    freezer: FreezeSurvivors,
) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    gc.collect()
    del first, second
    gc.collect()  # frozen: this collection does not see the cycle
    assert gone() is not None
    assert freezer.thaws == 0
    alive = [_Node() for _ in range(1000)]
    gc.collect()  # 1,000 survivors frozen: past the bound, everything is thawed
    assert freezer.thaws == 1
    assert gone() is not None
    gc.collect()
    assert gone() is None
    assert freezer.complete_collections == 2
    assert freezer.frozen_since_complete == 0
    assert not _tracked(alive)


def test_anyones_thaw_makes_the_next_collection_complete(freezer: FreezeSurvivors) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    gc.collect()
    del first, second
    gc.unfreeze()  # as the broker does before it collects removed destinations
    gc.collect()
    assert gone() is None
    assert freezer.complete_collections == 2
    assert freezer.thaws == 0
    assert gc.get_freeze_count() > 0


def test_growth_factor_must_be_positive() -> None:
    with pytest.raises(ValueError, match="growth_factor"):
        FreezeSurvivors(growth_factor=0)
