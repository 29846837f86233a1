"""Importing definitions in the core: planned without a change, applied all or nothing (what
an apply created is removed again when it cannot finish), and exported back as they were."""

from __future__ import annotations

import pytest

from sluice.core.definitions import (
    Definitions,
    DefinitionsError,
    DurableDefinition,
    apply_import,
    export_definitions,
    plan_import,
)

from .fakes import Harness


def test_plan_changes_nothing_and_apply_exports_back() -> None:
    h = Harness()
    definitions = Definitions(
        ("/queue/a", "/topic/t"),
        (DurableDefinition("/topic/t", "c", "s", "x = 1"), DurableDefinition("/topic/u", "c", "v")),
    )
    plan = plan_import(h.broker, definitions)
    assert plan.new_destinations == ["/queue/a", "/topic/t", "/topic/u"]
    assert h.broker.destinations == {}
    apply_import(h.broker, plan)
    assert export_definitions(h.broker) == Definitions(
        ("/queue/a", "/topic/t", "/topic/u"),
        (DurableDefinition("/topic/t", "c", "s", "x = 1"), DurableDefinition("/topic/u", "c", "v")),
    )
    again = plan_import(h.broker, definitions)
    assert (again.new_destinations, again.new_durables) == ([], [])
    assert (again.existing_destinations, again.existing_durables) == (2, 2)


def test_an_apply_that_cannot_finish_leaves_nothing() -> None:
    h = Harness(limits={"max_destinations": 3})
    definitions = Definitions(("/queue/a", "/queue/b"), (DurableDefinition("/topic/t", "c", "s"),))
    plan = plan_import(h.broker, definitions)
    # The table fills between the check and the apply.
    h.broker.create_destination("/queue/other")
    with pytest.raises(DefinitionsError, match="nothing imported"):
        apply_import(h.broker, plan)
    assert sorted(h.broker.destinations) == ["/queue/other"]
    assert h.broker.durable_views() == []


def test_duplicates_in_a_document_are_one() -> None:
    h = Harness()
    durable = DurableDefinition("/topic/t", "c", "s")
    plan = plan_import(h.broker, Definitions(("/queue/a", "/queue/a"), (durable, durable)))
    assert plan.new_destinations == ["/queue/a", "/topic/t"]
    assert plan.new_durables == [durable]
    conflicting = Definitions((), (durable, DurableDefinition("/topic/t", "c", "s", "y = 2")))
    with pytest.raises(DefinitionsError) as raised:
        plan_import(h.broker, conflicting)
    assert len(raised.value.problems) == 1
