"""`InboundStream`: one stream handed out by a `StreamReader`, read like a file.

It holds one chunk at a time: the one whose bytes it is handing out. When the application asks
for bytes past it, that chunk is acknowledged and the next one fetched from the reader, which
checks its place in the stream. The first chunk and the end chunk are checked as they are opened,
before any of their bytes are handed out (see `sluice.client.streams.reader`).
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from sluice.client.message import Message
from sluice.client.streams.chunks import Chunk
from sluice.client.streams.headers import STREAM_NAME, STREAM_SIZE
from sluice.errors import ClientError

__all__ = ["ChunkSource", "InboundStream", "StreamState"]

logger = logging.getLogger(__name__)


class StreamState(enum.Enum):
    """Where an `InboundStream` stands."""

    # Bytes may still come.
    OPEN = "open"
    # Every byte handed out and checked; the end chunk is not acknowledged yet.
    AT_END = "at_end"
    # The end chunk is acknowledged: the broker is done with the stream.
    FINISHED = "finished"
    # Aborted, corrupt, out of order or cut by a lost connection: reads raise `error`.
    FAILED = "failed"


class ChunkSource(Protocol):
    """The reader side of a stream."""

    async def next_chunk(self, stream: InboundStream) -> tuple[Message, Chunk]:
        """The stream's next chunk, checked; raises (and fails the stream) otherwise."""
        ...

    async def ack_chunk(self, stream: InboundStream, message: Message, *, receipt: bool) -> None:
        """Acknowledge a chunk the application is done with; raises (and fails the stream)."""
        ...

    async def reject_end(self, stream: InboundStream, message: Message, reason: str) -> None:
        """The end chunk failed a whole-stream check: fail the stream and raise."""
        ...


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name, "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() else None


class InboundStream:
    """A stream being read. Made by `StreamReader`; read it with `read`, `readinto` or
    `async for chunk in stream`.

    `id` is its `x-stream-id`; `name` its `x-stream-name` as sent (unsanitized: never use it as a
    path as it is); `headers` the first chunk's headers. `resumed_at` is the byte offset of the
    first byte handed out: 0 for a stream read from its start, more when this reader continues a
    stream another consumer (or an earlier connection) began; write from there. `position` is
    the offset of the next byte. Once the end is reached, `length` and `sha256` are the stream's,
    and `verified` says whether the SHA-256 was checked over the whole stream (it is when
    `resumed_at` is 0 or `seed_sha256` was called); a stream whose check failed raises instead.
    """

    def __init__(
        self, source: ChunkSource, first: Message, chunk: Chunk, *, continued: bool = False
    ) -> None:
        self._source = source
        self.id = chunk.stream_id
        self.headers: Mapping[str, str] = MappingProxyType(dict(first.headers))
        self.name: str | None = first.headers.get(STREAM_NAME)
        self.size_hint: int | None = _int_header(first.headers, STREAM_SIZE)
        offset = chunk.offset if chunk.offset is not None else 0
        self.resumed_at = offset
        # True when the stream continues without the resume mark where this reader (or the
        # application, through `StreamReader.expect`) left it: after an abort marker, or after
        # the broker restarted.
        self.continued = continued
        self.first_seq = chunk.seq
        self.epoch = first.connection_epoch
        self.position = offset
        self.length: int | None = None
        self.sha256: str | None = None
        self.verified: bool | None = None
        self._state = StreamState.OPEN
        self._error: ClientError | None = None
        self._ready: tuple[Message, Chunk] | None = (first, chunk)
        self._current: Message | None = None
        self._current_end = False
        self._view = memoryview(b"")
        self._pos = 0
        self.next_seq = chunk.seq
        self.next_offset = offset
        self._hasher: Any = hashlib.sha256()
        self._hash_whole = offset == 0
        self._opened = False

    def __repr__(self) -> str:
        return f"<InboundStream {self.id} at {self.position} {self._state.value}>"

    @property
    def state(self) -> StreamState:
        """Where the stream stands."""
        return self._state

    @property
    def resumed(self) -> bool:
        """Whether the stream was picked up after its start (`resumed_at` > 0)."""
        return self.resumed_at > 0

    @property
    def error(self) -> ClientError | None:
        """Why the stream failed, if it did."""
        return self._error

    @property
    def ended(self) -> bool:
        """Whether every byte has been handed out and checked."""
        return self._state in (StreamState.AT_END, StreamState.FINISHED) or (
            self._current_end and self._pos >= len(self._view) and self._error is None
        )

    def seed_sha256(self, hasher: Any) -> None:
        """Give the SHA-256 of the `resumed_at` bytes before this reader's first byte (a hashlib
        object, e.g. from `sluice.client.streams.hash_prefix`), so the end check covers the whole
        stream. Call it before the first read."""
        if self._opened:
            raise ClientError("seed_sha256 must be called before the first read")
        self._hasher = hasher
        self._hash_whole = True

    # Reading.

    async def _fill(self) -> bool:
        """Make bytes available; False at the end of the stream."""
        while True:
            if self._error is not None:
                raise self._error
            if self._pos < len(self._view):
                return True
            if self._state is not StreamState.OPEN:
                return False
            if self._current_end:
                self._state = StreamState.AT_END
                return False
            consumed = self._current
            if consumed is not None:
                self._current = None
                await self._source.ack_chunk(self, consumed, receipt=False)
            if self._ready is not None:
                message, chunk = self._ready
                self._ready = None
            else:
                message, chunk = await self._source.next_chunk(self)
            await self._open(message, chunk)

    async def _open(self, message: Message, chunk: Chunk) -> None:
        body = message.body
        self._opened = True
        self._hasher.update(body)
        offset_end = self.next_offset + len(body)
        if chunk.end:
            problems = []
            if chunk.length is not None and chunk.length != offset_end:
                problems.append(f"x-stream-length is {chunk.length} but {offset_end} bytes came")
            digest = self._hasher.hexdigest()
            if self._hash_whole and chunk.sha256 is not None and digest != chunk.sha256:
                problems.append(f"SHA-256 is {digest}, the producer sent {chunk.sha256}")
            if problems:
                await self._source.reject_end(self, message, "; ".join(problems))
            self.length = offset_end
            self.sha256 = chunk.sha256
            self.verified = self._hash_whole and chunk.sha256 is not None
            if not self.verified:
                why = (
                    f"resumed at offset {self.resumed_at} without the hash of the bytes before"
                    if not self._hash_whole
                    else "the producer sent none"
                )
                logger.info("stream %s: SHA-256 not checked (%s)", self.id, why)
        self._current = message
        self._current_end = chunk.end
        self._view = memoryview(body)
        self._pos = 0
        self.next_seq = chunk.seq + 1
        self.next_offset = offset_end

    async def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (with `size` < 0, the rest of the current chunk); b"" at the end.

        Reads are short at chunk boundaries, as for a socket. Raises `StreamAborted`,
        `StreamCorrupted` / `StreamOutOfOrder` or `ConnectionLost` if the stream fails.
        """
        if size == 0 or not await self._fill():
            return b""
        view, pos = self._view, self._pos
        take = len(view) - pos if size < 0 else min(size, len(view) - pos)
        self._pos = pos + take
        self.position += take
        if pos == 0 and take == len(view):
            return view.obj if isinstance(view.obj, bytes) else bytes(view)
        return bytes(view[pos : pos + take])

    async def readinto(self, buffer: bytearray | memoryview) -> int:
        """Copy up to `len(buffer)` bytes into `buffer`; 0 at the end of the stream."""
        target = memoryview(buffer).cast("B")
        if not len(target) or not await self._fill():
            return 0
        view, pos = self._view, self._pos
        take = min(len(target), len(view) - pos)
        target[:take] = view[pos : pos + take]
        self._pos = pos + take
        self.position += take
        return take

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            data = await self.read()
            if not data:
                return
            yield data

    async def skip(self) -> None:
        """Consume the rest of the stream without handing it out (acknowledging it), then
        `finish`. For a stream the application does not want."""
        while await self._fill():
            self.position += len(self._view) - self._pos
            self._pos = len(self._view)
        await self.finish()

    async def finish(self) -> None:
        """Acknowledge the end chunk, once every byte has been read: the broker is then done with
        the stream. Called by the reader when the application asks for the next stream or leaves
        the reader normally; call it yourself to decide when (after renaming a file, say)."""
        if self._state is StreamState.FINISHED:
            return
        if self._error is not None:
            raise self._error
        if self._state is StreamState.OPEN:
            if not self.ended:
                raise ClientError(f"stream {self.id} is not read to its end")
            self._state = StreamState.AT_END
        end = self._current
        assert end is not None
        await self._source.ack_chunk(self, end, receipt=True)
        self._current = None
        self._state = StreamState.FINISHED

    # Called by the reader.

    def fail(self, error: ClientError) -> None:
        """The stream cannot go on: every read raises `error` from now on."""
        if self._error is None:
            self._error = error
        self._state = StreamState.FAILED
        self._ready = None
        self._current = None
        self._view = memoryview(b"")
        self._pos = 0
