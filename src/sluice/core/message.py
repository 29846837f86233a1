"""The runtime message, destination names and the small enums the core shares."""

from __future__ import annotations

import enum

from sluice.store.api import StoredMessage

QUEUE_PREFIX = "/queue/"
TOPIC_PREFIX = "/topic/"

# Message properties the core reads (JMS and ActiveMQ names; see DESIGN.md section 3).
GROUP_ID = "JMSXGroupID"
GROUP_SEQ = "JMSXGroupSeq"
DEDUP_ID = "x-dedup-id"
# Streams (DESIGN.md section 7): a stream is a message group whose messages are chunks.
STREAM_ID = "x-stream-id"
STREAM_SEQ = "x-stream-seq"
STREAM_OFFSET = "x-stream-offset"
STREAM_END = "x-stream-end"
STREAM_LENGTH = "x-stream-length"
STREAM_ABORT = "x-stream-abort"
STREAM_ABORT_REASON = "x-stream-abort-reason"
# Set by the broker on the first chunk a consumer gets of a stream another consumer left in the
# middle: the reader continues there (never taken from a SEND).
STREAM_RESUME = "x-stream-resume"


def closes_group(headers: dict[str, str]) -> bool:
    """Does this message close its group (`JMSXGroupSeq:-1`, the end or abort of a stream)?"""
    return (
        headers.get(GROUP_SEQ) == "-1"
        or headers.get(STREAM_END) == "true"
        or headers.get(STREAM_ABORT) == "true"
    )


class DestinationKind(enum.Enum):
    """Point to point or publish/subscribe."""

    QUEUE = "queue"
    TOPIC = "topic"


class AckMode(enum.Enum):
    """How a subscription acknowledges (STOMP `ack` header)."""

    AUTO = "auto"
    CLIENT = "client"
    CLIENT_INDIVIDUAL = "client-individual"


class DestinationNameError(ValueError):
    """The destination is not `/queue/NAME` or `/topic/NAME`."""


MAX_DESTINATION_NAME_CHARS = 1024


def parse_destination(name: str) -> tuple[DestinationKind, str]:
    """Split `/queue/x` or `/topic/x` into its kind and short name; raise on anything else."""
    if name.startswith(QUEUE_PREFIX):
        kind, short = DestinationKind.QUEUE, name[len(QUEUE_PREFIX) :]
    elif name.startswith(TOPIC_PREFIX):
        kind, short = DestinationKind.TOPIC, name[len(TOPIC_PREFIX) :]
    else:
        raise DestinationNameError(
            f"destination {name[:100]!r} must start with {QUEUE_PREFIX} or {TOPIC_PREFIX}"
        )
    if not short:
        raise DestinationNameError(f"destination {name!r} has an empty name")
    if len(name) > MAX_DESTINATION_NAME_CHARS:
        raise DestinationNameError(
            f"destination name longer than {MAX_DESTINATION_NAME_CHARS} characters"
        )
    return kind, short


class Message(StoredMessage):
    """A message as the broker handles it: what is stored plus its delivery state.

    `wire` caches the encoded header block that every delivery of the message shares; the server
    fills it on first delivery so a message sent to many consumers is encoded once.
    """

    __slots__ = (
        "delivery_count",
        "group_id",
        "in_store",
        "nbytes",
        "paged_out",
        "spooled",
        "wire",
    )

    def __init__(
        self,
        destination: str,
        seq: int,
        message_id: str,
        timestamp_ms: int,
        headers: dict[str, str],
        body: bytes,
        *,
        expires_ms: int = 0,
        priority: int = 4,
        persistent: bool = False,
    ) -> None:
        # Set directly rather than through StoredMessage.__init__: this runs once per message.
        self.destination = destination
        self.seq = seq
        self.message_id = message_id
        self.timestamp_ms = timestamp_ms
        self.headers = headers
        self.body = body
        self.expires_ms = expires_ms
        self.priority = priority
        self.persistent = persistent
        self.delivery_count = 0
        # A stream chunk without an explicit group belongs to its stream's group.
        self.group_id: str | None = headers.get(GROUP_ID) or headers.get(STREAM_ID)
        self.in_store = False
        # A non-persistent message written to the temp store because memory was full.
        self.spooled = False
        # Only the store holds the body (a transacted message waiting for COMMIT): the queue
        # reads it back when it is visible.
        self.paged_out = False
        self.wire: bytes | None = None
        # Computed once: credit and memory accounting read it on every dispatch.
        nbytes = len(body)
        for key, value in headers.items():
            nbytes += len(key) + len(value) + 2
        self.nbytes = nbytes

    @property
    def size(self) -> int:
        """Its body and header text, as `StoredMessage.size`: `nbytes`, computed once."""
        return self.nbytes

    @classmethod
    def from_stored(cls, stored: StoredMessage, delivery_count: int = 0) -> Message:
        """Wrap a message read back from the store."""
        if isinstance(stored, Message):
            return stored
        msg = cls(
            stored.destination,
            stored.seq,
            stored.message_id,
            stored.timestamp_ms,
            stored.headers,
            stored.body,
            expires_ms=stored.expires_ms,
            priority=stored.priority,
            persistent=stored.persistent,
        )
        msg.delivery_count = delivery_count
        msg.in_store = True
        return msg

    def without_body(self) -> Message:
        """A copy that keeps what a transaction needs at COMMIT, not the body (which the store
        has)."""
        stub = Message(
            self.destination,
            self.seq,
            self.message_id,
            self.timestamp_ms,
            self.headers,
            b"",
            expires_ms=self.expires_ms,
            priority=self.priority,
            persistent=self.persistent,
        )
        stub.in_store = True
        stub.paged_out = True
        return stub

    def expired(self, now_ms: int) -> bool:
        """True once past its `expires` time (0 never expires)."""
        return 0 < self.expires_ms <= now_ms
