"""Range reads: a block of a topic's log in one MESSAGE frame, for readers of the log.

A SUBSCRIBE to a topic with `x-range-end` is not a subscription: it asks for the messages with
offsets from `x-offset` (a number) up to `x-range-end` (excluded), at most `x-range-max-count`
messages and about `x-range-max-bytes` of bodies (each capped by the broker's bounds below). The
broker answers with one MESSAGE on subscription `id` whose body is a block
(`sluice.stomp.records`), then the RECEIPT when one was asked for, and keeps nothing: no cursor,
no credit, no acknowledgement. The MESSAGE carries

- `x-range-next`: the offset to ask from next (past the last message and past any offsets it
  skipped: expired or withdrawn messages), `x-range-count`: the messages in the block;
- `x-first-offset`, `x-last-offset`: what the topic keeps, as on a SUBSCRIBE receipt, so that a
  reader sees loss (its offset below the first kept) on every block.

Permission is READ on the topic, as for a subscription. A reader asks for one block at a time (or
a few); what it has not read stays in the connection's outbound buffer, whose high-water mark
stops reading its frames until it drains, so a reader that asks and never reads holds at most the
mark plus one block.
"""

from __future__ import annotations

from sluice.core.broker import Broker
from sluice.core.topic import Topic
from sluice.errors import RequestError
from sluice.server.translate import parse_int_header
from sluice.stomp.encoding import escape_value
from sluice.stomp.frames import Frame, Version
from sluice.stomp.records import encode_block

__all__ = [
    "MAX_RANGE_BYTES",
    "MAX_RANGE_COUNT",
    "RANGE_END_HEADER",
    "is_range_read",
    "range_block",
]

RANGE_END_HEADER = "x-range-end"
# The most a block may hold: messages, and bytes of bodies (one larger message still goes alone).
MAX_RANGE_COUNT = 65_536
MAX_RANGE_BYTES = 16 * 1024 * 1024
_DEFAULT_COUNT = 16_384
_DEFAULT_BYTES = 4 * 1024 * 1024
_CONTENT_TYPE = "application/x-sluice-records"


def is_range_read(frame: Frame) -> bool:
    """Is this SUBSCRIBE a range read?"""
    return RANGE_END_HEADER in frame.headers


def range_block(broker: Broker, topic: Topic, frame: Frame, version: Version) -> bytes:
    """The MESSAGE frame answering the range read `frame` on `topic`."""
    h = frame.headers
    start = parse_int_header(h, "x-offset", minimum=1)
    end = parse_int_header(h, RANGE_END_HEADER, minimum=1)
    if start is None or end is None:
        raise RequestError("a range read needs x-offset and x-range-end (offsets)")
    max_count = min(
        parse_int_header(h, "x-range-max-count", minimum=1) or _DEFAULT_COUNT, MAX_RANGE_COUNT
    )
    max_bytes = min(
        parse_int_header(h, "x-range-max-bytes", minimum=1) or _DEFAULT_BYTES, MAX_RANGE_BYTES
    )
    messages, next_offset = topic.read_range(start, end, max_count, max_bytes, broker.now_ms())
    first, last = topic.offsets()
    body = encode_block(messages)
    size = sum(len(piece) for piece in body)
    sub_id = h.get("id", topic.name)
    if version is not Version.V1_0:
        sub_id = escape_value(sub_id, version)
        name = escape_value(topic.name, version)
    else:
        name = topic.name
    head = (
        f"MESSAGE\nsubscription:{sub_id}\ndestination:{name}\nmessage-id:range-{start}\n"
        f"x-range-next:{next_offset}\nx-range-count:{len(messages)}\n"
        f"x-first-offset:{first}\nx-last-offset:{last}\n"
        f"content-type:{_CONTENT_TYPE}\ncontent-length:{size}\n\n"
    ).encode()
    return b"".join((head, *body, b"\x00"))
