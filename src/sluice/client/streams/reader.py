"""Reading streams: one file-like stream at a time, checked, acknowledged as it is consumed.

`StreamReader` subscribes with `ack:client-individual`, `x-max-open-groups:1` and a byte credit
(`x-prefetch-bytes`) of a few chunks, so the broker hands it one stream at a time and never more
than the credit ahead. It yields `InboundStream`s, read with `read`, `readinto` or `async for`.

Checks. The first chunk the reader sees of a stream is either chunk 0, or carries the resume mark
(an `x-stream-offset` with `x-stream-resume:true`, which the broker sets on the first chunk it
delivers of a stream another consumer left in the middle, or with `redelivered:true`: an earlier
consumer died and this one continues), or continues a stream this reader was told to expect at
exactly that offset (`expect`; the reader expects by itself every stream it saw aborted or lost
with its connection, at the offset it had reached). Each next
chunk must have the next `x-stream-seq` and, when given, the next `x-stream-offset`. The end
chunk's `x-stream-length` and
`x-stream-sha256` are checked before any of its bytes are handed out; the SHA-256 covers the
whole stream only if it started at 0, or if the application gave the hash of the bytes before
`resumed_at` (`InboundStream.seed_sha256`). A chunk that fails a check is never handed out: with
`on_gap="raise"` the reader raises `StreamOutOfOrder` / `StreamCorrupted` and stops (the chunk
stays unacknowledged and goes back to the broker when the reader closes); with `on_gap="skip"` it
logs, drops the chunk, fails the stream in progress (its reads raise), and goes on with the next
stream start. An abort marker makes the stream's reads raise `StreamAborted`.

Acknowledgements follow the application: a chunk is acknowledged when the application asks for
bytes past it, so what the application has not come back from is redelivered if it dies. The end
chunk is acknowledged by `InboundStream.finish()`, which the reader calls when the application
asks for the next stream or leaves the reader normally.

A connection lost mid-stream fails the stream with `ConnectionLost`: its unacknowledged chunks go
back to the broker and come again as a resumed stream (here, if the client reconnects, or to
another consumer).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import OrderedDict
from collections.abc import Mapping
from types import TracebackType

from sluice.client.errors import (
    ConnectionLost,
    StreamAborted,
    StreamCorrupted,
    StreamOutOfOrder,
)
from sluice.client.message import AckMode, Message
from sluice.client.streams.chunks import Chunk, parse_chunk
from sluice.client.streams.headers import STREAM_ID, STREAM_RESUME
from sluice.client.streams.inbound import InboundStream
from sluice.client.streams.transport import ReadTransport
from sluice.client.subscription import ClientSubscription
from sluice.config import MiB
from sluice.errors import ClientError

__all__ = [
    "DEFAULT_STREAM_PREFETCH_BYTES",
    "MAX_EXPECTED_STREAMS",
    "GapPolicy",
    "StreamReader",
]

logger = logging.getLogger(__name__)

# Byte credit of a stream subscription: a few chunks of the default size.
DEFAULT_STREAM_PREFETCH_BYTES = 4 * MiB
# Streams remembered for `expect` (aborted ones, and those the application names), oldest out.
MAX_EXPECTED_STREAMS = 1024
# While waiting for a chunk, look this often whether the connection was replaced.
EPOCH_POLL_S = 1.0


class GapPolicy(enum.StrEnum):
    """What a reader does with a chunk that fails a check."""

    # Raise and stop; the chunk stays unacknowledged.
    RAISE = "raise"
    # Log, drop the chunk (acknowledge it), fail the stream in progress, go on.
    SKIP = "skip"


class StreamReader:
    """Reads streams from one destination, one at a time. Made by `Client.stream_reader`.

    Use `async with client.stream_reader(dest) as reader: async for stream in reader: ...`, or
    `await reader.next_stream(timeout)`. See the module docstring for the checks and the
    acknowledgements. `skipped_chunks` counts the chunks dropped under `on_gap="skip"`, and
    `last_error` is the last check that failed, whichever the policy.
    """

    def __init__(
        self,
        transport: ReadTransport,
        destination: str,
        *,
        prefetch_bytes: int = DEFAULT_STREAM_PREFETCH_BYTES,
        on_gap: GapPolicy | str = GapPolicy.RAISE,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
    ) -> None:
        if prefetch_bytes < 1:
            raise ClientError(f"prefetch_bytes must be at least 1 (got {prefetch_bytes})")
        self.transport = transport
        self.destination = destination
        self.prefetch_bytes = prefetch_bytes
        try:
            self.on_gap = GapPolicy(on_gap)
        except ValueError:
            raise ClientError(f"on_gap must be 'raise' or 'skip' (got {on_gap!r})") from None
        self._headers = dict(headers) if headers else {}
        self._id = id
        self._subscription: ClientSubscription | None = None
        self._current: InboundStream | None = None
        # A message looked at and left for the next classification.
        self._held: Message | None = None
        self._failed: ClientError | None = None
        # stream id -> offset at which a continuation is accepted without the resume mark.
        self._expected: OrderedDict[str, int] = OrderedDict()
        # Messages of connections up to this one are stale: the broker redelivers them.
        self._dead_epoch = 0
        self.skipped_chunks = 0
        self.last_error: ClientError | None = None

    def __repr__(self) -> str:
        return f"<StreamReader {self.destination} current={self._current!r}>"

    @property
    def current(self) -> InboundStream | None:
        """The stream handed out last, until the next one."""
        return self._current

    @property
    def subscription(self) -> ClientSubscription | None:
        """The subscription underneath, once open."""
        return self._subscription

    # Opening and closing.

    async def open(self) -> StreamReader:
        """Subscribe (waiting for the broker's receipt); return self."""
        if self._subscription is None:
            headers = dict(self._headers)
            headers["x-max-open-groups"] = "1"
            self._subscription = await self.transport.subscribe(
                self.destination,
                ack=AckMode.CLIENT_INDIVIDUAL,
                headers=headers,
                prefetch_bytes=self.prefetch_bytes,
                id=self._id,
                # The broker's credit bounds what comes; this only guards against brokers
                # that ignore x-prefetch-bytes.
                max_queued_bytes=2 * self.prefetch_bytes + MiB,
            )
        return self

    async def close(self) -> None:
        """Unsubscribe: chunks not acknowledged go back to the broker (and come again, marked
        redelivered, to the next consumer). Safe to call twice."""
        subscription = self._subscription
        if subscription is None:
            return
        self._subscription = None
        try:
            await subscription.unsubscribe()
        except ClientError as exc:
            logger.debug("unsubscribe of stream reader on %s: %s", self.destination, exc)

    async def __aenter__(self) -> StreamReader:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            current = self._current
            if exc is None and current is not None and current.ended:
                await current.finish()
        finally:
            await self.close()

    def expect(self, stream_id: str, offset: int) -> None:
        """Accept a later chunk of `stream_id` at exactly `offset` as the continuation of a
        stream this application already holds up to there, though it lacks the resume mark (a
        new producer resumed the stream after an abort marker, or the broker restarted after
        the application had acknowledged every chunk it got). Streams this reader saw aborted
        or lost with its connection are expected by themselves. At most
        `MAX_EXPECTED_STREAMS` are remembered, oldest out."""
        expected = self._expected
        expected[stream_id] = offset
        expected.move_to_end(stream_id)
        if len(expected) > MAX_EXPECTED_STREAMS:
            forgotten, _ = expected.popitem(last=False)
            logger.info("no longer expecting a continuation of stream %s", forgotten)

    # Streams.

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> InboundStream:
        subscription = self._subscription
        try:
            stream = await self.next_stream()
        except ClientError:
            if (
                subscription is not None
                and subscription.closed
                and subscription.error is None
                and self._failed is None
            ):
                raise StopAsyncIteration from None
            raise
        assert stream is not None
        return stream

    async def next_stream(self, timeout: float | None = None) -> InboundStream | None:
        """The next stream, or None if none starts within `timeout` seconds.

        The stream handed out before must be finished (read to its end: it is finished here),
        have failed, or have been skipped. Raises the reader's failure under `on_gap="raise"`.
        """
        if self._failed is not None:
            raise self._failed
        current = self._current
        if current is not None:
            if current.ended:
                await current.finish()
            elif current.error is None:
                raise ClientError(
                    f"stream {current.id} is not read to its end: read it, or skip() it, first"
                )
            self._current = None
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            message = await self._receive(deadline, None)
            if message is None:
                return None
            stream = await self._start(message)
            if stream is not None:
                self._current = stream
                return stream

    async def _start(self, message: Message) -> InboundStream | None:
        """A stream if `message` may start one; else it is handled as out of place."""
        chunk, problem = parse_chunk(message)
        if chunk is None:
            assert problem is not None
            await self._out_of_place(message, None, problem, StreamCorrupted)
            return None
        if chunk.abort:
            # A stream this reader expects stays expected: another producer may continue it.
            await self._ack_quietly(message)
            logger.info(
                "%s: abort marker of stream %s, outside a stream being read (%s): acknowledged",
                self.destination,
                chunk.stream_id,
                chunk.abort_reason,
            )
            return None
        continued = False
        if chunk.seq == 0:
            if chunk.offset not in (None, 0):
                await self._out_of_place(
                    message, chunk, f"is chunk 0 at offset {chunk.offset}", StreamCorrupted
                )
                return None
        elif chunk.offset is not None and self._expected.get(chunk.stream_id) == chunk.offset:
            continued = True
        elif chunk.offset is None or not (
            message.redelivered or message.headers.get(STREAM_RESUME) == "true"
        ):
            await self._out_of_place(
                message,
                chunk,
                "is a mid-stream chunk without the resume mark "
                "(x-stream-resume or redelivered, with x-stream-offset)",
                StreamOutOfOrder,
            )
            return None
        self._expected.pop(chunk.stream_id, None)
        stream = InboundStream(self, message, chunk, continued=continued)
        if stream.resumed:
            logger.info(
                "%s: stream %s %s at chunk %d, offset %d",
                self.destination,
                stream.id,
                "continues where this reader left it" if continued else "resumed",
                chunk.seq,
                stream.resumed_at,
            )
        return stream

    # ChunkSource.

    async def next_chunk(self, stream: InboundStream) -> tuple[Message, Chunk]:
        """The next chunk of `stream`, checked; fails the stream and raises otherwise."""
        message = await self._receive(None, stream)
        if message is None or message.connection_epoch != stream.epoch:
            self._held = message
            raise self._lost(stream)
        chunk, problem = parse_chunk(message)
        if chunk is None:
            assert problem is not None
            raise self._reject(stream, message, None, problem, StreamCorrupted)
        if chunk.stream_id == stream.id:
            if chunk.abort:
                await self._ack_quietly(message)
                self.expect(stream.id, stream.next_offset)
                error = StreamAborted(
                    f"stream {stream.id} aborted by the broker at offset {stream.next_offset}: "
                    f"{chunk.abort_reason}",
                    stream.id,
                    chunk.abort_reason,
                    stream.next_offset,
                )
                logger.warning("%s: %s", self.destination, error)
                self.last_error = error
                stream.fail(error)
                raise error
            if chunk.seq == stream.next_seq and chunk.offset in (None, stream.next_offset):
                return message, chunk
            if chunk.seq != stream.next_seq:
                reason = f"came where chunk {stream.next_seq} was due"
            else:
                reason = f"is at offset {chunk.offset} where {stream.next_offset} was due"
        else:
            reason = f"of stream {chunk.stream_id} came in the middle of stream {stream.id}"
        raise self._reject(stream, message, chunk, reason, StreamOutOfOrder)

    async def ack_chunk(self, stream: InboundStream, message: Message, *, receipt: bool) -> None:
        """Acknowledge a chunk of `stream`; a lost connection fails the stream."""
        try:
            await self.transport.ack(message, receipt=receipt)
        except ConnectionLost:
            raise self._lost(stream) from None

    async def reject_end(self, stream: InboundStream, message: Message, reason: str) -> None:
        """The end chunk failed the length or SHA-256 check."""
        skip = self.on_gap is GapPolicy.SKIP
        error = StreamCorrupted(
            f"stream {stream.id} is corrupt: {reason}" + (" (skipped)" if skip else ""),
            stream.id,
            None,
            skipped=skip,
        )
        logger.warning("%s: %s", self.destination, error)
        self.last_error = error
        stream.fail(error)
        if skip:
            self.skipped_chunks += 1
            await self._ack_quietly(message)
        else:
            self._failed = error
        raise error

    # Helpers.

    def _lost(self, stream: InboundStream) -> ClientError:
        if stream.epoch > self._dead_epoch:
            self._dead_epoch = stream.epoch
        # Chunks it has not acknowledged come back with the resume mark. If it had acknowledged
        # every one and the broker restarted meanwhile, the broker does not know a reader left
        # the stream in the middle: the continuation comes unmarked, and this reader, which
        # held the stream up to here, takes it.
        self.expect(stream.id, stream.next_offset)
        error = ConnectionLost(
            f"stream {stream.id}: connection lost at offset {stream.position}; its "
            "unacknowledged chunks are redelivered and it comes again as a resumed stream"
        )
        logger.info("%s: %s", self.destination, error)
        stream.fail(error)
        return error

    async def _receive(
        self, deadline: float | None, stream: InboundStream | None
    ) -> Message | None:
        """The next message; None at `deadline`, or (reading `stream`) when the connection it
        came on was replaced."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._stale(held):
                return held
        subscription = self._subscription
        if subscription is None:
            raise ClientError("the stream reader is not open")
        loop = asyncio.get_running_loop()
        while True:
            wait: float | None = None
            if deadline is not None:
                wait = deadline - loop.time()
                if wait <= 0:
                    return None
            if stream is not None:
                wait = EPOCH_POLL_S if wait is None else min(wait, EPOCH_POLL_S)
            message = await subscription.get(wait)
            if message is not None:
                if self._stale(message):
                    continue
                return message
            if stream is not None and self.transport.epoch != stream.epoch:
                return None

    def _stale(self, message: Message) -> bool:
        """Was `message` delivered on a connection that is gone? The broker redelivers it, so
        it is dropped here (it could not be acknowledged anyway)."""
        epoch = message.connection_epoch
        stale = (
            epoch <= self._dead_epoch
            or epoch < self.transport.epoch
            or not self.transport.connected
        )
        if stale:
            logger.debug(
                "%s: dropped %s of a lost connection", self.destination, message.message_id
            )
        return stale

    def _error(
        self, message: Message, chunk: Chunk | None, reason: str, kind: type[StreamCorrupted]
    ) -> StreamCorrupted:
        """The error for a chunk that fails a check, logged and kept as `last_error`."""
        skip = self.on_gap is GapPolicy.SKIP
        stream_id = chunk.stream_id if chunk is not None else message.headers.get(STREAM_ID)
        what = f"chunk {chunk.seq} of stream {stream_id}" if chunk is not None else "message"
        action = "skipped" if skip else "not handed out"
        error = kind(
            f"{what} ({message.message_id}) {reason}: {action}",
            stream_id,
            chunk.seq if chunk is not None else None,
            skipped=skip,
        )
        logger.warning("%s: %s", self.destination, error)
        self.last_error = error
        return error

    def _reject(
        self,
        stream: InboundStream,
        message: Message,
        chunk: Chunk | None,
        reason: str,
        kind: type[StreamCorrupted],
    ) -> StreamCorrupted:
        """A chunk out of place while reading `stream`: the stream fails, and so does the
        reader under `raise` (the chunk stays unacknowledged); under `skip` the chunk is looked
        at again when the next stream is asked for, as it may start one. Returns the error."""
        error = self._error(message, chunk, reason, kind)
        stream.fail(error)
        if self.on_gap is GapPolicy.SKIP:
            self._held = message
        else:
            self._failed = error
        return error

    async def _out_of_place(
        self, message: Message, chunk: Chunk | None, reason: str, kind: type[StreamCorrupted]
    ) -> None:
        """A chunk that cannot start a stream: raise (and stop) under `raise`, drop it under
        `skip`."""
        error = self._error(message, chunk, reason, kind)
        if self.on_gap is not GapPolicy.SKIP:
            self._failed = error
            raise error
        self.skipped_chunks += 1
        await self._ack_quietly(message)

    async def _ack_quietly(self, message: Message) -> None:
        try:
            await self.transport.ack(message)
        except ConnectionLost as exc:
            logger.debug("%s: acknowledgement lost with the connection: %s", self.destination, exc)
