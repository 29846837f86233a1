"""Downloads of a queue's messages without consuming them: one message's whole body,
`GET /api/destinations/queue/{name}/messages/{id}/body`, and a whole stream,
`GET /api/destinations/queue/{name}/streams/{stream_id}/body` (its chunks, the messages of one
`x-stream-id`, in `x-stream-seq` order; docs/streams.md).

Both need `read` on the queue, as a browse does, and take nothing out of it: the messages stay
where they are (waiting, or with the consumer that holds them).

Memory is bounded whatever the queue or the stream holds: the queue is read a window at a time
(at most `WINDOW_MESSAGES` messages and about `WINDOW_BYTES` from the store, plus a chunk larger
than that alone), and a stream goes out chunk by chunk, each written to the response before the
next window is read (the response's writes wait while the client is slower than the store). A
stream is read twice: a first pass checks that the queue holds every chunk from the first to
the end (answering `409` with what is missing otherwise, before any byte is sent), the second
sends them. What changes in between (a consumer acknowledges a chunk meanwhile) cuts the
response short of its `Content-Length`, so a client never takes a truncated stream for a whole
one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from sluice.auth.identity import Permission
from sluice.core.broker import Broker
from sluice.core.message import (
    STREAM_ABORT,
    STREAM_ABORT_REASON,
    STREAM_END,
    STREAM_ID,
    STREAM_OFFSET,
    STREAM_SEQ,
    Message,
)
from sluice.core.picking import QueuePicking
from sluice.http.api import destination_name
from sluice.http.context import Serving
from sluice.http.errors import ApiError, ErrorCode
from sluice.http.gate import caller_of

__all__ = ["routes"]

log = logging.getLogger(__name__)

# A queue is read this many messages, and about this many bytes from the store, at a time.
WINDOW_MESSAGES = 256
WINDOW_BYTES = 4 << 20
_LENGTH = "x-stream-length"
_SHA256 = "x-stream-sha256"


class _Incomplete(Exception):
    """The queue does not hold the stream whole; the message says what is wrong."""


def _header_int(message: Message, name: str) -> int | None:
    raw = message.headers.get(name)
    if raw is None or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


class _Chunks:
    """The chunks of one stream met in queue order: which is the next, and when it ends. The
    same rules decide both passes, so the second sends exactly what the first checked."""

    def __init__(self, queue: str, stream_id: str) -> None:
        self.queue = queue
        self.stream_id = stream_id
        self.next_chunk = 0
        self.length = 0
        self.first_seq: int | None = None  # the queue sequence of chunk 0
        self.ended = False
        self.aborted: str | None = None
        self.sha256: str | None = None

    def take(self, message: Message) -> bool:
        """Is this message the stream's next chunk (to send)? False for other messages and for
        the broker's abort markers; `_Incomplete` when a chunk is missing or out of place."""
        if self.ended or message.headers.get(STREAM_ID) != self.stream_id:
            return False
        if message.headers.get(STREAM_ABORT) == "true":
            # A new producer may continue after it: only the end says the stream is whole.
            self.aborted = message.headers.get(STREAM_ABORT_REASON, "aborted")
            return False
        number = _header_int(message, STREAM_SEQ)
        if number is None:
            raise _Incomplete(f"message {message.message_id} of the stream has no {STREAM_SEQ}")
        if number < self.next_chunk:
            return False  # sent twice (a producer's retry): the first one counts
        if number > self.next_chunk:
            if self.next_chunk == 0:
                raise _Incomplete(
                    f"chunks 0 to {number - 1} are not in {self.queue} (consumed, or moved)"
                )
            raise _Incomplete(f"chunk {self.next_chunk} is missing (the next here is {number})")
        offset = _header_int(message, STREAM_OFFSET)
        if offset is not None and offset != self.length:
            raise _Incomplete(f"chunk {number} is at offset {offset}, not {self.length}")
        if number == 0:
            self.first_seq = message.seq
        self.next_chunk += 1
        self.length += len(message.body)
        self.aborted = None
        if message.headers.get(STREAM_END) == "true":
            self.ended = True
            self.sha256 = message.headers.get(_SHA256)
            declared = _header_int(message, _LENGTH)
            if declared is not None and declared != self.length:
                raise _Incomplete(f"its chunks hold {self.length} bytes, its end says {declared}")
        return True

    def unfinished(self, sending: bool) -> str:
        """Why the stream is not whole after the whole queue was read."""
        if self.next_chunk == 0:
            return "no chunk 0"
        if self.aborted is not None:
            return f"no end: it was aborted after chunk {self.next_chunk - 1} ({self.aborted})"
        if sending:
            return f"no end yet: chunks 0 to {self.next_chunk - 1} are here, it is still sent"
        return f"no end: chunks 0 to {self.next_chunk - 1} are here"


class DownloadsApi:
    """The handlers of downloads."""

    def __init__(self, server: Serving) -> None:
        self.broker: Broker = server.managed.broker

    def _queue(self, request: web.Request) -> tuple[str, QueuePicking]:
        name = destination_name(request)
        caller_of(request).require(name, Permission.READ)
        destination = self.broker.find(name)
        if destination is None:
            raise ApiError(ErrorCode.DESTINATION_NOT_FOUND, f"no destination {name}")
        if not isinstance(destination, QueuePicking):
            raise ApiError(
                ErrorCode.NOT_A_QUEUE, f"{name} is not a queue: only a queue's messages are kept"
            )
        return name, destination

    async def _messages(self, name: str, queue: QueuePicking, after: int) -> AsyncIterator[Message]:
        """The queue's messages after a sequence, a window at a time, while it exists; the
        loop runs between windows."""
        upto_seq = queue.last_seq  # those that come in meanwhile are not looked at
        next_after: int | None = after
        while next_after is not None and self.broker.find(name) is queue:
            window = queue.window(next_after, WINDOW_MESSAGES, WINDOW_BYTES)
            next_after = window.next_after
            for found in window.found:
                if found.message.seq > upto_seq:
                    return
                yield found.message
            await asyncio.sleep(0)

    async def message_body(self, request: web.Request) -> web.Response:
        """One message's whole body, found by its id wherever it is in the queue."""
        name, queue = self._queue(request)
        message_id = request.match_info["id"]
        async for message in self._messages(name, queue, 0):
            if message.message_id == message_id:
                return web.Response(
                    body=message.body,
                    content_type="application/octet-stream",
                    headers={"X-Message-Id": message_id},
                )
        raise ApiError(ErrorCode.MESSAGE_NOT_FOUND, f"no message {message_id} in {name}")

    async def stream_body(self, request: web.Request) -> web.StreamResponse:
        """A whole stream, its chunks in order, streamed; `409` unless the queue holds every
        chunk from chunk 0 to the end."""
        name, queue = self._queue(request)
        stream_id = request.match_info["stream_id"]
        checked = _Chunks(name, stream_id)
        seen = False
        try:
            async for message in self._messages(name, queue, 0):
                seen = seen or message.headers.get(STREAM_ID) == stream_id
                checked.take(message)
                if checked.ended:
                    break
        except _Incomplete as exc:
            raise _incomplete(stream_id, name, str(exc)) from None
        if not seen:
            raise ApiError(ErrorCode.STREAM_NOT_FOUND, f"no chunk of stream {stream_id} in {name}")
        if not checked.ended:
            sending = stream_id in queue.open_streams
            raise _incomplete(stream_id, name, checked.unfinished(sending))
        assert checked.first_seq is not None
        headers = {"X-Stream-Id": stream_id, "X-Stream-Chunks": str(checked.next_chunk)}
        if checked.sha256 is not None and checked.sha256.isascii() and checked.sha256.isalnum():
            headers["X-Stream-Sha256"] = checked.sha256
        response = web.StreamResponse(headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = checked.length
        await response.prepare(request)
        sent = _Chunks(name, stream_id)
        try:
            async for message in self._messages(name, queue, checked.first_seq - 1):
                if sent.take(message):
                    await response.write(message.body)
                if sent.ended:
                    break
        except _Incomplete as exc:
            return _cut_short(request, response, f"stream {stream_id} of {name}: {exc}")
        except ConnectionError:
            log.info("download of stream %s of %s: the client went away", stream_id, name)
            return response
        if not sent.ended or sent.length != checked.length:
            why = "the queue changed while it was sent"
            return _cut_short(request, response, f"stream {stream_id} of {name}: {why}")
        await response.write_eof()
        return response


def _incomplete(stream_id: str, name: str, why: str) -> ApiError:
    return ApiError(
        ErrorCode.STREAM_INCOMPLETE, f"stream {stream_id} of {name} is not whole: {why}"
    )


def _cut_short(request: web.Request, response: web.StreamResponse, why: str) -> web.StreamResponse:
    """The body cannot be finished: close the connection short of its `Content-Length`."""
    log.warning("download cut short: %s", why)
    if request.transport is not None:
        request.transport.close()
    return response


def routes(server: Serving) -> list[web.RouteDef]:
    """The routes of downloads."""
    handlers = DownloadsApi(server)
    one = "/api/destinations/{kind}/{name}"
    return [
        web.get(one + "/messages/{id}/body", handlers.message_body, allow_head=False),
        web.get(one + "/streams/{stream_id}/body", handlers.stream_body, allow_head=False),
    ]
