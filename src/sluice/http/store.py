"""The API's view of the message store and of the streams in progress: `/api/store` (where the
journal stands: checkpoint, head, last collection and compaction, archive), `/api/store/files`
(its data files with their size, live messages, and what pins each: destinations' live messages
with the oldest sequence of each, state records, open transactions, files that must go first;
`history`: the collections and compactions seen lately, `rates.StoreEvent`)
and `/api/streams` (streams being sent or read: who reads each, how far, where the next reader
would resume).

The store is asked through its one read method, `MessageStore.inspect`, on a worker thread: it
reads the index's last checkpoint and the directory, never the writer's own state. What the
store says concerns every destination: it needs `read` on `/queue/>` and `/topic/>`; streams
are listed for the destinations the caller may read.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from aiohttp import web

from sluice.auth.identity import Permission
from sluice.core.views import StreamView
from sluice.http.context import Serving
from sluice.http.gate import caller_of
from sluice.http.listing import page_of
from sluice.store.api import DataFileView, StoreView

__all__ = ["routes"]

# Live messages the store attributes to destinations per request; beyond, `complete` is false.
INSPECT_MAX_MESSAGES = 1_000_000

_FILE_SORT: dict[str, Any] = {
    "number": lambda f: f.number,
    "live_messages": lambda f: (f.live_messages, f.number),
    "live_bytes": lambda f: (f.live_bytes, f.number),
    "size_bytes": lambda f: (f.size_bytes, f.number),
}
_STREAM_SORT: dict[str, Any] = {
    "destination": lambda s: (s.destination, s.stream_id),
    "stream_id": lambda s: (s.stream_id, s.destination),
    "last_chunk_ms": lambda s: (s.last_chunk_ms or 0, s.destination, s.stream_id),
}


def _ms(value: int) -> int | None:
    return value or None


def _position(position: tuple[int, int] | None) -> dict[str, int] | None:
    return None if position is None else {"file": position[0], "offset": position[1]}


def _file(view: DataFileView) -> dict[str, Any]:
    return dataclasses.asdict(view)


def _stream(view: StreamView) -> dict[str, Any]:
    out = dataclasses.asdict(view)
    out["reading"] = view.reading.value
    return out


class StoreApi:
    """The handlers of the store's view and the streams."""

    def __init__(self, server: Serving) -> None:
        self.server = server
        self.broker = server.managed.broker

    async def _inspect(self) -> StoreView:
        store = self.broker.store
        return await asyncio.get_running_loop().run_in_executor(
            None, store.inspect, INSPECT_MAX_MESSAGES
        )

    async def show(self, request: web.Request) -> web.Response:
        """Where the store stands, its files in sum, and its archive."""
        caller_of(request).require_broker(Permission.READ)
        view = await self._inspect()
        stats = self.broker.store.stats()
        archive = view.archive
        body = {
            "kind": view.kind,
            "directory": view.directory,
            "checkpoint": _position(view.checkpoint),
            "head": _position(view.head),
            "files": len(view.files),
            "files_bytes": sum(f.size_bytes for f in view.files),
            "live_messages": sum(f.live_messages for f in view.files),
            "live_bytes": sum(f.live_bytes for f in view.files),
            "last_checkpoint_ms": _ms(stats.last_checkpoint_ms),
            "last_gc_ms": _ms(stats.last_gc_ms),
            "last_compaction_ms": _ms(stats.last_compaction_ms),
            "checkpoints": stats.checkpoints,
            "gc_deleted_files": stats.gc_deleted_files,
            "gc_archived_files": stats.gc_archived_files,
            "compacted_files": stats.compacted_files,
            "archive": dataclasses.asdict(archive) if archive is not None else None,
            "messages_scanned": view.messages_scanned,
            "complete": view.complete,
            "history": [dataclasses.asdict(event) for event in self.server.rates.store_events],
        }
        return web.json_response(body)

    async def files(self, request: web.Request) -> web.Response:
        """The data files: `sort` (number, live_messages, live_bytes, size_bytes), `order`,
        `offset`, `limit`."""
        caller_of(request).require_broker(Permission.READ)
        view = await self._inspect()
        page = page_of(
            view.files, request.query, sort_keys=_FILE_SORT, default_sort="number", render=_file
        )
        page["checkpoint"] = _position(view.checkpoint)
        page["complete"] = view.complete
        return web.json_response(page)

    async def streams(self, request: web.Request) -> web.Response:
        """Streams in progress on destinations the caller may read: `destination` (exact),
        `sort`, `order`, `offset`, `limit`."""
        caller = caller_of(request)
        destination = request.query.get("destination")
        views = [
            view
            for view in self.broker.stream_views()
            if (destination is None or view.destination == destination)
            and caller.allows(view.destination, Permission.READ)
        ]
        page = page_of(
            views,
            request.query,
            sort_keys=_STREAM_SORT,
            default_sort="destination",
            render=_stream,
        )
        return web.json_response(page)


def routes(server: Serving) -> list[web.RouteDef]:
    """The routes of the store's view and the streams."""
    handlers = StoreApi(server)
    return [
        web.get("/api/store", handlers.show, allow_head=False),
        web.get("/api/store/files", handlers.files, allow_head=False),
        web.get("/api/streams", handlers.streams, allow_head=False),
    ]
