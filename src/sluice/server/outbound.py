"""The bytes one connection owes its peer, on their way to the transport.

Frames are appended to `chunks` and handed to the transport in one `writelines` per loop turn, or at
once when they would take the connection past its write buffer's high-water mark
(`write_buffer_high_bytes`). Handing them over at the mark, rather than at the end of the turn, is
what bounds the connection: the transport then pauses writing, and the session's flow control stops
both dispatch to the connection and reading from it until the buffer drains. Between the turn's
batch and the transport, the broker never holds more than the mark plus one frame for a peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Outbound:
    """Frames queued for one peer, batched per loop turn and bounded by the high-water mark."""

    __slots__ = (
        "_flush_at",
        "_high_bytes",
        "_loop",
        "_on_sent",
        "_scheduled",
        "chunks",
        "sent_bytes",
        "size",
        "transport",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, high_bytes: int, on_sent: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._high_bytes = high_bytes
        self._on_sent = on_sent
        self.transport: asyncio.Transport | None = None
        # Frames not yet handed to the transport, and their size in bytes.
        self.chunks: list[bytes] = []
        self.size = 0
        # Bytes handed to the transport since the connection opened.
        self.sent_bytes = 0
        # Hand over early past this many bytes: the room left under the mark at the last write
        # (the transport's buffer only shrinks between writes, so this errs on the early side).
        self._flush_at = high_bytes
        self._scheduled = False

    @property
    def pending_bytes(self) -> int:
        """Bytes owed to the peer that its socket has not taken yet (ours and the transport's)."""
        transport = self.transport
        return self.size + (transport.get_write_buffer_size() if transport is not None else 0)

    def write(self, data: bytes) -> None:
        """Queue one frame (or part of one)."""
        self.chunks.append(data)
        self.queued(len(data))

    def queued(self, size: int) -> None:
        """`size` bytes were appended to `chunks`: write them this turn, or now past the mark."""
        self.size += size
        if self.size > self._flush_at:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Hand everything queued to the transport now."""
        self._scheduled = False
        chunks = self.chunks
        if not chunks:
            return
        size = self.size
        self.chunks = []
        self.size = 0
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.writelines(chunks)
        self.sent_bytes += size
        self.drained()
        self._on_sent()

    def drained(self) -> None:
        """The transport's buffer shrank (it resumed writing): recompute the room left."""
        transport = self.transport
        if transport is not None:
            self._flush_at = self._high_bytes - transport.get_write_buffer_size()
