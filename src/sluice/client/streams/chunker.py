"""What a stream is sent from, cut into chunks: bytes, a path, a file, an iterable of bytes.

`source_chunks` yields chunks of exactly `chunk_size` bytes (the last may be shorter) and holds
less than one chunk of its own: a file is read a chunk at a time (on a worker thread when it has
a `fileno`), and pieces of an iterable are cut or joined by `_Rechunker`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from typing import Protocol

from sluice.errors import ClientError

__all__ = ["StreamSource", "source_chunks"]


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


StreamSource = (
    bytes | bytearray | memoryview | str | os.PathLike[str] | AsyncIterable[bytes] | Iterable[bytes]
)
"""What `send_stream` reads: bytes, a path, a binary file object (anything with `read(n)`,
called on a worker thread when it has a `fileno`), or an iterable or async iterable of bytes."""


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


async def _iterable_chunks(
    source: AsyncIterable[bytes] | Iterable[bytes], chunk_size: int
) -> AsyncGenerator[bytes, None]:
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


async def source_chunks(source: StreamSource, chunk_size: int) -> AsyncGenerator[bytes, None]:
    """The source as chunks of `chunk_size` bytes (the last may be shorter)."""
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source).cast("B")
        for start in range(0, len(view), chunk_size):
            yield bytes(view[start : start + chunk_size])
        return
    if isinstance(source, str | os.PathLike):
        pieces = _path_chunks(source, chunk_size)
    elif callable(getattr(source, "read", None)):
        pieces = _file_chunks(source, chunk_size)  # type: ignore[arg-type]
    else:
        pieces = _iterable_chunks(source, chunk_size)
    try:
        async for data in pieces:
            yield data
    finally:
        await pieces.aclose()
