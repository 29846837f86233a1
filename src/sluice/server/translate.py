"""Between STOMP frames and core messages: SEND headers in, MESSAGE frames out.

Headers the broker sets or consumes are not stored as user properties; every other header of a
SEND travels with the message untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.core.connection import SubscribeOptions
from sluice.core.message import AckMode, Message
from sluice.errors import RequestError
from sluice.stomp.encoding import escape_value
from sluice.stomp.frames import Frame, Version

# Set per delivery or consumed by the broker; never stored as user properties.
BROKER_HEADERS = frozenset(
    {
        "destination",
        "content-length",
        "receipt",
        "transaction",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
        "x-delivery-count",
        "x-offset",
        "x-stream-resume",
        "persistent",
        "priority",
        "expires",
        "timestamp",
    }
)

DEFAULT_PRIORITY = 4

# Versions as module names: on Python 3.11 reading an enum member through its class costs several
# times a global read, and every MESSAGE frame is built with them.
_V1_0, _V1_2 = Version.V1_0, Version.V1_2

# Bodies smaller than this are copied into the frame's buffer; larger ones are written as they are.
_COPY_BODY_BELOW = 64 * 1024


def parse_int_header(
    headers: Mapping[str, str], name: str, *, minimum: int = 0, maximum: int | None = None
) -> int | None:
    """An integer header, or None when absent; a malformed or out-of-range value is an error."""
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(f"header {name} must be an integer, got {raw[:40]!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and {maximum}" if maximum is not None else ""
        raise RequestError(f"header {name} must be between {minimum}{upper}, got {value}")
    return value


_ACK_MODES = {m.value: m for m in AckMode}


def parse_subscribe(frame: Frame) -> tuple[str, str, AckMode, SubscribeOptions]:
    """A SUBSCRIBE's id (the destination when absent, as 1.0 allows), destination, ack mode
    and options; a bad ack mode or number is a `RequestError`."""
    h = frame.headers
    destination = h["destination"]
    mode = _ACK_MODES.get(h.get("ack", "auto"))
    if mode is None:
        raise RequestError(f"unknown ack mode {h.get('ack')!r} in SUBSCRIBE")
    options = SubscribeOptions(
        prefetch=parse_int_header(h, "activemq.prefetchSize", minimum=1),
        prefetch_bytes=parse_int_header(h, "x-prefetch-bytes", minimum=0) or 0,
        selector=h.get("selector"),
        exclusive=h.get("activemq.exclusive") == "true",
        max_open_groups=parse_int_header(h, "x-max-open-groups", minimum=0) or 0,
        durable_name=h.get("activemq.subscriptionName"),
        offset=h.get("x-offset"),
    )
    return h.get("id", destination), destination, mode, options


def build_message(frame: Frame, message_id: str, now_ms: int) -> Message:
    """Turn a SEND frame into a message (sequence assigned later by its destination)."""
    h = frame.headers
    priority = DEFAULT_PRIORITY
    expires = 0
    if "priority" in h:
        priority = parse_int_header(h, "priority", minimum=0, maximum=9) or 0
    if "expires" in h:
        expires = parse_int_header(h, "expires", minimum=0) or 0
    # Usually every header is one the broker consumes: skip building the filtered copy.
    user = (
        {}
        if h.keys() <= BROKER_HEADERS
        else {k: v for k, v in h.items() if k not in BROKER_HEADERS}
    )
    return Message(
        h["destination"],
        0,
        message_id,
        now_ms,
        user,
        frame.body,
        expires_ms=expires,
        priority=priority,
        persistent=h.get("persistent", "").lower() == "true",
    )


def encode_common_headers(message: Message, version: Version) -> bytes:
    """The header lines every delivery of a message shares, through the blank line."""
    if version is _V1_0:
        destination, message_id = message.destination, message.message_id
    else:
        destination = _escaped_destination(message.destination, version)
        message_id = escape_value(message.message_id, version)
    text = (
        f"destination:{destination}\nmessage-id:{message_id}\n"
        f"timestamp:{message.timestamp_ms}\nx-offset:{message.seq}\n"
    )
    if message.expires_ms:
        text += f"expires:{message.expires_ms}\n"
    if message.priority != DEFAULT_PRIORITY:
        text += f"priority:{message.priority}\n"
    if message.persistent:
        text += "persistent:true\n"
    if message.headers:
        if version is _V1_0:
            text += "".join(f"{k}:{v}\n" for k, v in message.headers.items())
        else:
            text += "".join(
                f"{escape_value(k, version)}:{escape_value(v, version)}\n"
                for k, v in message.headers.items()
            )
    return f"{text}content-length:{len(message.body)}\n\n".encode()


def append_message(
    out: list[bytes],
    link_data: bytes,
    message: Message,
    tag: int,
    delivery_count: int,
    version: Version,
) -> int:
    """Append one delivery's MESSAGE frame to `out`; return its size in bytes. `link_data` is
    the subscription id as the header value; `tag` 0 means no `ack` header."""
    if version is _V1_0:
        common = encode_common_headers(message, version)
    elif message.wire is not None:
        common = message.wire
    else:
        # Shared by every delivery of the message: encoded once, cached on it.
        common = message.wire = encode_common_headers(message, version)
    if tag and version is _V1_2:
        head = b"MESSAGE\nsubscription:%b\nack:%d\nx-delivery-count:%d\n" % (
            link_data,
            tag,
            delivery_count,
        )
    else:
        head = b"MESSAGE\nsubscription:%b\nx-delivery-count:%d\n" % (link_data, delivery_count)
    body = message.body
    if delivery_count > 1:
        head += b"redelivered:true\n"
    if len(body) < _COPY_BODY_BELOW:
        # One buffer per frame: cheaper than three for the transport to gather.
        frame = b"".join((head, common, body, b"\x00"))
        out.append(frame)
        return len(frame)
    head += common
    out.append(head)
    out.append(body)
    out.append(b"\x00")
    return len(head) + len(body) + 1


_DESTINATION_CACHE_SIZE = 4096
# Escaped destination names of STOMP 1.2 and of 1.1 (1.2 escapes carriage returns too); keyed by
# name alone, as an enum's hash is a Python call on 3.11.
_escaped_1_2: dict[str, str] = {}
_escaped_1_1: dict[str, str] = {}


def _escaped_destination(name: str, version: Version) -> str:
    # Destinations repeat: escape each once (a bounded cache, cleared when full).
    cache = _escaped_1_2 if version is _V1_2 else _escaped_1_1
    escaped = cache.get(name)
    if escaped is None:
        if len(cache) >= _DESTINATION_CACHE_SIZE:
            cache.clear()
        escaped = cache[name] = escape_value(name, version)
    return escaped
