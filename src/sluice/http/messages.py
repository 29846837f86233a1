"""The API's messages of a destination, under `/api/destinations/{queue|topic}/{name}/messages`:

- `GET` browses a queue without consuming it, or searches it: `id=`, `header=NAME:VALUE`
  (both repeatable) and `selector=` keep the messages that pass every test;
  `GET .../messages/count` counts them over the whole queue (a dry run of what an operation
  would concern);
- `POST .../messages/delete|move|copy|retry` acts on the messages a JSON body selects (`ids`,
  `headers`, `selector`, or `"all": true`; `dry_run` counts without acting), through the core's
  operations (`sluice.core.operations`: a step of at most a thousand messages in one store
  transaction, the loop let run between steps); `retry` sends each dead letter back to the
  destination its `x-original-destination` names;
- `POST .../messages` sends one message; `DELETE .../messages` purges a queue.

Permissions are those of STOMP: reading (and a search, a count) needs `read` on the queue;
taking messages out of it, as a consumer does, `read` too; sending, to a target or with
`POST`, `write` on the target, and `admin` when the send creates it. A purge needs `admin`.
Every change is logged with the user who made it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from sluice.auth.identity import Permission
from sluice.core.broker import Broker
from sluice.core.destination import Destination
from sluice.core.message import DestinationNameError, Message, parse_destination
from sluice.core.operations import (
    Action,
    MessageFilter,
    MessageOperation,
    Skip,
    StepResult,
    retry_target,
    send_message,
)
from sluice.core.picking import QueuePicking
from sluice.core.selector import SelectorError, compile_selector
from sluice.errors import LimitExceeded, RequestError, StoreFullError, StoreUnavailableError
from sluice.http.api import destination_name
from sluice.http.context import Serving
from sluice.http.errors import ApiError, ErrorCode
from sluice.http.gate import Caller, caller_of
from sluice.http.listing import query_int
from sluice.store.api import WriteHandle

__all__ = ["routes"]

log = logging.getLogger(__name__)

# A browse shows at most this many messages, and this many bytes of each body; a search looks
# at no more than this many messages per request (the next request goes on from `next_after`).
MAX_BROWSE = 100
MAX_PREVIEW_BYTES = 4096
SEARCH_SCAN_LIMIT = 10_000
# A purge removes this many messages, then lets the loop run, until it is done.
PURGE_STEP = 1000
# Ids one request may name.
MAX_IDS = 1000
# Headers the broker sets or reads itself: never taken from a message an operator sends.
RESERVED_HEADERS = frozenset(
    {
        "destination",
        "content-length",
        "content-type",
        "receipt",
        "transaction",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
        "x-delivery-count",
        "x-offset",
        "x-stream-resume",
        "persistent",
        "priority",
        "expires",
        "timestamp",
    }
)
_STREAM_HEADER = "x-stream-"
_DONE = {
    Action.DELETE: "deleted",
    Action.MOVE: "moved",
    Action.COPY: "copied",
    Action.RETRY: "retried",
}


def _log_change(caller: Caller, what: str) -> None:
    log.warning(
        "management API: user %s from %s %s",
        caller.user,
        caller.address,
        what,
        extra=caller.log_extra,
    )


def _bad(message: str) -> ApiError:
    return ApiError(ErrorCode.BAD_REQUEST, message)


def _filter(ids: list[str], headers: list[tuple[str, str]], selector: str | None) -> MessageFilter:
    if len(ids) > MAX_IDS:
        raise _bad(f"at most {MAX_IDS} ids at a time")
    compiled = None
    if selector is not None:
        try:
            compiled = compile_selector(selector)
        except SelectorError as exc:
            raise ApiError(ErrorCode.INVALID_SELECTOR, f"bad selector: {exc}") from None
    return MessageFilter(frozenset(ids), tuple(headers), compiled)


def query_filter(query: MultiMapping[str]) -> MessageFilter | None:
    """The filter of a search's query string (None: none asked for)."""
    ids = query.getall("id", [])
    headers = []
    for raw in query.getall("header", []):
        name, sep, value = raw.partition(":")
        if not sep or not name:
            raise _bad(f"header= is NAME:VALUE, got {raw[:100]!r}")
        headers.append((name, value))
    selector = query.get("selector")
    if not ids and not headers and selector is None:
        return None
    return _filter(ids, headers, selector)


def _body_filter(body: Mapping[str, Any]) -> MessageFilter:
    """The messages a request body selects: `ids`, `headers`, `selector`, or `all`."""
    ids = body.get("ids", [])
    headers = body.get("headers", {})
    selector = body.get("selector")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _bad("ids must be a list of message ids")
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise _bad("headers must be an object of header names and string values")
    if selector is not None and not isinstance(selector, str):
        raise _bad("selector must be a string")
    every = body.get("all", False)
    if not isinstance(every, bool):
        raise _bad("all must be true or false")
    chosen = bool(ids or headers or selector is not None)
    if every == chosen:
        # Acting on every message is never a default: it must be asked for, alone.
        raise _bad('select messages with ids, headers or selector, or with "all": true (alone)')
    return _filter(ids, sorted(headers.items()), selector)


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise _bad("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false")
    return value


def _int(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{name} must be an integer from {low} to {high}")
    return value


def _render(result: StepResult, action: Action, dry_run: bool) -> dict[str, Any]:
    return {
        "action": action.value,
        "dry_run": dry_run,
        "matched": result.matched,
        _DONE[action]: result.acted,
        "skipped": dict(result.skipped),
        "targets": dict(result.targets),
    }


class MessagesApi:
    """The handlers of a destination's messages."""

    def __init__(self, server: Serving) -> None:
        self.broker: Broker = server.managed.broker

    def _destination(self, name: str) -> Destination:
        destination = self.broker.find(name)
        if destination is None:
            raise ApiError(ErrorCode.DESTINATION_NOT_FOUND, f"no destination {name}")
        return destination

    def _queue(self, name: str) -> QueuePicking:
        destination = self._destination(name)
        if not isinstance(destination, QueuePicking):
            raise ApiError(
                ErrorCode.NOT_A_QUEUE, f"{name} is not a queue: only a queue's messages are kept"
            )
        return destination

    # -- reading --------------------------------------------------------------------------------

    async def browse(self, request: web.Request) -> web.Response:
        """A queue's messages without consuming them, in sequence order: `after` (a sequence),
        `limit` (at most 100), `preview` (bytes of each body shown, at most 4096); a search
        with `id`, `header`, `selector` (at most 10,000 messages looked at per request)."""
        name = destination_name(request)
        caller_of(request).require(name, Permission.READ)
        destination = self._destination(name)
        query = request.query
        after = query_int(query, "after", 0, 0, 1 << 62)
        limit = query_int(query, "limit", 20, 1, MAX_BROWSE)
        preview = query_int(query, "preview", 256, 0, MAX_PREVIEW_BYTES)
        found = query_filter(query)
        try:
            if found is None:
                views, next_after = destination.browse(after, limit, preview)
            else:
                views, next_after = destination.browse(
                    after, limit, preview, found.matches, SEARCH_SCAN_LIMIT
                )
        except RequestError as exc:
            raise ApiError(ErrorCode.NOT_A_QUEUE, str(exc)) from None
        items = []
        for view in views:
            item = dataclasses.asdict(view)
            item["body_preview"] = view.body_preview.decode("utf-8", "replace")
            items.append(item)
        return web.json_response({"items": items, "next_after": next_after})

    async def count(self, request: web.Request) -> web.Response:
        """How many messages of a queue a filter matches (every message without one): waiting
        for a consumer, and in flight."""
        name = destination_name(request)
        caller_of(request).require(name, Permission.READ)
        queue = self._queue(name)
        found = query_filter(request.query) or MessageFilter()
        counts: collections.Counter[str] = collections.Counter()
        after: int | None = 0
        upto_seq = queue.last_seq
        while after is not None and self.broker.find(name) is queue:
            window = queue.window(after, PURGE_STEP)
            after = window.next_after
            for item in window.found:
                if item.message.seq > upto_seq:
                    after = None
                    break
                if found.matches(item.message):
                    counts["waiting" if item.waiting else item.place.value] += 1
            await asyncio.sleep(0)  # a large queue: let the loop run between windows
        return web.json_response(
            {
                "count": sum(counts.values()),
                "waiting": counts["waiting"],
                "in_flight": counts["in_flight"],
                "busy": counts["busy"],
            }
        )

    # -- operations -----------------------------------------------------------------------------

    async def delete(self, request: web.Request) -> web.Response:
        """Delete the selected messages waiting in a queue."""
        return await self._operate(request, Action.DELETE)

    async def move(self, request: web.Request) -> web.Response:
        """Move the selected messages waiting in a queue to the destination `to`."""
        return await self._operate(request, Action.MOVE)

    async def copy(self, request: web.Request) -> web.Response:
        """Copy the selected messages of a queue to the destination `to`."""
        return await self._operate(request, Action.COPY)

    async def retry(self, request: web.Request) -> web.Response:
        """Send the selected dead letters back to the destination each came from."""
        return await self._operate(request, Action.RETRY)

    async def _operate(self, request: web.Request, action: Action) -> web.Response:
        name = destination_name(request)
        caller = caller_of(request)
        caller.require(name, Permission.READ)
        body = await _json_body(request)
        message_filter = _body_filter(body)
        dry_run = _bool(body, "dry_run")
        queue = self._queue(name)
        target_of = None
        to = body.get("to")
        if action in (Action.MOVE, Action.COPY):
            if not isinstance(to, str):
                raise _bad(f'a {action.value} needs "to": the target destination')
            self._check_target(caller, to)
            target_of = _fixed(to)
        elif to is not None:
            raise _bad(f'a {action.value} takes no "to"')
        elif action is Action.RETRY:
            target_of = _RetryTargets(caller, self.broker).target
        if not dry_run and self.broker.store_failed:
            raise ApiError(
                ErrorCode.UNAVAILABLE, "the message store failed: messages cannot be changed"
            )
        if not dry_run and action.sends and self.broker.disk_full(persistent=True):
            raise ApiError(ErrorCode.UNAVAILABLE, "the message store is full")
        operation = MessageOperation(self.broker, queue, action, message_filter, target_of)
        total = await self._run(operation, name, dry_run)
        answer = _render(total, action, dry_run)
        if not dry_run and total.acted:
            self.broker.count(f"operator_messages_{_DONE[action]}", total.acted)
            where = f" to {to}" if to is not None else ""
            _log_change(caller, f"{_DONE[action]} {total.acted} messages of {name}{where}")
        return web.json_response(answer)

    def _check_target(self, caller: Caller, target: str) -> None:
        try:
            parse_destination(target)
        except DestinationNameError as exc:
            raise ApiError(ErrorCode.INVALID_DESTINATION, str(exc)) from None
        caller.require(target, Permission.WRITE)
        if self.broker.find(target) is None:
            caller.require(target, Permission.ADMIN)  # the send creates it, as over STOMP

    async def _run(self, operation: MessageOperation, name: str, dry_run: bool) -> StepResult:
        """Step an operation to its end, letting the loop run between steps."""
        loop = asyncio.get_running_loop()
        total = StepResult(None)
        after: int | None = 0
        queue = operation.queue
        while after is not None and self.broker.find(name) is queue:
            written: asyncio.Future[bool] = loop.create_future()

            def on_written(ok: bool, written: asyncio.Future[bool] = written) -> None:
                if not written.done():
                    written.set_result(ok)

            try:
                result = operation.step(after, on_written, dry_run=dry_run)
            except LimitExceeded as exc:
                raise ApiError(ErrorCode.LIMIT_EXCEEDED, str(exc)) from None
            if not await written:
                verb = _DONE[operation.action]
                raise ApiError(
                    ErrorCode.UNAVAILABLE,
                    f"the message store failed: {total.acted} messages were {verb} before; "
                    f"the {result.acted} of the failed step stay in {name}",
                )
            total.matched += result.matched
            total.acted += result.acted
            total.skipped.update(result.skipped)
            total.targets.update(result.targets)
            after = result.next_after
            await asyncio.sleep(0)
        return total

    # -- sending and purging --------------------------------------------------------------------

    async def send(self, request: web.Request) -> web.Response:
        """Send one message: `body` (text) or `body_base64`, `headers`, `persistent`,
        `priority`, `expires_ms`. Answered once it is safe (written, when persistent)."""
        name = destination_name(request)
        caller = caller_of(request)
        self._check_target(caller, name)
        message = _message(await _json_body(request), name, self.broker)
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[WriteHandle | None] = loop.create_future()

        def on_stored(handle: WriteHandle | None) -> None:
            if not stored.done():
                stored.set_result(handle)

        try:
            sent = send_message(self.broker, message, on_stored)
        except StoreFullError as exc:
            raise ApiError(ErrorCode.UNAVAILABLE, str(exc)) from None
        except StoreUnavailableError as exc:
            raise ApiError(ErrorCode.UNAVAILABLE, str(exc)) from None
        except DestinationNameError as exc:
            raise ApiError(ErrorCode.INVALID_DESTINATION, str(exc)) from None
        except LimitExceeded as exc:
            raise ApiError(ErrorCode.LIMIT_EXCEEDED, str(exc)) from None
        answer = {
            "destination": name,
            "message_id": message.message_id,
            "persistent": message.persistent,
            "duplicate": not sent,
        }
        if not sent:
            return web.json_response(answer)
        handle = await stored
        if handle is not None and handle.error is not None:
            raise ApiError(ErrorCode.UNAVAILABLE, "the message store failed to write it")
        _log_change(caller, f"sent message {message.message_id} to {name}")
        return web.json_response(answer, status=201)

    async def purge(self, request: web.Request) -> web.Response:
        """Remove the messages of a queue that wait for a consumer (those in flight stay)."""
        name = destination_name(request)
        caller = caller_of(request)
        caller.require(name, Permission.ADMIN)
        destination = self._destination(name)
        upto_seq = destination.last_seq
        purged = 0
        try:
            while self.broker.find(name) is destination:
                removed = destination.purge(upto_seq, PURGE_STEP)
                if not removed:
                    break
                purged += removed
                await asyncio.sleep(0)  # a large queue: let the loop run between steps
        except RequestError as exc:
            raise ApiError(ErrorCode.NOT_A_QUEUE, str(exc)) from None
        _log_change(caller, f"purged {name} ({purged} messages)")
        return web.json_response({"purged": purged})


def _fixed(target: str) -> Callable[[Message], str | Skip]:
    def target_of(message: Message) -> str | Skip:
        return target

    return target_of


class _RetryTargets:
    """Where each dead letter goes back to, if the caller may send there: a target it may not
    write to (or create) is skipped, and the refusal counted once per target."""

    def __init__(self, caller: Caller, broker: Broker) -> None:
        self.caller = caller
        self.broker = broker
        self.refused: dict[str, str | None] = {}

    def target(self, message: Message) -> str | Skip:
        target = retry_target(message)
        if isinstance(target, Skip):
            return target
        if target not in self.refused:
            self.refused[target] = self._refusal(target)
        reason = self.refused[target]
        return target if reason is None else Skip(reason)

    def _refusal(self, target: str) -> str | None:
        caller = self.caller
        permissions = [Permission.WRITE]
        if self.broker.find(target) is None:
            permissions.append(Permission.ADMIN)
        for permission in permissions:
            if not caller.allows(target, permission):
                self.broker.count("access_denied_" + permission.value)
                log.warning(
                    "access denied over HTTP: user %s from %s has no %s permission on %s",
                    caller.user,
                    caller.address,
                    permission.value,
                    target,
                    extra=caller.log_extra,
                )
                return f"access denied: {permission.value} permission on {target}"
        return None


def _message(body: Mapping[str, Any], name: str, broker: Broker) -> Message:
    """The message a send's body describes."""
    text, encoded = body.get("body"), body.get("body_base64")
    if text is not None and encoded is not None:
        raise _bad("give body or body_base64, not both")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise _bad("body_base64 must be a string")
        try:
            payload = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _bad("body_base64 is not base64") from None
    elif text is None:
        payload = b""
    elif isinstance(text, str):
        payload = text.encode("utf-8")
    else:
        raise _bad("body must be a string")
    headers = body.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in headers.items()
    ):
        raise _bad("headers must be an object of header names and string values")
    for key in headers:
        if key in RESERVED_HEADERS or key.startswith(_STREAM_HEADER):
            raise _bad(f"header {key!r} is set by the broker, not by a sender")
    return Message(
        name,
        0,
        broker.new_message_id(),
        broker.now_ms(),
        dict(headers),
        payload,
        expires_ms=_int(body, "expires_ms", 0, 0, 1 << 62),
        priority=_int(body, "priority", 4, 0, 9),
        persistent=_bool(body, "persistent"),
    )


def routes(server: Serving) -> list[web.RouteDef]:
    """The routes of a destination's messages."""
    handlers = MessagesApi(server)
    messages = "/api/destinations/{kind}/{name}/messages"
    return [
        web.get(messages, handlers.browse, allow_head=False),
        web.post(messages, handlers.send),
        web.delete(messages, handlers.purge),
        web.get(messages + "/count", handlers.count, allow_head=False),
        web.post(messages + "/delete", handlers.delete),
        web.post(messages + "/move", handlers.move),
        web.post(messages + "/copy", handlers.copy),
        web.post(messages + "/retry", handlers.retry),
    ]
