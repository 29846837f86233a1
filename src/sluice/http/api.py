"""The API's overview and destinations: `/api/overview` (and `/api/overview/history`, its
recent samples for charts), `/api/destinations` (list, filter,
sort, paginate) and one destination (`/api/destinations/{queue|topic}/{name}`: show, create
with PUT, delete). Its messages are in `messages.py`.

A destination's short name goes in the path percent-encoded (`orders%2Feu` for `orders/eu`).
Every change is logged with the user who made it.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from pathlib import Path
from typing import Any

from aiohttp import web

from sluice import __version__
from sluice.auth.identity import Permission
from sluice.core.message import DestinationNameError
from sluice.core.views import DestinationView
from sluice.errors import DestinationInUseError, LimitExceeded
from sluice.http.context import Serving
from sluice.http.errors import ApiError, ErrorCode
from sluice.http.gate import Caller, caller_of
from sluice.http.listing import page_of

__all__ = ["routes"]

log = logging.getLogger(__name__)

_KINDS = ("queue", "topic")

_SORT_KEYS: dict[str, Any] = {
    name: operator.attrgetter(name)
    for name in (
        "name",
        "messages_ready",
        "messages_in_flight",
        "consumers",
        "producers",
        "memory_bytes",
        "messages_paged",
        "messages_in",
        "delivered",
        "acked",
    )
}

_BY_NAME: dict[str, Any] = {"name": lambda name: name}


def _rss_bytes() -> int | None:
    """The broker process's resident memory (Linux), None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    import resource  # noqa: PLC0415

    return pages * resource.getpagesize()


def destination_name(request: web.Request) -> str:
    """`/queue/NAME` or `/topic/NAME` from the path."""
    kind = request.match_info["kind"]
    if kind not in _KINDS:
        raise ApiError(
            ErrorCode.INVALID_DESTINATION, f"a destination is a queue or a topic, not {kind!r}"
        )
    return f"/{kind}/{request.match_info['name']}"


class DestinationsApi:
    """The handlers of the overview and the destinations."""

    def __init__(self, server: Serving) -> None:
        self.server = server
        self.broker = server.managed.broker

    def render(self, view: DestinationView) -> dict[str, Any]:
        """A destination as JSON, with its rates."""
        out = dataclasses.asdict(view)
        rates = self.server.rates.destination_rates(view.name)
        out["rates"] = {
            "messages_in": rates.messages_in,
            "delivered": rates.delivered,
            "acked": rates.acked,
        }
        return out

    def _view(self, name: str) -> DestinationView:
        destination = self.broker.find(name)
        if destination is None:
            raise ApiError(ErrorCode.DESTINATION_NOT_FOUND, f"no destination {name}")
        return destination.view()

    # -- the overview ---------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        """Version, uptime, totals and rates, memory, disk, flow control and alarms."""
        caller_of(request).require_broker(Permission.READ)
        broker = self.broker
        config = broker.config
        stats = broker.snapshot()
        store_stats = broker.store.stats()
        depth = broker.depth_totals()
        totals = dataclasses.asdict(broker.totals())
        store, temp = broker.store_disk, broker.temp_disk
        body = {
            "version": __version__,
            "broker_name": config.broker_name,
            "uptime_s": round(self.server.uptime_s(), 3),
            "started_at_ms": broker.started_ms,
            "totals": totals,
            "rates": dataclasses.asdict(self.server.rates.broker_rates),
            "destinations": dataclasses.asdict(depth),
            "connections": len(self.server.managed.connection_views()),
            "memory": {
                "used_bytes": broker.usage.used,
                "limit_bytes": broker.usage.limit_bytes,
                "process_rss_bytes": _rss_bytes(),
            },
            "store": {
                "kind": config.store.kind.value,
                "disk_bytes": stats["store_disk_bytes"],
                "data_bytes": store.held_bytes,
                "limit_bytes": store.limit_bytes,
                "room_bytes": store.room_bytes if store.active else None,
                "disk_free_bytes": store.free_bytes if store.active else None,
                "pending_writes": broker.pending_writes,
                "full": store.full,
                "failed": broker.store_failed,
                "unavailable": store_stats.unavailable,
                "reconnects": store_stats.reconnects,
            },
            "temp_store": {
                "disk_bytes": stats["temp_disk_bytes"],
                "data_bytes": temp.held_bytes,
                "limit_bytes": temp.limit_bytes,
                "full": temp.full,
            },
            "flow_control": {
                name: stats.get(counter, 0)
                for name, counter in (
                    ("memory_pauses", "flow_paused_memory"),
                    ("pending_write_pauses", "flow_paused_pending_writes"),
                    ("disk_pauses", "flow_paused_disk"),
                    ("receipt_pauses", "flow_paused_receipts"),
                    ("write_buffer_pauses", "write_paused"),
                    ("store_full_episodes", "store_full_episodes"),
                    ("temp_full_episodes", "temp_full_episodes"),
                )
            },
            "alarms": {
                "memory": broker.usage.full,
                "pending_writes": broker.writes_backed_up(),
                "store_full": store.full,
                "temp_full": temp.full,
                "store_failed": broker.store_failed,
                "store_unavailable": store_stats.unavailable,
            },
        }
        return web.json_response(body)

    async def history(self, request: web.Request) -> web.Response:
        """The broker's recent samples (rates, depth, memory, store), oldest first."""
        caller_of(request).require_broker(Permission.READ)
        sampler = self.server.rates
        return web.json_response(
            {
                "interval_s": sampler.interval_s,
                "samples": [dataclasses.asdict(sample) for sample in sampler.history],
            }
        )

    # -- destinations ---------------------------------------------------------------------------

    async def list(self, request: web.Request) -> web.Response:
        """The destinations the caller may read: `kind`, `name` (a part of the name), `sort`,
        `order`, `offset`, `limit`."""
        caller = caller_of(request)
        query = request.query
        kind = query.get("kind")
        if kind is not None and kind not in _KINDS:
            raise ApiError(ErrorCode.BAD_REQUEST, "kind must be queue or topic")
        part = query.get("name", "")
        if query.get("sort", "name") == "name":
            # By name (the default): only the page's destinations are looked at, so that a
            # broker of ten thousand answers as fast as a small one.
            prefix = "/" if kind is None else f"/{kind}/"
            names = [
                name
                for name in self.broker.destination_names()
                if name.startswith(prefix) and part in name and caller.allows(name, Permission.READ)
            ]
            page = page_of(
                names, query, sort_keys=_BY_NAME, default_sort="name", render=self._render_name
            )
            return web.json_response(page)
        views = [
            view
            for view in self.broker.destination_views()
            if (kind is None or view.kind == kind)
            and part in view.name
            and caller.allows(view.name, Permission.READ)
        ]
        page = page_of(views, query, sort_keys=_SORT_KEYS, default_sort="name", render=self.render)
        return web.json_response(page)

    def _render_name(self, name: str) -> dict[str, Any]:
        return self.render(self._view(name))

    async def show(self, request: web.Request) -> web.Response:
        """One destination."""
        name = destination_name(request)
        caller_of(request).require(name, Permission.READ)
        return web.json_response(self.render(self._view(name)))

    async def create(self, request: web.Request) -> web.Response:
        """Create a destination (201), or answer the one there is (200)."""
        name = destination_name(request)
        caller = caller_of(request)
        caller.require(name, Permission.ADMIN)
        try:
            created = self.broker.create_destination(name)
        except DestinationNameError as exc:
            raise ApiError(ErrorCode.INVALID_DESTINATION, str(exc)) from None
        except LimitExceeded as exc:
            raise ApiError(ErrorCode.LIMIT_EXCEEDED, str(exc)) from None
        if created:
            _log_change(caller, f"created {name}")
        return web.json_response(self.render(self._view(name)), status=201 if created else 200)

    async def delete(self, request: web.Request) -> web.Response:
        """Delete a destination and its messages; refused while it is in use (409)."""
        name = destination_name(request)
        caller = caller_of(request)
        caller.require(name, Permission.ADMIN)
        view = self._view(name)
        try:
            self.broker.delete_destination(name)
        except DestinationInUseError as exc:
            raise ApiError(ErrorCode.DESTINATION_IN_USE, str(exc)) from None
        _log_change(caller, f"deleted {name} ({view.messages_ready} messages)")
        return web.json_response({"deleted": name, "messages": view.messages_ready})


def _log_change(caller: Caller, what: str) -> None:
    log.warning(
        "management API: user %s from %s %s",
        caller.user,
        caller.address,
        what,
        extra=caller.log_extra,
    )


def routes(server: Serving) -> list[web.RouteDef]:
    """The overview's and the destinations' routes."""
    handlers = DestinationsApi(server)
    one = "/api/destinations/{kind}/{name}"
    return [
        web.get("/api/overview", handlers.overview, allow_head=False),
        web.get("/api/overview/history", handlers.history, allow_head=False),
        web.get("/api/destinations", handlers.list, allow_head=False),
        web.get(one, handlers.show, allow_head=False),
        web.put(one, handlers.create),
        web.delete(one, handlers.delete),
    ]
