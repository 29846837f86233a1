"""A topic's offsets as the broker reports them, and the ranges Spark reads.

Offsets are the topic's sequence numbers: every message published to a topic gets the next one,
from 1. A range is `[start, end)`: `end` is the first offset not included, so the offset a
micro-batch ends at is the one the next starts from.

The broker reports the offsets of a topic on the RECEIPT of a SUBSCRIBE to it:
`x-first-offset` is the oldest sequence it still keeps (in memory or in its store; the last
offset plus one when it keeps nothing) and `x-last-offset` the newest one a subscriber may see
(0 before the first message). `fetch_offsets` subscribes with `x-offset: latest`, so nothing is
delivered, reads the two headers and leaves.

A durable subscription (`subscription` option) tells the broker what the query still needs: its
cursor is moved by a SUBSCRIBE with `activemq.subscriptionName` and `x-offset` (the cursor then
stands just before that offset), acknowledging nothing, and an UNSUBSCRIBE without the name, which
keeps the subscription. The broker keeps every message after the cursor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.errors import ClientError
from sluice.spark.options import EARLIEST, LATEST, SourceOptions, TlsOptions
from sluice.spark.wire import DEFAULT_TIMEOUT_S, WireSession
from sluice.stomp.frames import Command

__all__ = [
    "FIRST_OFFSET_HEADER",
    "LAST_OFFSET_HEADER",
    "NEXT_OFFSET_HEADER",
    "OffsetRange",
    "TopicOffsets",
    "fetch_offsets",
    "move_cursor",
    "offsets_from_receipt",
    "open_session",
    "resolve",
    "split_range",
]

logger = logging.getLogger(__name__)

FIRST_OFFSET_HEADER = "x-first-offset"
LAST_OFFSET_HEADER = "x-last-offset"
# On the RECEIPT of an UNSUBSCRIBE: where the subscription's cursor stood (optional).
NEXT_OFFSET_HEADER = "x-next-offset"
_PROBE_ID = "sluice-spark-offsets"


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    """What a topic keeps: offsets `first` to `last` (`first == last + 1` when none)."""

    first: int
    last: int

    @property
    def end(self) -> int:
        """The offset after the last one: where a reader of everything stops."""
        return self.last + 1


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets `start` (included) to `end` (excluded) of one topic."""

    topic: str
    start: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.start)


def open_session(options: SourceOptions, *, client_id: str | None = None) -> WireSession:
    """A connection to the broker of `options`."""
    return WireSession.open(
        options.broker,
        login=options.login,
        passcode=options.passcode,
        client_id=client_id,
        tls=options.tls,
        timeout_s=options.timeout_s,
    )


def offsets_from_receipt(headers: Mapping[str, str], topic: str) -> TopicOffsets:
    """The offsets a SUBSCRIBE receipt reports; `ClientError` if the broker does not say."""
    first = headers.get(FIRST_OFFSET_HEADER)
    last = headers.get(LAST_OFFSET_HEADER)
    if first is None or last is None:
        raise ClientError(
            f"the broker did not report the offsets of {topic} (no {FIRST_OFFSET_HEADER} and "
            f"{LAST_OFFSET_HEADER} on the SUBSCRIBE receipt): it is not a Sluice broker that "
            "keeps topics as logs"
        )
    try:
        return TopicOffsets(int(first), int(last))
    except ValueError:
        raise ClientError(f"the broker reported malformed offsets for {topic}") from None


def fetch_offsets(
    broker: str,
    topic: str,
    *,
    login: str | None = None,
    passcode: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tls: TlsOptions | None = None,
) -> tuple[int, int]:
    """`(first, last)` offsets of `topic` on `broker` (see the module docstring), over TLS
    with `tls`."""
    with WireSession.open(
        broker, login=login, passcode=passcode, timeout_s=timeout_s, tls=tls
    ) as session:
        offsets = _probe(session, topic)
    return offsets.first, offsets.last


def topic_offsets(options: SourceOptions) -> TopicOffsets:
    """The offsets of the topic of `options`."""
    with open_session(options) as session:
        return _probe(session, options.topic)


def _probe(session: WireSession, topic: str) -> TopicOffsets:
    receipt = session.request(
        Command.SUBSCRIBE,
        {"destination": topic, "id": _PROBE_ID, "ack": "auto", "x-offset": LATEST},
    )
    offsets = offsets_from_receipt(receipt, topic)
    session.request(Command.UNSUBSCRIBE, {"id": _PROBE_ID})
    return offsets


def move_cursor(options: SourceOptions, offset: int) -> None:
    """Place the durable subscription of `options` just before `offset` (creating it if new).

    The consumer attached for this takes at most one message (prefetch 1, individual acks) and
    acknowledges none, so the cursor stays where it was put.
    """
    name = options.subscription
    if name is None:
        return
    with open_session(options, client_id=options.client_id) as session:
        session.request(
            Command.SUBSCRIBE,
            {
                "destination": options.topic,
                "id": _PROBE_ID,
                "ack": "client-individual",
                "activemq.prefetchSize": "1",
                "activemq.subscriptionName": name,
                "x-offset": str(max(offset, 1)),
            },
        )
        session.request(Command.UNSUBSCRIBE, {"id": _PROBE_ID})
    logger.debug("durable subscription %s of %s now before offset %d", name, options.topic, offset)


def resolve(spec: str, offsets: TopicOffsets) -> int:
    """The offset that `earliest`, `latest` or a number stands for."""
    if spec == EARLIEST:
        return offsets.first
    if spec == LATEST:
        return offsets.end
    return max(int(spec), 1)


def split_range(whole: OffsetRange, parts: int) -> list[OffsetRange]:
    """`whole` cut into at most `parts` consecutive ranges of near-equal size (none empty)."""
    count = len(whole)
    parts = max(1, min(parts, count))
    if count == 0:
        return []
    size, extra = divmod(count, parts)
    ranges = []
    start = whole.start
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        ranges.append(OffsetRange(whole.topic, start, end))
        start = end
    return ranges
