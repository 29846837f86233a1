"""The broker's definitions: its destinations and durable subscriptions, as values an operator
exports from one broker and imports into another, to rebuild it by script (RabbitMQ's
definitions idea).

An import is all or nothing. `plan_import` checks everything first, without changing anything:
every name (prefix, length, no wildcard), every selector, that durable subscriptions are on
topics, that no durable subscription of the same client id and name exists with another topic
or selector (which could only be replaced by deleting it), and that the table has room for
every new destination. Any problem refuses the whole import, each problem named. Only then
`apply_import` creates what is missing (what exists as defined is left as it is); should
anything still fail half way (the table filled meanwhile), what it created is removed again.
A durable subscription created this way has no consumer: it keeps what is published from then
on, as one a consumer created and left does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.core.broker import Broker
from sluice.core.message import DestinationKind, DestinationNameError, parse_destination
from sluice.core.selector import SelectorError, compile_selector
from sluice.core.topic import Topic
from sluice.core.wildcard import is_wildcard
from sluice.errors import LimitExceeded, SluiceError

__all__ = [
    "Definitions",
    "DefinitionsError",
    "DurableDefinition",
    "ImportPlan",
    "apply_import",
    "export_definitions",
    "plan_import",
]


class DefinitionsError(SluiceError):
    """Definitions that cannot be imported; `problems` names each one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{len(problems)} problems: " + "; ".join(problems[:5]))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class DurableDefinition:
    """A durable topic subscription: its topic, the client id and name it is known by, and its
    selector."""

    destination: str
    client_id: str
    name: str
    selector: str | None = None


@dataclass(frozen=True)
class Definitions:
    """Destinations (full names) and durable subscriptions."""

    destinations: tuple[str, ...] = ()
    durables: tuple[DurableDefinition, ...] = ()


@dataclass
class ImportPlan:
    """What an import creates, and what it finds already there as defined."""

    new_destinations: list[str] = field(default_factory=list)
    new_durables: list[DurableDefinition] = field(default_factory=list)
    existing_destinations: int = 0
    existing_durables: int = 0


def export_definitions(broker: Broker) -> Definitions:
    """What the broker has now, in name order."""
    durables = [
        DurableDefinition(view.destination, view.client_id, view.name, view.selector)
        for view in broker.durable_views()
    ]
    durables.sort(key=lambda d: (d.destination, d.client_id, d.name))
    return Definitions(tuple(sorted(broker.destinations)), tuple(durables))


def _check_name(broker: Broker, name: str, problems: list[str]) -> DestinationKind | None:
    try:
        kind, short = parse_destination(name)
    except DestinationNameError as exc:
        problems.append(str(exc))
        return None
    limit = broker.limits.max_destination_name_bytes
    if len(name.encode("utf-8", "surrogatepass")) > limit:
        problems.append(f"{name[:100]}: longer than max_destination_name_bytes={limit}")
        return None
    if is_wildcard(short):
        problems.append(f"{name}: a wildcard pattern, not a destination name")
        return None
    return kind


def _existing_durables(broker: Broker) -> dict[tuple[str, str], DurableDefinition]:
    return {
        (view.client_id, view.name): DurableDefinition(
            view.destination, view.client_id, view.name, view.selector
        )
        for view in broker.durable_views()
    }


def plan_import(broker: Broker, definitions: Definitions) -> ImportPlan:
    """Check every definition against the broker as it is; raise `DefinitionsError` naming
    every problem, or return what an import would create. Changes nothing."""
    problems: list[str] = []
    plan = ImportPlan()
    planned: set[str] = set()
    for name in definitions.destinations:
        if _check_name(broker, name, problems) is None or name in planned:
            continue
        planned.add(name)
        if name in broker.destinations:
            plan.existing_destinations += 1
        else:
            plan.new_destinations.append(name)
    existing = _existing_durables(broker)
    seen: dict[tuple[str, str], DurableDefinition] = {}
    for durable in definitions.durables:
        key = (durable.client_id, durable.name)
        what = f"durable subscription {durable.name!r} of client {durable.client_id!r}"
        if not durable.client_id or not durable.name:
            problems.append(f"{what}: a client id and a name are needed")
            continue
        kind = _check_name(broker, durable.destination, problems)
        if kind is None:
            continue
        if kind is not DestinationKind.TOPIC:
            problems.append(f"{what}: {durable.destination} is not a topic")
            continue
        if durable.selector is not None:
            try:
                compile_selector(durable.selector)
            except SelectorError as exc:
                problems.append(f"{what}: bad selector: {exc}")
                continue
        other = seen.get(key) or existing.get(key)
        if other is not None and other != durable:
            problems.append(
                f"{what}: defined as on {other.destination} with selector {other.selector!r} "
                f"(delete it first to change it)"
            )
            continue
        if key in seen:
            continue
        seen[key] = durable
        if key in existing:
            plan.existing_durables += 1
            continue
        plan.new_durables.append(durable)
        if durable.destination not in broker.destinations and durable.destination not in planned:
            planned.add(durable.destination)
            plan.new_destinations.append(durable.destination)
    room = broker.limits.max_destinations - len(broker.destinations)
    if len(plan.new_destinations) > room:
        problems.append(
            f"{len(plan.new_destinations)} new destinations, room for {max(room, 0)} "
            f"(max_destinations={broker.limits.max_destinations})"
        )
    if problems:
        raise DefinitionsError(problems)
    return plan


def apply_import(broker: Broker, plan: ImportPlan) -> None:
    """Create what `plan_import` planned, in the same turn of the loop; if anything fails, what
    was created is removed again and the failure raised (`DefinitionsError`)."""
    created: list[str] = []
    durables: list[tuple[Topic, DurableDefinition]] = []
    try:
        for name in plan.new_destinations:
            if broker.create_destination(name):
                created.append(name)
        for durable in plan.new_durables:
            topic = broker.destinations[durable.destination]
            assert isinstance(topic, Topic)
            if topic.create_durable(durable.client_id, durable.name, durable.selector):
                durables.append((topic, durable))
    except (LimitExceeded, DestinationNameError) as exc:
        for topic, durable in reversed(durables):
            topic.delete_durable(durable.client_id, durable.name)
        for name in reversed(created):
            broker.delete_destination(name)
        raise DefinitionsError([f"nothing imported: {exc}"]) from None
