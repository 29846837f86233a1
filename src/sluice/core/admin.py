"""What operators see of the broker and do to it (the management API's part of `Broker`):
totals that never go down, views of destinations, consumers, durable subscriptions and
streams, and the destinations and durable subscriptions an operator creates or deletes."""

from __future__ import annotations

from sluice.config import Limits
from sluice.core.destination import Destination
from sluice.core.message import DestinationKind, DestinationNameError, parse_destination
from sluice.core.topic import Topic
from sluice.core.views import (
    ConsumerView,
    DepthTotals,
    DestinationView,
    DurableView,
    StreamView,
    Totals,
)
from sluice.core.wildcard import is_wildcard
from sluice.errors import DestinationInUseError, LimitExceeded, RequestError


class BrokerAdmin:
    """The operator's part of `broker.Broker`, which sets the attributes below and provides
    `count`, `destination` and `_remove_destination`."""

    # Set by `Broker.__init__`.
    destinations: dict[str, Destination]
    limits: Limits
    _removed_totals: Totals

    def count(self, metric: str, n: int = 1) -> None:
        """Add to a broker counter (the broker's)."""
        raise NotImplementedError

    def destination(self, name: str, creator_id: int = 0) -> Destination:
        """The destination of this name, created if needed (the broker's)."""
        raise NotImplementedError

    def _remove_destination(self, destination: Destination) -> None:
        """Forget a destination and what it holds, in the stores too (the broker's)."""
        raise NotImplementedError

    def totals(self) -> Totals:
        """Message counts of the whole broker since it started, destinations removed since
        included: they never go down."""
        totals = self._removed_totals
        for destination in self.destinations.values():
            traffic = destination.traffic
            totals += Totals(
                destination.messages_in,
                traffic.delivered,
                traffic.acked,
                traffic.redelivered,
                traffic.dead_lettered,
                traffic.expired,
            )
        return totals

    def depth_totals(self) -> DepthTotals:
        """Destinations by kind, and the messages ready and in flight in all of them, without
        building each one's view (the overview of a broker of ten thousand)."""
        totals = DepthTotals()
        for destination in self.destinations.values():
            if destination.kind is DestinationKind.QUEUE:
                totals.queues += 1
            else:
                totals.topics += 1
            totals.messages_ready += destination.messages_ready
            totals.messages_in_flight += destination.messages_in_flight
        return totals

    def destination_names(self) -> list[str]:
        """The name of every destination (cheaper than their views, for a list cut into
        pages by name)."""
        return list(self.destinations)

    def destination_views(self) -> list[DestinationView]:
        """Every destination, as an operator sees it now."""
        return [destination.view() for destination in self.destinations.values()]

    def durable_views(self) -> list[DurableView]:
        """Every durable subscription, with its cursor and lag."""
        return [
            view
            for destination in self.destinations.values()
            for view in destination.durable_views()
        ]

    def consumer_views(self) -> list[ConsumerView]:
        """Every consumer: each subscription of each destination."""
        return [
            sub.view()
            for destination in self.destinations.values()
            for sub in destination.subscriptions
        ]

    def stream_views(self) -> list[StreamView]:
        """Every stream in progress: being sent, or being read."""
        return [
            view
            for destination in self.destinations.values()
            for view in destination.stream_views()
        ]

    def find(self, name: str) -> Destination | None:
        """The destination of this name, if the broker has it (never creates one)."""
        return self.destinations.get(name)

    def create_destination(self, name: str) -> bool:
        """Create a destination an operator names, checked as a client's name is (prefix,
        length, no wildcard) and against the table's room. Returns False if it existed.
        Raises `DestinationNameError` or `LimitExceeded` (counted)."""
        if name in self.destinations:
            return False
        _kind, short = parse_destination(name)
        limit = self.limits.max_destination_name_bytes
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > limit:
            self.count("limit_max_destination_name_bytes")
            raise LimitExceeded(
                "max_destination_name_bytes", limit, f"a destination name of {size} bytes"
            )
        if is_wildcard(short):
            raise DestinationNameError(f"destination {name!r} is a wildcard pattern, not a name")
        self.destination(name)
        return True

    def delete_destination(self, name: str) -> None:
        """Remove a destination an operator names, with every message it holds, from the
        stores too. Raises `RequestError` if there is none, `DestinationInUseError` while it is
        in use (`Destination.in_use`)."""
        destination = self.destinations.get(name)
        if destination is None:
            raise RequestError(f"no destination {name}")
        reason = destination.in_use()
        if reason is not None:
            raise DestinationInUseError(f"{name} is in use: {reason}")
        self._remove_destination(destination)
        self.count("destinations_deleted")

    def delete_durable(self, topic_name: str, client_id: str, name: str) -> None:
        """Remove a durable subscription an operator names, and release what it held. Raises
        `RequestError` if there is none, `DestinationInUseError` while a consumer is attached."""
        topic = self.destinations.get(topic_name)
        durable = topic.durables.get((client_id, name)) if isinstance(topic, Topic) else None
        if topic is None or durable is None:
            raise RequestError(
                f"no durable subscription {name!r} of client {client_id!r} on {topic_name}"
            )
        if durable.active is not None:
            raise DestinationInUseError(
                f"durable subscription {name!r} of client {client_id!r} has a consumer attached"
            )
        assert isinstance(topic, Topic)
        topic.delete_durable(client_id, name)
        self.count("durable_subscriptions_deleted")
