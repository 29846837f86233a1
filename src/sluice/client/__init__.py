"""The Sluice STOMP client: asyncio (`Client`) and blocking (`BlockingClient`).

Both speak STOMP 1.0, 1.1 and 1.2 to Sluice and to other brokers (ActiveMQ, RabbitMQ), on the
sans-IO connection of `sluice.stomp`. Both send and read streams of chunks (`send_stream`,
`stream_reader`; see `sluice.client.streams` and docs/streams.md).
"""

from __future__ import annotations

from sluice.client.address import BrokerAddress, parse_brokers
from sluice.client.aio import Client
from sluice.client.blocking import BlockingClient, BlockingSubscription
from sluice.client.errors import (
    ConnectionLost,
    ReceiptTimeout,
    StreamAborted,
    StreamCorrupted,
    StreamError,
    StreamOutOfOrder,
)
from sluice.client.message import AckMode, Message
from sluice.client.options import DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES, ClientOptions
from sluice.client.state import ClientState
from sluice.client.streams import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_STREAM_PREFETCH_BYTES,
    BlockingInboundStream,
    BlockingStreamReader,
    GapPolicy,
    InboundStream,
    SentStream,
    StreamOptions,
    StreamProgress,
    StreamReader,
    StreamResume,
    StreamState,
    hash_prefix,
)
from sluice.client.subscription import ClientSubscription, MessageCallback
from sluice.errors import BrokerErrorFrame, ClientError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_STREAM_PREFETCH_BYTES",
    "AckMode",
    "BlockingClient",
    "BlockingInboundStream",
    "BlockingStreamReader",
    "BlockingSubscription",
    "BrokerAddress",
    "BrokerErrorFrame",
    "Client",
    "ClientError",
    "ClientOptions",
    "ClientState",
    "ClientSubscription",
    "ConnectionLost",
    "GapPolicy",
    "InboundStream",
    "Message",
    "MessageCallback",
    "ReceiptTimeout",
    "SentStream",
    "StreamAborted",
    "StreamCorrupted",
    "StreamError",
    "StreamOptions",
    "StreamOutOfOrder",
    "StreamProgress",
    "StreamReader",
    "StreamResume",
    "StreamState",
    "hash_prefix",
    "parse_brokers",
]
