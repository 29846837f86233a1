"""Streams of chunks (DESIGN.md section 7): files and iterables of any size, sent and read back.

- `headers`: the chunk headers, named once;
- `options`: `StreamOptions` (how a stream is sent), `StreamResume`, `StreamProgress`;
- `chunker`: what a stream is read from (`StreamSource`), cut into chunks;
- `send`: `send_stream`, a bounded window of pipelined chunks;
- `chunks`: a received chunk's headers, parsed and checked;
- `inbound`: `InboundStream`, one stream read like a file;
- `reader`: `StreamReader`, one stream at a time from a destination, checked;
- `blocking`: the reader and its streams from plain threads;
- `transport`: what all this needs from a client (`SendTransport`, `ReadTransport`);
- `methods`: `StreamMethods`, the stream operations mixed into `Client`.

Nothing here imports `sluice.client.aio`: the client depends on its streams, not the reverse.
"""

from __future__ import annotations

from sluice.client.streams.blocking import BlockingInboundStream, BlockingStreamReader
from sluice.client.streams.chunker import StreamSource
from sluice.client.streams.headers import STREAM_NAME, STREAM_SIZE
from sluice.client.streams.inbound import InboundStream, StreamState
from sluice.client.streams.options import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_STREAM_WINDOW,
    MAX_CHUNK_BYTES,
    StreamOptionFields,
    StreamOptions,
    StreamProgress,
    StreamResume,
    hash_prefix,
)
from sluice.client.streams.reader import DEFAULT_STREAM_PREFETCH_BYTES, GapPolicy, StreamReader
from sluice.client.streams.send import SentStream

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_STREAM_PREFETCH_BYTES",
    "DEFAULT_STREAM_WINDOW",
    "MAX_CHUNK_BYTES",
    "STREAM_NAME",
    "STREAM_SIZE",
    "BlockingInboundStream",
    "BlockingStreamReader",
    "GapPolicy",
    "InboundStream",
    "SentStream",
    "StreamOptionFields",
    "StreamOptions",
    "StreamProgress",
    "StreamReader",
    "StreamResume",
    "StreamSource",
    "StreamState",
    "hash_prefix",
]
