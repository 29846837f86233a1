"""The API's connections, consumers and durable subscriptions: `/api/connections` (list, and
close one with DELETE `/api/connections/{id}`), `/api/consumers` (list), `/api/subscriptions`
(list, and delete one with DELETE `/api/subscriptions/{topic}/{client_id}/{name}`, each part
percent-encoded).

Connections concern the whole broker: listing them needs `read`, closing one `admin`, on every
destination. A consumer is its destination's, a durable subscription its topic's: listing needs
`read` on it, deleting a durable subscription `admin`.

A connection's credit is the sum of its consumers' (`ConnectionCredit`, from the same views
`/api/consumers` shows, so the two always agree): the messages and bytes it may still be given
before it acknowledges some, what it holds unacknowledged, and how many of its subscriptions
acknowledge automatically (no credit: bounded by the connection's write buffer alone).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sluice.auth.identity import Permission
from sluice.core.views import ConnectionView, ConsumerView, DurableView
from sluice.errors import DestinationInUseError, RequestError
from sluice.http.context import Serving
from sluice.http.errors import ApiError, ErrorCode
from sluice.http.gate import caller_of
from sluice.http.listing import page_of, query_int

__all__ = ["routes"]

log = logging.getLogger(__name__)

_CONNECTION_SORT: dict[str, Any] = {
    "id": lambda r: r.view.id,
    "user": lambda r: (r.view.user, r.view.id),
    "address": lambda r: (r.view.address, r.view.id),
    "bytes_in": lambda r: (r.view.bytes_in, r.view.id),
    "bytes_out": lambda r: (r.view.bytes_out, r.view.id),
    "connected_at_ms": lambda r: (r.view.connected_at_ms, r.view.id),
    "credit": lambda r: (r.credit.messages, r.view.id),
    "messages_in_flight": lambda r: (r.credit.messages_in_flight, r.view.id),
}
_CONSUMER_SORT: dict[str, Any] = {
    "destination": lambda v: (v.destination, v.connection_id, v.subscription_id),
    "connection_id": lambda v: (v.connection_id, v.subscription_id, v.destination),
    "messages_in_flight": lambda v: (v.messages_in_flight, v.destination, v.connection_id),
    # Automatic acknowledgement (no credit) sorts after every credit.
    "credit": lambda v: (v.credit is None, v.credit or 0, v.destination, v.connection_id),
}
_SUBSCRIPTION_SORT: dict[str, Any] = {
    "destination": lambda v: (v.destination, v.client_id, v.name),
    "lag": lambda v: (v.lag, v.destination, v.client_id, v.name),
    "client_id": lambda v: (v.client_id, v.name, v.destination),
}


@dataclass
class ConnectionCredit:
    """A connection's consumers, summed: `messages` and `bytes` of credit left (`bytes` None
    when none of them has a byte credit), what they hold unacknowledged, and how many
    acknowledge automatically."""

    messages: int = 0
    bytes: int | None = None
    messages_in_flight: int = 0
    bytes_in_flight: int = 0
    auto_ack_subscriptions: int = 0

    def add(self, consumer: ConsumerView) -> None:
        """Count one consumer of the connection."""
        self.messages_in_flight += consumer.messages_in_flight
        self.bytes_in_flight += consumer.bytes_in_flight
        if consumer.credit is None:
            self.auto_ack_subscriptions += 1
            return
        self.messages += consumer.credit
        if consumer.credit_bytes is not None:
            self.bytes = (self.bytes or 0) + consumer.credit_bytes


def credits_by_connection(consumers: Iterable[ConsumerView]) -> dict[int, ConnectionCredit]:
    """Each connection's credit, from every consumer of the broker."""
    credits: dict[int, ConnectionCredit] = {}
    for consumer in consumers:
        credits.setdefault(consumer.connection_id, ConnectionCredit()).add(consumer)
    return credits


@dataclass(frozen=True)
class _Row:
    view: ConnectionView
    credit: ConnectionCredit


def _connection(row: _Row) -> dict[str, Any]:
    view, credit = row.view, row.credit
    out = dataclasses.asdict(view)
    send_ms, receive_ms = view.heartbeat_ms
    out["heartbeat_ms"] = {"send": send_ms, "receive": receive_ms}
    out["protocol"] = view.protocol.value
    out["messages_in_flight"] = credit.messages_in_flight
    out["bytes_in_flight"] = credit.bytes_in_flight
    out["credit"] = {
        "messages": credit.messages,
        "bytes": credit.bytes,
        "auto_ack_subscriptions": credit.auto_ack_subscriptions,
    }
    return out


def _consumer(view: ConsumerView) -> dict[str, Any]:
    return dataclasses.asdict(view)


def _subscription(view: DurableView) -> dict[str, Any]:
    return dataclasses.asdict(view)


class ConnectionsApi:
    """The handlers of connections and durable subscriptions."""

    def __init__(self, server: Serving) -> None:
        self.managed = server.managed

    async def list_connections(self, request: web.Request) -> web.Response:
        """Logged-in connections, each with its protocol and its consumers' credit: `user`
        (exact), `sort`, `order`, `offset`, `limit`."""
        caller_of(request).require_broker(Permission.READ)
        user = request.query.get("user")
        credits = credits_by_connection(self.managed.broker.consumer_views())
        rows = [
            _Row(view, credits.get(view.id) or ConnectionCredit())
            for view in self.managed.connection_views()
            if user is None or view.user == user
        ]
        page = page_of(
            rows, request.query, sort_keys=_CONNECTION_SORT, default_sort="id", render=_connection
        )
        return web.json_response(page)

    async def close_connection(self, request: web.Request) -> web.Response:
        """Close a connection: its client gets an ERROR saying an operator closed it."""
        caller = caller_of(request)
        caller.require_broker(Permission.ADMIN)
        raw = request.match_info["id"]
        if not raw.isascii() or not raw.isdigit():
            raise ApiError(ErrorCode.BAD_REQUEST, f"a connection id is a number, not {raw!r}")
        connection_id = int(raw)
        reason = f"connection closed by an operator ({caller.user})"
        if not self.managed.close_connection(connection_id, reason):
            raise ApiError(ErrorCode.CONNECTION_NOT_FOUND, f"no connection {connection_id}")
        log.warning(
            "management API: user %s from %s closed connection %d",
            caller.user,
            caller.address,
            connection_id,
            extra=caller.log_extra,
        )
        return web.json_response({"closed": connection_id})

    async def list_consumers(self, request: web.Request) -> web.Response:
        """Consumers of destinations the caller may read: `destination` (exact), `connection`
        (an id), `sort`, `order`, `offset`, `limit`."""
        caller = caller_of(request)
        query = request.query
        destination = query.get("destination")
        connection = None
        if "connection" in query:
            connection = query_int(query, "connection", 0, 0, 1 << 62)
        views = [
            view
            for view in self.managed.broker.consumer_views()
            if (destination is None or view.destination == destination)
            and (connection is None or view.connection_id == connection)
            and caller.allows(view.destination, Permission.READ)
        ]
        page = page_of(
            views, query, sort_keys=_CONSUMER_SORT, default_sort="destination", render=_consumer
        )
        return web.json_response(page)

    async def list_subscriptions(self, request: web.Request) -> web.Response:
        """Durable subscriptions of topics the caller may read: `destination` (exact),
        `sort`, `order`, `offset`, `limit`."""
        caller = caller_of(request)
        topic = request.query.get("destination")
        views = [
            view
            for view in self.managed.broker.durable_views()
            if (topic is None or view.destination == topic)
            and caller.allows(view.destination, Permission.READ)
        ]
        page = page_of(
            views,
            request.query,
            sort_keys=_SUBSCRIPTION_SORT,
            default_sort="destination",
            render=_subscription,
        )
        return web.json_response(page)

    async def delete_subscription(self, request: web.Request) -> web.Response:
        """Delete a durable subscription nobody consumes (409 while a consumer is attached)."""
        caller = caller_of(request)
        info = request.match_info
        topic = "/topic/" + info["topic"]
        client_id, name = info["client_id"], info["name"]
        caller.require(topic, Permission.ADMIN)
        try:
            self.managed.broker.delete_durable(topic, client_id, name)
        except DestinationInUseError as exc:
            raise ApiError(ErrorCode.SUBSCRIPTION_IN_USE, str(exc)) from None
        except RequestError as exc:
            raise ApiError(ErrorCode.SUBSCRIPTION_NOT_FOUND, str(exc)) from None
        log.warning(
            "management API: user %s from %s deleted durable subscription %r of client %r on %s",
            caller.user,
            caller.address,
            name,
            client_id,
            topic,
            extra=caller.log_extra,
        )
        return web.json_response(
            {"deleted": {"destination": topic, "client_id": client_id, "name": name}}
        )


def routes(server: Serving) -> list[web.RouteDef]:
    """The routes of connections and durable subscriptions."""
    handlers = ConnectionsApi(server)
    return [
        web.get("/api/connections", handlers.list_connections, allow_head=False),
        web.delete("/api/connections/{id}", handlers.close_connection),
        web.get("/api/consumers", handlers.list_consumers, allow_head=False),
        web.get("/api/subscriptions", handlers.list_subscriptions, allow_head=False),
        web.delete("/api/subscriptions/{topic}/{client_id}/{name}", handlers.delete_subscription),
    ]
