"""The Sluice STOMP client: asyncio (`Client`) and blocking (`BlockingClient`).

Both speak STOMP 1.0, 1.1 and 1.2 to Sluice and to other brokers (ActiveMQ, RabbitMQ), on the
sans-IO connection of `sluice.stomp`. Both send and read streams of chunks (`send_stream`,
`stream_reader`; see docs/streams.md).
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
from sluice.client.inbound import InboundStream, StreamState
from sluice.client.message import AckMode, Message
from sluice.client.options import DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES, ClientOptions
from sluice.client.state import ClientState
from sluice.client.stream import (
    DEFAULT_CHUNK_BYTES,
    SentStream,
    StreamProgress,
    StreamResume,
    hash_prefix,
)
from sluice.client.stream_blocking import BlockingInboundStream, BlockingStreamReader
from sluice.client.stream_reader import DEFAULT_STREAM_PREFETCH_BYTES, GapPolicy, StreamReader
from sluice.client.subscription import MessageCallback, Subscription
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
    "StreamOutOfOrder",
    "StreamProgress",
    "StreamReader",
    "StreamResume",
    "StreamState",
    "Subscription",
    "hash_prefix",
    "parse_brokers",
]
