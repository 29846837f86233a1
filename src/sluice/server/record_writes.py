"""Records blocks: many messages in one SEND, for writers of many rows (the Spark sink).

A SEND with `x-records-block` inside a transaction carries a block (`sluice.stomp.records`)
instead of one body: each of its messages is sent to the frame's destination within the
frame's transaction, with the frame's `persistent`, `priority` and `expires` and its own headers
(its `x-dedup-id` among them), exactly as if it had come in a SEND of its own. The block saves
the writer and the broker one frame per message; duplicate detection, transactions and flow
control are those of single SENDs. Outside a transaction a block is refused: the transaction's
COMMIT receipt is what tells the writer every message is in.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.core.connection import BrokerConnection
from sluice.core.message import Message
from sluice.errors import RequestError
from sluice.server.translate import BROKER_HEADERS, build_message
from sluice.stomp.frames import Frame
from sluice.stomp.records import BlockFormatError, decode_records
from sluice.store.api import WriteHandle

__all__ = ["RECORDS_HEADER", "is_records_block", "send_records"]

RECORDS_HEADER = "x-records-block"


def is_records_block(frame: Frame) -> bool:
    """Is this SEND a records block?"""
    return RECORDS_HEADER in frame.headers


def send_records(
    core: BrokerConnection,
    frame: Frame,
    new_id: Callable[[], str],
    now_ms: int,
    on_stored: Callable[[WriteHandle | None], None],
) -> int:
    """Send every message of the block `frame` carries; return how many."""
    txid = frame.headers.get("transaction")
    if txid is None:
        raise RequestError(f"a SEND with {RECORDS_HEADER} must be inside a transaction")
    try:
        records = decode_records(frame.body)
    except BlockFormatError as exc:
        raise RequestError(f"malformed records block: {exc}") from None
    # The frame's own headers (persistent, priority, expires) apply to every message.
    template = build_message(frame, "", now_ms)
    common = {k: v for k, v in template.headers.items() if k != RECORDS_HEADER}
    for own, body in records:
        headers = own
        if not own.keys().isdisjoint(BROKER_HEADERS):
            headers = {k: v for k, v in own.items() if k not in BROKER_HEADERS}
        message = Message(
            template.destination,
            0,
            new_id(),
            now_ms,
            {**common, **headers} if common else headers,
            body,
            expires_ms=template.expires_ms,
            priority=template.priority,
            persistent=template.persistent,
        )
        core.send(message, on_stored, txid)
    return len(records)
