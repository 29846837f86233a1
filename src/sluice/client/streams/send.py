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

import hashlib
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sluice.client.pipeline import PipelinedReceipt
from sluice.client.streams.chunker import StreamSource, source_chunks
from sluice.client.streams.headers import (
    DEDUP_ID,
    GROUP_ID,
    STREAM_END,
    STREAM_ID,
    STREAM_LENGTH,
    STREAM_OFFSET,
    STREAM_SEQ,
    STREAM_SHA256,
)
from sluice.client.streams.options import StreamOptions, StreamProgress
from sluice.client.streams.transport import SendTransport
from sluice.errors import ClientError

__all__ = ["SentStream", "send_stream"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentStream:
    """What `send_stream` sent: the stream's id, chunk count, length and SHA-256 (hex)."""

    stream_id: str
    chunks: int
    length: int
    sha256: str
    # Offset where this call started (0 unless it resumed a stream).
    resumed_at: int = 0


class _ReceiptWindow:
    """Chunks written and not yet receipted, oldest first, each with the progress it reports."""

    def __init__(self, options: StreamOptions) -> None:
        self._size = options.window
        self._on_progress = options.on_progress
        self._pending: deque[tuple[PipelinedReceipt, StreamProgress]] = deque()

    def add(self, receipt: PipelinedReceipt, progress: StreamProgress) -> None:
        """Track one more chunk; its progress is reported once it and those before it are in."""
        self._pending.append((receipt, progress))
        receipt.add_done_callback(self._report)

    def _report(self, _: object = None) -> None:
        # Receipts come in order; report each as it comes, so progress does not lag the window.
        pending = self._pending
        while pending and pending[0][0].succeeded:
            _, progress = pending.popleft()
            if self._on_progress is not None:
                self._on_progress(progress)

    async def _settle_oldest(self) -> None:
        await self._pending[0][0].wait()
        self._report()

    async def make_room(self) -> None:
        """Wait until one more chunk fits in the window."""
        while len(self._pending) >= self._size:
            await self._settle_oldest()

    async def drain(self) -> None:
        """Wait for every receipt (raising the first failure)."""
        while self._pending:
            await self._settle_oldest()

    def cancel(self) -> None:
        """Stop waiting for what is still pending: its outcome stays unknown."""
        for receipt, _ in self._pending:
            receipt.cancel()
        self._pending.clear()


class _StreamSender:
    """One stream on its way: where it stands (sequence, offset, hash) and how to send a chunk."""

    def __init__(self, transport: SendTransport, destination: str, options: StreamOptions) -> None:
        self.transport = transport
        self.destination = destination
        self.options = options
        self.stream_id = options.stream_id if options.stream_id is not None else uuid.uuid4().hex
        self._base_headers = dict(options.headers) if options.headers else {}
        self._base_headers[STREAM_ID] = self.stream_id
        self._base_headers[GROUP_ID] = self.stream_id
        resume = options.resume
        if resume is not None:
            self.seq, self.offset, self._hasher = (
                resume.next_seq,
                resume.offset,
                resume.sha256.copy(),
            )
        else:
            self.seq, self.offset, self._hasher = 0, 0, hashlib.sha256()
        self.first_seq = self.seq
        self.started_at = self.offset
        self.window = _ReceiptWindow(options)
        self.transaction: str | None = None
        # Every chunk goes on the connection of the first: never continue after a gap.
        self._epoch: int | None = None

    def _chunk_headers(self, offset_end: int, end: bool) -> dict[str, str]:
        headers = dict(self._base_headers)
        headers[STREAM_SEQ] = str(self.seq)
        headers[STREAM_OFFSET] = str(self.offset)
        headers[DEDUP_ID] = f"{self.stream_id}:{self.seq}"
        if end:
            headers[STREAM_END] = "true"
            headers[STREAM_LENGTH] = str(offset_end)
            headers[STREAM_SHA256] = self._hasher.hexdigest()
        return headers

    async def send_chunk(self, data: bytes, *, end: bool) -> None:
        """Write one chunk once the window has room for it; its receipt is awaited later."""
        self._hasher.update(data)
        offset_end = self.offset + len(data)
        headers = self._chunk_headers(offset_end, end)
        await self.window.make_room()
        receipt = await self.transport.send_pipelined(
            self.destination,
            data,
            headers=headers,
            persistent=True,
            transaction=self.transaction,
            epoch=self._epoch,
        )
        self._epoch = receipt.epoch
        self.window.add(receipt, StreamProgress(self.stream_id, self.seq, offset_end, end))
        self.seq += 1
        self.offset = offset_end

    async def send_all(self, chunks: AsyncIterator[bytes]) -> None:
        """Send every chunk, reading one ahead to know which is the last, and wait for them."""
        current = await anext(chunks, b"")
        while True:
            following = await anext(chunks, None)
            await self.send_chunk(current, end=following is None)
            if following is None:
                break
            current = following
        await self.window.drain()

    async def abandon(self) -> None:
        """After a failure: stop waiting for receipts and abort the transaction, if any."""
        self.window.cancel()
        if self.transaction is not None:
            try:
                await self.transport.abort(self.transaction)
            except ClientError as exc:
                logger.debug("abort of stream %s transaction failed: %s", self.stream_id, exc)

    def result(self) -> SentStream:
        """What was sent, once every chunk is receipted."""
        return SentStream(
            self.stream_id,
            self.seq - self.first_seq,
            self.offset,
            self._hasher.hexdigest(),
            self.started_at,
        )


async def send_stream(
    transport: SendTransport, destination: str, source: StreamSource, options: StreamOptions
) -> SentStream:
    """Send `source` to `destination` as one stream of chunks; see `Client.send_stream`."""
    sender = _StreamSender(transport, destination, options)
    if options.transactional:
        sender.transaction = await transport.begin()
    chunks = source_chunks(source, options.chunk_size)
    try:
        await sender.send_all(chunks)
        if sender.transaction is not None:
            await transport.commit(sender.transaction)
            sender.transaction = None
    except BaseException:
        await sender.abandon()
        raise
    finally:
        await chunks.aclose()
    sent = sender.result()
    logger.debug(
        "stream %s: %d chunks, %d bytes sent to %s",
        sent.stream_id,
        sent.chunks,
        sent.length,
        destination,
    )
    return sent
