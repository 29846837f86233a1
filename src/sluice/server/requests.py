"""The requests of one connected session: the frames that follow CONNECT (SEND, SUBSCRIBE,
UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT, DISCONNECT) carried out on the core's
`BrokerConnection`, and the receipts that answer them.

Receipts go out in frame order (`ReceiptQueue`): each waits for its frame's work (a persistent
SEND's write, a receipted ACK's removal, a COMMIT) and for every receipt before it. A write the
store failed is answered with an ERROR, never a RECEIPT, and the session closes. A handler that
refuses a frame raises; the session turns the error into an ERROR and a close. The session
creates one `Requests` when CONNECT is accepted and hands it what it may use, explicitly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, ClassVar, Protocol

from sluice.auth.identity import Permission
from sluice.core.connection import BrokerConnection
from sluice.core.topic import Topic
from sluice.errors import DiskFullError, RequestError
from sluice.server.access import SessionAccess
from sluice.server.context import CloseReason
from sluice.server.hops import HopRecorder, ReadStamps, TracedReceiptQueue
from sluice.server.outbound import Outbound
from sluice.server.range_reads import is_range_read, range_block
from sluice.server.receipts import (
    PendingReceipt,
    ReceiptQueue,
    not_committed_message,
    not_stored_message,
    receipt_frame,
)
from sluice.server.record_writes import RECORDS_HEADER, send_records
from sluice.server.translate import build_message, parse_subscribe
from sluice.stomp.encoding import escape_value
from sluice.stomp.frames import Command, Frame, Version
from sluice.store.api import TimedWriteHandle

if TYPE_CHECKING:
    from sluice.store.api import WriteHandle

__all__ = ["Fail", "Requests"]


class Fail(Protocol):
    """Send an ERROR (with `receipt-id` when given) and close the session."""

    def __call__(
        self, reason: CloseReason, message: str, *, receipt_id: str | None = None
    ) -> None: ...


class Requests:
    """The frame handlers of one connected session and the receipts that answer them."""

    __slots__ = (
        "_ack_by_id",
        "_broker",
        "_close",
        "_closing",
        "_core",
        "_disconnecting",
        "_fail",
        "_guard",
        "_receipts",
        "_tracing",
        "_version",
        "access",
        "handlers",
        "outbound",
    )

    def __init__(
        self,
        core: BrokerConnection,
        *,
        access: SessionAccess,
        outbound: Outbound,
        receipts: ReceiptQueue,
        version: Version,
        fail: Fail,
        close: Callable[[CloseReason], None],
        disconnecting: Callable[[], None],
        closing: Callable[[], bool],
    ) -> None:
        self._core = core
        self._broker = core.broker
        self.access = access
        self.outbound = outbound
        self._receipts = receipts
        # The version CONNECT negotiated: how receipts are escaped and ACK/NACK name a message.
        self._version = version
        self._ack_by_id = version is Version.V1_2
        # The session's side: ERROR and close; close once DISCONNECT's receipt is out; stop
        # reading for a DISCONNECT; is it closing already?
        self._fail = fail
        self._close = close
        self._disconnecting = disconnecting
        self._closing = closing
        self._guard = access.guard
        # The handler of each command but CONNECT, bound: `handlers[frame.command](frame,
        # receipt)` carries out one frame (`receipt` is its `receipt` header), or raises
        # `RequestError`, `LimitExceeded` or `AccessDeniedError` to refuse it.
        self.handlers: dict[Command, Callable[[Frame, str | None], None]] = {
            command: MethodType(handler, self) for command, handler in self._handlers.items()
        }
        # Set by `trace_sends`.
        self._tracing: tuple[ReadStamps, TracedReceiptQueue, HopRecorder] | None = None

    def trace_sends(
        self, reads: ReadStamps, receipts: TracedReceiptQueue, recorder: HopRecorder
    ) -> None:
        """Stamp the persistent SENDs with a receipt outside a transaction along their hops
        (`hops.py`): `reads` says when their first byte was read, `receipts` (this session's
        receipt queue) hands them to the outbound with their RECEIPT."""
        self._tracing = (reads, receipts, recorder)
        self.handlers[Command.SEND] = self._on_traced_send

    # -- frame handlers -------------------------------------------------------------------------

    def _on_send(self, frame: Frame, receipt: str | None) -> None:
        if not self._guard.access.open:  # check_use's own first test, without the call
            self.access.check_use(frame.headers["destination"], Permission.WRITE)
        if RECORDS_HEADER in frame.headers:
            self._on_records(frame, receipt)
            return
        broker = self._broker
        message = build_message(frame, broker.new_message_id(), broker.now_ms())
        txid = frame.headers.get("transaction")
        if message.persistent and txid is None:
            entry = self._receipts.add(receipt, done=False)

            def stored(handle: WriteHandle | None) -> None:
                error = handle.error if handle is not None else None
                if error is not None:
                    full = isinstance(error, DiskFullError)
                    reason = CloseReason.STORE_FULL if full else CloseReason.STORE_FAILURE
                    self._receipt_failed(entry, not_stored_message(error), reason)
                    return
                entry.done = True
                self.flush_receipts()

            self._core.send(message, stored, txid)
        else:
            self._core.send(message, _ignore, txid)
            if receipt is not None:
                self.receipt(receipt)

    def _on_traced_send(self, frame: Frame, receipt: str | None) -> None:
        """`_on_send` (keep them in step), with the stamps of a persistent SEND that asks for a
        receipt outside a transaction."""
        handled_ns = time.perf_counter_ns()
        tracing = self._tracing
        assert tracing is not None
        reads, receipts, recorder = tracing
        if receipt is None or "transaction" in frame.headers or RECORDS_HEADER in frame.headers:
            self._on_send(frame, receipt)
            return
        read_ns = reads.frame_ns
        if not self._guard.access.open:
            self.access.check_use(frame.headers["destination"], Permission.WRITE)
        broker = self._broker
        message = build_message(frame, broker.new_message_id(), broker.now_ms())
        if not message.persistent:
            self._core.send(message, _ignore, None)
            self.receipt(receipt)
            return
        entry = self._receipts.add(receipt, done=False)

        def stored(handle: WriteHandle | None) -> None:
            completed_ns = time.perf_counter_ns()
            error = handle.error if handle is not None else None
            if error is not None:
                full = isinstance(error, DiskFullError)
                reason = CloseReason.STORE_FULL if full else CloseReason.STORE_FAILURE
                self._receipt_failed(entry, not_stored_message(error), reason)
                return
            if isinstance(handle, TimedWriteHandle) and handle.batch is not None:
                receipts.completed(entry, (read_ns, handled_ns, handle, completed_ns))
            else:
                recorder.untimed += 1
            entry.done = True
            self.flush_receipts()

        self._core.send(message, stored, None)

    def _on_subscribe(self, frame: Frame, receipt: str | None) -> None:
        core = self._core
        if is_range_read(frame):
            self._range_read(frame, receipt)
            return
        sub_id, destination, mode, options = parse_subscribe(frame)
        self.access.check_use(destination, Permission.READ)
        sub = core.subscribe(sub_id, destination, mode, options)
        escaped = (
            escape_value(sub_id, self._version) if self._version is not Version.V1_0 else sub_id
        )
        core.set_link_data(sub_id, escaped.encode())
        if receipt is not None:
            extra = ""
            topic = sub.destination if sub is not None else None
            if isinstance(topic, Topic):
                # Readers of a topic's log (the Spark source) learn what it keeps from the receipt.
                first, last = topic.offsets()
                extra = f"x-first-offset:{first}\nx-last-offset:{last}\n"
            self.receipt(receipt, extra)

    def _on_records(self, frame: Frame, receipt: str | None) -> None:
        """Many messages in one SEND, inside a transaction (`record_writes.py`)."""
        broker = self._broker
        send_records(self._core, frame, broker.new_message_id, broker.now_ms(), _ignore)
        if receipt is not None:
            self.receipt(receipt)

    def _range_read(self, frame: Frame, receipt: str | None) -> None:
        """A block of a topic's log in one MESSAGE (`range_reads.py`), then the receipt."""
        name = frame.headers["destination"]
        self.access.check_use(name, Permission.READ)
        topic = self._core.destination(name)
        if not isinstance(topic, Topic):
            raise RequestError(f"a range read reads a topic, not {name}")
        self.outbound.write(range_block(self._broker, topic, frame, self._version))
        if receipt is not None:
            self.receipt(receipt)

    def _on_unsubscribe(self, frame: Frame, receipt: str | None) -> None:
        core = self._core
        h = frame.headers
        sub_id = h.get("id")
        durable_name = h.get("activemq.subscriptionName")
        if sub_id is None and durable_name is None:
            sub_id = core.find_subscription_by_destination(h.get("destination", ""))
            if sub_id is None:
                raise RequestError(f"no subscription to {h.get('destination')!r}")
        sub = core.subs.get(sub_id) if sub_id is not None else None
        extra = ""
        if sub is not None and isinstance(sub.destination, Topic):
            # Where this cursor stopped: a reader of the log (the Spark source) resumes there.
            extra = f"x-next-offset:{sub.resume_offset()}\n"
        core.unsubscribe(sub_id, durable_name)
        if receipt is not None:
            self.receipt(receipt, extra)

    def _tag(self, frame: Frame) -> int:
        """The delivery tag an ACK or NACK names (by ack id in 1.2, by message id before)."""
        core = self._core
        h = frame.headers
        if not self._ack_by_id:
            tag = core.tag_for_message_id(h["message-id"], h.get("subscription"))
        else:
            ack_id = h["id"]
            try:
                tag = int(ack_id)
            except ValueError:
                raise RequestError(
                    f"no message awaiting acknowledgement with ack id {ack_id!r}"
                ) from None
        sub = core.tags.get(tag)
        if sub is not None:
            named = h.get("subscription")
            if named is not None and self._ack_by_id and named != sub.id:
                raise RequestError(
                    f"{frame.command} names subscription {named!r}, but ack id {tag} was "
                    f"delivered on subscription {sub.id!r}"
                )
            self.access.check_use(sub.destination.name, Permission.READ)
        return tag

    def _on_ack(self, frame: Frame, receipt: str | None) -> None:
        if receipt is None:
            self._core.ack(self._tag(frame), frame.headers.get("transaction"))
            return
        # A receipted ACK is answered once the acknowledgement is on disk: after the RECEIPT, a
        # crash cannot bring the message back.
        entry = self._receipts.add(receipt, done=False)

        def durable() -> None:
            entry.done = True
            self.flush_receipts()

        self._core.ack(self._tag(frame), frame.headers.get("transaction"), durable)

    def _on_nack(self, frame: Frame, receipt: str | None) -> None:
        self._core.nack(self._tag(frame), frame.headers.get("transaction"))
        if receipt is not None:
            self.receipt(receipt)

    def _on_begin(self, frame: Frame, receipt: str | None) -> None:
        self._core.begin(frame.headers["transaction"])
        if receipt is not None:
            self.receipt(receipt)

    def _on_commit(self, frame: Frame, receipt: str | None) -> None:
        # Even without a receipt of its own, later receipts wait for the COMMIT to be written.
        entry = self._receipts.add(receipt, done=False)

        def done() -> None:
            entry.done = True
            self.flush_receipts()

        def failed() -> None:
            self._receipt_failed(entry, not_committed_message(self._broker.store_failure))

        self._core.commit(frame.headers["transaction"], done, failed)

    def _on_abort(self, frame: Frame, receipt: str | None) -> None:
        self._core.abort(frame.headers["transaction"])
        if receipt is not None:
            self.receipt(receipt)

    def _on_disconnect(self, frame: Frame, receipt: str | None) -> None:
        # Stop reading; answer once every earlier persistent send is written, then close.
        self._disconnecting()
        self._receipts.add(receipt, done=True, closes=True)
        self.flush_receipts()

    _handlers: ClassVar[dict[Command, Callable[[Requests, Frame, str | None], None]]] = {
        Command.SEND: _on_send,
        Command.SUBSCRIBE: _on_subscribe,
        Command.UNSUBSCRIBE: _on_unsubscribe,
        Command.ACK: _on_ack,
        Command.NACK: _on_nack,
        Command.BEGIN: _on_begin,
        Command.COMMIT: _on_commit,
        Command.ABORT: _on_abort,
        Command.DISCONNECT: _on_disconnect,
    }

    # -- receipts -------------------------------------------------------------------------------

    def receipt(self, receipt_id: str, extra_headers: str = "") -> None:
        """Answer a frame whose work is done: at once, or behind the receipts still waiting."""
        if self._receipts:
            self._receipts.add(receipt_id, done=True, extra_headers=extra_headers)
            self.flush_receipts()
        else:
            self.outbound.write(receipt_frame(receipt_id, extra_headers, self._version))

    def _receipt_failed(
        self,
        entry: PendingReceipt,
        message: str,
        reason: CloseReason = CloseReason.STORE_FAILURE,
    ) -> None:
        """The store failed to write what `entry` waits for: the receipts before it go out, then
        an ERROR for it (never a RECEIPT), and the connection closes."""
        if self._closing():
            return
        # `entry` is not done, so this takes only the finished receipts queued before it.
        for done in self._receipts.pop_done():
            if done.receipt_id is not None:
                self.outbound.write(
                    receipt_frame(done.receipt_id, done.extra_headers, self._version)
                )
        self._fail(reason, message, receipt_id=entry.receipt_id)

    def flush_receipts(self) -> None:
        """Send the receipts that may go out now, in order; an ERROR for a refused frame's entry
        (and close); close once DISCONNECT's receipt is out."""
        disconnect = False
        for entry in self._receipts.pop_done():
            if entry.error is not None:
                self._fail(CloseReason.ACCESS_DENIED, entry.error, receipt_id=entry.receipt_id)
                return
            if entry.receipt_id is not None:
                self.outbound.write(
                    receipt_frame(entry.receipt_id, entry.extra_headers, self._version)
                )
            disconnect = disconnect or entry.closes
        if disconnect:
            self._close(CloseReason.CLIENT_DISCONNECT)


def _ignore(handle: WriteHandle | None) -> None:
    """A send nobody waits on."""
