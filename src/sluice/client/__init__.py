"""The Sluice STOMP client: asyncio (`Client`) and blocking (`BlockingClient`).

Both speak STOMP 1.0, 1.1 and 1.2 to Sluice and to other brokers (ActiveMQ, RabbitMQ), on the
sans-IO connection of `sluice.stomp`.
"""

from __future__ import annotations

from sluice.client.address import BrokerAddress, parse_brokers
from sluice.client.aio import Client
from sluice.client.blocking import BlockingClient, BlockingSubscription
from sluice.client.errors import ConnectionLost, ReceiptTimeout
from sluice.client.message import AckMode, Message
from sluice.client.options import DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES, ClientOptions
from sluice.client.state import ClientState
from sluice.client.subscription import MessageCallback, Subscription
from sluice.errors import BrokerErrorFrame, ClientError

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "AckMode",
    "BlockingClient",
    "BlockingSubscription",
    "BrokerAddress",
    "BrokerErrorFrame",
    "Client",
    "ClientError",
    "ClientOptions",
    "ClientState",
    "ConnectionLost",
    "Message",
    "MessageCallback",
    "ReceiptTimeout",
    "Subscription",
    "parse_brokers",
]
