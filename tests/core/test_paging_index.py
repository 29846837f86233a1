"""The index of evicted messages against a plain model: per group in sequence order, the lowest
of each group and of all, groups in the order of their first message."""

from __future__ import annotations

import random

import pytest

from sluice.core.paging import Evicted

GROUPS = [None, "a", "b", "c"]


@pytest.mark.parametrize("seed", range(20))
def test_evicted_index_matches_a_model(seed: int) -> None:
    rnd = random.Random(seed)
    index = Evicted(1000)
    model: dict[str | None, set[int]] = {}
    owner: dict[int, str | None] = {}  # a sequence belongs to one group
    for _ in range(300):
        if rnd.random() < 0.6:
            seq = rnd.randrange(1, 200)
            group = owner.setdefault(seq, rnd.choice(GROUPS))
            assert index.add(seq, group, 1, seq)
            model.setdefault(group, set()).add(seq)
        elif model:
            group = rnd.choice(list(model))
            first = index.first(group)
            assert first is not None
            assert first == (min(model[group]), 1, min(model[group]))
            index.pop_first(group)
            model[group].discard(first[0])
            if not model[group]:
                del model[group]
        assert len(index) == sum(len(seqs) for seqs in model.values())
        for group in GROUPS:
            assert index.has(group) == (group in model)
            if group is not None and group in model:
                low = min(model[group])
                assert not index.blocks(group, low)
                assert index.blocks(group, low + 1)
        named = sorted((min(seqs), g) for g, seqs in model.items() if g is not None)
        assert list(index.groups_in_order()) == [g for _, g in named]
        lowest = index.lowest()
        if model:
            assert lowest is not None
            assert lowest[0] == min(min(seqs) for seqs in model.values())
        else:
            assert lowest is None


def test_evicted_index_is_bounded() -> None:
    index = Evicted(2)
    assert index.add(1, "a", 1, 10)
    assert index.add(2, None, 1, 10)
    assert not index.add(3, "a", 1, 10)
    assert len(index) == 2
