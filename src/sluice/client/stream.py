"""Sending streams: a file or an iterable of bytes cut into chunks (DESIGN.md section 7).

A stream is a message group whose messages are chunks. Every chunk carries `x-stream-id` (also
its `JMSXGroupID`), `x-stream-seq` (from 0), `x-stream-offset` (bytes before it) and
`x-dedup-id` (`<stream id>:<seq>`, so that sending a chunk again is harmless); the last one also
`x-stream-end:true`, `x-stream-length` and `x-stream-sha256` (hex, of the whole stream). Chunks
are persistent.

`send_stream` keeps at most `window` chunks written but not yet receipted: fast, since the
journal syncs many of them at once, and bounded: it holds two chunks (the one being sent and the
next, read ahead to know which is the last) besides the connection's bounded write buffer. With
`transactional=True` every chunk goes in one transaction, so the stream appears whole at COMMIT
or not at all. A live stream whose producer dies is ended by the broker with an abort marker;
`resume` lets a new producer continue it from the last receipted chunk (see docs/streams.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sluice.client.pipeline import PendingReceipt
from sluice.config import MiB
from sluice.errors import ClientError

if TYPE_CHECKING:
    from sluice.client.aio import Client

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_STREAM_WINDOW",
    "MAX_CHUNK_BYTES",
    "RESERVED_HEADERS",
    "STREAM_ABORT",
    "STREAM_ABORT_REASON",
    "STREAM_END",
    "STREAM_ID",
    "STREAM_LENGTH",
    "STREAM_NAME",
    "STREAM_OFFSET",
    "STREAM_RESUME",
    "STREAM_SEQ",
    "STREAM_SHA256",
    "STREAM_SIZE",
    "SentStream",
    "StreamProgress",
    "StreamResume",
    "StreamSource",
    "hash_prefix",
    "send_stream",
]

logger = logging.getLogger(__name__)

# The chunk headers (DESIGN.md sections 3 and 7).
STREAM_ID = "x-stream-id"
STREAM_SEQ = "x-stream-seq"
STREAM_OFFSET = "x-stream-offset"
STREAM_END = "x-stream-end"
STREAM_LENGTH = "x-stream-length"
STREAM_SHA256 = "x-stream-sha256"
STREAM_ABORT = "x-stream-abort"
STREAM_ABORT_REASON = "x-stream-abort-reason"
# Set by the broker on the first chunk a consumer gets of a stream another consumer left midway.
STREAM_RESUME = "x-stream-resume"
# Ours, on every chunk when known: the stream's name (a file's base name) and its announced size,
# a hint for progress bars (the end chunk's x-stream-length is what is checked).
STREAM_NAME = "x-stream-name"
STREAM_SIZE = "x-stream-size"
GROUP_ID = "JMSXGroupID"
DEDUP_ID = "x-dedup-id"

# Headers `send_stream` sets itself; a caller's `headers` may not name them.
RESERVED_HEADERS = frozenset(
    {
        STREAM_ID,
        STREAM_SEQ,
        STREAM_OFFSET,
        STREAM_END,
        STREAM_LENGTH,
        STREAM_SHA256,
        STREAM_ABORT,
        STREAM_ABORT_REASON,
        STREAM_RESUME,
        GROUP_ID,
        "JMSXGroupSeq",
        DEDUP_ID,
        "destination",
        "transaction",
        "receipt",
        "persistent",
        "content-length",
    }
)

DEFAULT_CHUNK_BYTES = 1 * MiB
# Frames are bounded by the broker's max_frame_bytes (64 MiB by default); leave room for headers.
MAX_CHUNK_BYTES = 63 * MiB
# Chunks written and not yet receipted, at most.
DEFAULT_STREAM_WINDOW = 16


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


StreamSource = (
    bytes | bytearray | memoryview | str | os.PathLike[str] | AsyncIterable[bytes] | Iterable[bytes]
)
"""What `send_stream` reads: bytes, a path, a binary file object (anything with `read(n)`,
called on a worker thread when it has a `fileno`), or an iterable or async iterable of bytes."""


@dataclass(frozen=True)
class StreamResume:
    """Where a new producer continues a stream whose earlier chunks the broker already has.

    `next_seq` and `offset` are those of the first chunk to send; `sha256` is a hashlib SHA-256
    object that has already hashed exactly the first `offset` bytes (see `hash_prefix`). The
    source handed to `send_stream` must start at `offset`.
    """

    next_seq: int
    offset: int
    sha256: Any


@dataclass(frozen=True)
class StreamProgress:
    """A chunk the broker has confirmed (its RECEIPT came), reported in order."""

    stream_id: str
    seq: int
    # Bytes of the stream up to the end of this chunk.
    offset_end: int
    end: bool


@dataclass(frozen=True)
class SentStream:
    """What `send_stream` sent: the stream's id, chunk count, length and SHA-256 (hex)."""

    stream_id: str
    chunks: int
    length: int
    sha256: str
    # Offset where this call started (0 unless it resumed a stream).
    resumed_at: int = 0


def hash_prefix(path: str | os.PathLike[str], length: int, *, block_bytes: int = MiB) -> Any:
    """A SHA-256 object that has hashed the first `length` bytes of the file at `path`.

    Raises `ClientError` if the file is shorter than that.
    """
    hasher = hashlib.sha256()
    remaining = length
    with open(path, "rb") as file:
        while remaining > 0:
            block = file.read(min(block_bytes, remaining))
            if not block:
                raise ClientError(f"{os.fspath(path)} has fewer than {length} bytes")
            hasher.update(block)
            remaining -= len(block)
    return hasher


def _read_full(file: _Readable, size: int) -> bytes:
    """Up to `size` bytes, fewer only at the end of the file (raw files may return short reads)."""
    first = file.read(size)
    if not first or len(first) >= size:
        return first
    parts = [first]
    got = len(first)
    while got < size:
        more = file.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


async def _file_chunks(file: _Readable, chunk_size: int) -> AsyncGenerator[bytes, None]:
    try:
        threaded = isinstance(file.fileno(), int)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        threaded = False
    while True:
        if threaded:
            data = await asyncio.to_thread(_read_full, file, chunk_size)
        else:
            data = _read_full(file, chunk_size)
        if not data:
            return
        yield data


async def _path_chunks(
    path: str | os.PathLike[str], chunk_size: int
) -> AsyncGenerator[bytes, None]:
    file = await asyncio.to_thread(open, path, "rb")
    try:
        async for data in _file_chunks(file, chunk_size):
            yield data
    finally:
        file.close()


class _Rechunker:
    """Cuts pieces of any size into chunks of `chunk_size` bytes; holds less than one chunk."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self._buffer = bytearray()

    def feed(self, piece: bytes | bytearray | memoryview) -> list[bytes]:
        view = memoryview(piece).cast("B")
        out: list[bytes] = []
        size = self.chunk_size
        if self._buffer:
            take = size - len(self._buffer)
            self._buffer += view[:take]
            view = view[take:]
            if len(self._buffer) < size:
                return out
            out.append(bytes(self._buffer))
            self._buffer.clear()
        while len(view) >= size:
            out.append(bytes(view[:size]))
            view = view[size:]
        self._buffer += view
        return out

    def rest(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


async def _chunks(source: StreamSource, chunk_size: int) -> AsyncGenerator[bytes, None]:
    """The source as chunks of `chunk_size` bytes (the last may be shorter)."""
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source).cast("B")
        for start in range(0, len(view), chunk_size):
            yield bytes(view[start : start + chunk_size])
        return
    if isinstance(source, str | os.PathLike):
        async for data in _path_chunks(source, chunk_size):
            yield data
        return
    if callable(getattr(source, "read", None)):
        async for data in _file_chunks(source, chunk_size):  # type: ignore[arg-type]
            yield data
        return
    cutter = _Rechunker(chunk_size)
    if isinstance(source, AsyncIterable):
        async for piece in source:
            for data in cutter.feed(piece):
                yield data
    elif isinstance(source, Iterable):
        for piece in source:
            for data in cutter.feed(piece):
                yield data
    else:
        raise ClientError(f"cannot stream a {type(source).__name__}")
    rest = cutter.rest()
    if rest:
        yield rest


def _base_headers(headers: Mapping[str, str] | None, stream_id: str) -> dict[str, str]:
    base = dict(headers) if headers else {}
    reserved = sorted(RESERVED_HEADERS.intersection(base))
    if reserved:
        raise ClientError(f"send_stream sets these headers itself: {', '.join(reserved)}")
    base[STREAM_ID] = stream_id
    base[GROUP_ID] = stream_id
    return base


async def send_stream(
    client: Client,
    destination: str,
    source: StreamSource,
    *,
    chunk_size: int = DEFAULT_CHUNK_BYTES,
    transactional: bool = False,
    stream_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    window: int = DEFAULT_STREAM_WINDOW,
    resume: StreamResume | None = None,
    on_progress: Callable[[StreamProgress], None] | None = None,
) -> SentStream:
    """Send `source` to `destination` as one stream of chunks; see `Client.send_stream`."""
    if not 1 <= chunk_size <= MAX_CHUNK_BYTES:
        raise ClientError(f"chunk_size must be between 1 and {MAX_CHUNK_BYTES} (got {chunk_size})")
    if window < 1:
        raise ClientError(f"window must be at least 1 (got {window})")
    if resume is not None and transactional:
        raise ClientError("a transactional stream cannot resume: it starts again from chunk 0")
    sid = stream_id if stream_id is not None else uuid.uuid4().hex
    base = _base_headers(headers, sid)
    if resume is not None:
        seq, offset, hasher = resume.next_seq, resume.offset, resume.sha256.copy()
    else:
        seq, offset, hasher = 0, 0, hashlib.sha256()
    started_at = offset
    first_seq = seq
    # Receipted in order: (pending receipt, progress to report once it comes).
    window_q: deque[tuple[PendingReceipt, StreamProgress]] = deque()

    def report(_: object = None) -> None:
        # Receipts come in order; report each as it comes, so progress does not lag the window.
        while window_q and window_q[0][0].succeeded:
            _, progress = window_q.popleft()
            if on_progress is not None:
                on_progress(progress)

    async def settle_oldest() -> None:
        await window_q[0][0].wait()
        report()

    transaction = await client.begin() if transactional else None
    epoch: int | None = None
    chunks = _chunks(source, chunk_size)
    try:
        current = await anext(chunks, b"")
        while True:
            following = await anext(chunks, None)
            end = following is None
            hasher.update(current)
            chunk_headers = dict(base)
            chunk_headers[STREAM_SEQ] = str(seq)
            chunk_headers[STREAM_OFFSET] = str(offset)
            chunk_headers[DEDUP_ID] = f"{sid}:{seq}"
            offset_end = offset + len(current)
            if end:
                chunk_headers[STREAM_END] = "true"
                chunk_headers[STREAM_LENGTH] = str(offset_end)
                chunk_headers[STREAM_SHA256] = hasher.hexdigest()
            if len(window_q) >= window:
                await settle_oldest()
            pending = await client.send_pipelined(
                destination,
                current,
                headers=chunk_headers,
                persistent=True,
                transaction=transaction,
                epoch=epoch,
            )
            # Every chunk on the connection of the first: never continue after a gap.
            epoch = pending.epoch
            window_q.append((pending, StreamProgress(sid, seq, offset_end, end)))
            pending.add_done_callback(report)
            seq += 1
            offset = offset_end
            if following is None:
                break
            current = following
        while window_q:
            await settle_oldest()
        if transaction is not None:
            await client.commit(transaction)
            transaction = None
    except BaseException:
        for pending, _ in window_q:
            pending.cancel()
        window_q.clear()
        if transaction is not None:
            try:
                await client.abort(transaction)
            except ClientError as exc:
                logger.debug("abort of stream %s transaction failed: %s", sid, exc)
        raise
    finally:
        await chunks.aclose()
    logger.debug(
        "stream %s: %d chunks, %d bytes sent to %s", sid, seq - first_seq, offset, destination
    )
    return SentStream(sid, seq - first_seq, offset, hasher.hexdigest(), started_at)
