"""What an operator may see of the running broker, as values: a destination
(`DestinationView`), a durable subscription (`DurableView`), a consumer (`ConsumerView`), a client
connection (`ConnectionView`, with what it speaks: `ConnectionProtocol`), a stream in progress
(`StreamView`) and the broker's message totals (`Totals`); and the counters each destination
keeps of its traffic (`Traffic`).

The core builds the views when asked (`Broker.destination_views`, `Broker.totals`, ...); the
management API and the metrics read them and never reach into the objects behind them. A
view is a snapshot: it is not updated afterwards.

Counting costs an integer increment per delivery and per acknowledgement; what comes in is
not counted at all (a destination's sequence numbers say it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Traffic:
    """Counters of one destination since the broker started (or since it was created)."""

    __slots__ = ("acked", "dead_lettered", "delivered", "expired", "redelivered")

    def __init__(self) -> None:
        # Deliveries handed to consumers (a redelivery counts again).
        self.delivered = 0
        # Deliveries acknowledged (auto-acknowledged ones once written to their connection).
        self.acked = 0
        # Deliveries put back for another (NACK, or their consumer left).
        self.redelivered = 0
        # Messages of this destination sent to its dead-letter queue.
        self.dead_lettered = 0
        # Messages that expired here before delivery (dead-lettered, or dropped when not
        # persistent).
        self.expired = 0


@dataclass(slots=True)
class DepthTotals:
    """Every destination summed: how many queues and topics, what they hold ready and what
    their consumers hold in flight (`Broker.depth_totals`)."""

    queues: int = 0
    topics: int = 0
    messages_ready: int = 0
    messages_in_flight: int = 0


@dataclass(frozen=True, slots=True)
class Totals:
    """Message counts of the whole broker since it started; they never go down, whatever
    destinations come and go."""

    messages_in: int = 0
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    expired: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.messages_in + other.messages_in,
            self.delivered + other.delivered,
            self.acked + other.acked,
            self.redelivered + other.redelivered,
            self.dead_lettered + other.dead_lettered,
            self.expired + other.expired,
        )


@dataclass(frozen=True, slots=True)
class DestinationView:
    """A queue or a topic, now.

    For a queue, `messages_ready` counts what waits for a consumer, in memory or in a store
    alone (`messages_paged` of them, `paged_bytes`); `messages_in_flight` what consumers hold
    unacknowledged. For a topic, `messages_ready` is what its log keeps in memory, and each
    durable subscription's lag is in its `DurableView`.
    """

    name: str
    kind: str
    messages_ready: int
    messages_in_flight: int
    consumers: int
    # Connections open now that have sent to it (`sluice.core.producers`).
    producers: int
    durable_subscriptions: int
    memory_bytes: int
    messages_paged: int
    paged_bytes: int
    # The destination's counts since the broker started (or since it was created).
    messages_in: int
    delivered: int
    acked: int
    redelivered: int
    dead_lettered: int
    expired: int
    # The sequence number of its last message.
    last_seq: int
    dead_letter_queue: bool

    @property
    def totals(self) -> Totals:
        """Its counts, as a broker total."""
        return Totals(
            self.messages_in,
            self.delivered,
            self.acked,
            self.redelivered,
            self.dead_lettered,
            self.expired,
        )


@dataclass(frozen=True, slots=True)
class DurableView:
    """A durable topic subscription: its cursor (the last sequence acknowledged), how far it
    is behind the topic (`lag`, in sequence numbers), and whether a consumer is attached."""

    destination: str
    client_id: str
    name: str
    selector: str | None
    cursor: int
    lag: int
    active: bool


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """A consumer: one subscription of a connection to a destination (a wildcard subscription
    is one per topic it matches). `credit` is how many more messages it may be given before it
    acknowledges some (`prefetch` less `messages_in_flight`; None when it acknowledges
    automatically, and so is bounded by its connection's writes alone); `writable` is False
    while its connection's write buffer is full (it gets nothing meanwhile)."""

    destination: str
    connection_id: int
    subscription_id: str
    ack_mode: str
    selector: str | None
    exclusive: bool
    durable_name: str | None
    client_id: str | None
    prefetch: int
    prefetch_bytes: int
    messages_in_flight: int
    bytes_in_flight: int
    credit: int | None
    # Bytes it may still be given (`prefetch_bytes` less in flight); None when it has no byte
    # credit or acknowledges automatically.
    credit_bytes: int | None
    writable: bool


class ConnectionProtocol(enum.Enum):
    """What a client connection speaks, over what."""

    STOMP_TCP = "stomp-tcp"
    STOMP_TLS = "stomp-tls"
    # STOMP over WebSocket on the management server's `/stomp`, plain or over HTTPS.
    STOMP_WS = "stomp-ws"
    STOMP_WSS = "stomp-wss"


@dataclass(frozen=True, slots=True)
class ConnectionView:
    """A client connection that has logged in. `version` is the STOMP version negotiated,
    `heartbeat_ms` (what the broker sends, what it expects from the client), 0 for off. Its
    credit is its consumers' (`ConsumerView`), summed by who shows it."""

    id: int
    address: str
    user: str
    client_id: str | None
    version: str
    heartbeat_ms: tuple[int, int]
    bytes_in: int
    bytes_out: int
    subscriptions: int
    connected_at_ms: int
    tls: bool
    protocol: ConnectionProtocol


@dataclass(frozen=True, slots=True)
class MessageView:
    """A message as a browser sees it, without consuming it: its place (`seq`), its headers,
    whether a consumer holds it now (`in_flight`), and the first bytes of its body."""

    seq: int
    message_id: str
    timestamp_ms: int
    priority: int
    persistent: bool
    expires_ms: int
    delivery_count: int
    in_flight: bool
    headers: dict[str, str]
    body_bytes: int
    body_preview: bytes


class StreamReading(enum.Enum):
    """Where the reading of a stream stands."""

    NONE = "none"  # no consumer has taken it yet
    READING = "reading"  # a consumer holds it
    RESUMING = "resuming"  # its consumer left in the middle: the next one resumes
    DISCARDING = "discarding"  # its consumer left; the rest goes to the DLQ (stream_policy)


@dataclass(frozen=True, slots=True)
class StreamView:
    """A stream in progress: still being sent (`sending`: its end has not come; by a connected
    producer, or recovered after a restart and waiting for its producer), or being read.

    Chunk numbers are `x-stream-seq`s. The reader holds `chunks_in_flight` chunks, the furthest
    `delivered_chunk`; `resume_chunk` (at byte `resume_offset`) is the first chunk not
    acknowledged, where the next reader starts if this one dies (None when no chunk of it is in
    memory: the rest waits in the store). `last_chunk` is the furthest chunk held in memory,
    `ended` whether it is the stream's end (whose `x-stream-length` is `length_bytes`): with
    them a reader's progress can be shown (`resume_chunk` of `last_chunk + 1`)."""

    destination: str
    stream_id: str
    sending: bool
    producer_connected: bool
    last_chunk_ms: int | None
    reading: StreamReading
    reader_connection: int | None
    reader_subscription: str | None
    chunks_in_flight: int
    delivered_chunk: int | None
    resume_chunk: int | None
    resume_offset: int | None
    last_chunk: int | None = None
    ended: bool = False
    length_bytes: int | None = None
