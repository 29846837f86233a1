"""A STOMP session: the asyncio protocol that joins one socket, the STOMP state machine and the
core's `BrokerConnection`.

Reading: each chunk goes to the parser, and frames are handled one at a time until the parser
needs more bytes or flow control pauses reading; frames already buffered wait in the parser.
Writing: frames for the peer go to its `Outbound`, written once per loop turn in one call, or at
once at the write buffer's high-water mark. Past the mark the transport pauses writing: the
connection is then neither dispatched to nor read (`ReadPause.OUTBOUND`) until it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, cast

from sluice.auth.identity import Identity, Permission, Refusal
from sluice.auth.tls import certificate_name
from sluice.core.broker import FlowReason
from sluice.core.connection import BrokerConnection
from sluice.core.message import Message
from sluice.core.subscription import Subscription
from sluice.core.topic import Topic
from sluice.errors import (
    AccessDeniedError,
    DiskFullError,
    FrameLimitExceeded,
    LimitExceeded,
    RemoteProtocolError,
    RequestError,
    StoreFullError,
    StoreUnavailableError,
)
from sluice.server.access import SessionAccess
from sluice.server.context import CloseReason, SessionContext
from sluice.server.flow import FlowControl, ReadPause
from sluice.server.outbound import Outbound
from sluice.server.receipts import (
    PendingReceipt,
    ReceiptQueue,
    not_committed_message,
    not_stored_message,
    receipt_frame,
)
from sluice.server.translate import (
    build_message,
    encode_common_headers,
    parse_subscribe,
)
from sluice.stomp.connection import ConnState, Role, StompConnection
from sluice.stomp.encoding import escape_value
from sluice.stomp.frames import Command, Frame, HeartBeat, Version
from sluice.stomp.negotiation import UnsupportedVersionError

if TYPE_CHECKING:
    from sluice.store.api import WriteHandle

log = logging.getLogger(__name__)


_FLOW_TO_PAUSE = {
    FlowReason.MEMORY: ReadPause.MEMORY,
    FlowReason.PENDING_WRITES: ReadPause.PENDING_WRITES,
    FlowReason.DISK: ReadPause.DISK,
}

# Bodies smaller than this are copied into the frame's buffer; larger ones are written as they are.
_COPY_BODY_BELOW = 64 * 1024


class _SessionLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{self.extra['conn']} {self.extra['peer']}] {msg}", kwargs  # type: ignore[index]


class StompSession(asyncio.Protocol):
    """One client connection."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        self.broker = context.broker
        self.config = context.config
        self.loop = context.loop
        limits = self.config.limits
        self.stomp = StompConnection(
            Role.SERVER,
            context.stomp_limits,
            grace_factor=self.config.heartbeat.grace_factor,
            limits_before_connected=context.stomp_limits_before_connected,
        )
        self.transport: asyncio.Transport | None = None
        self.core: BrokerConnection | None = None
        self.flow = FlowControl(self._pause_reading, self._resume_reading)
        self.outbound = Outbound(self.loop, limits.write_buffer_high_bytes, self._sent)
        # Receipts wait in order behind the persistent sends before them.
        self._receipts = ReceiptQueue(
            limits.max_pending_receipts_per_connection, self.flow, self.broker.count
        )
        self._timer: asyncio.TimerHandle | None = None
        self._slow_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._processing = False
        self.close_reason: CloseReason | None = None
        self.log: logging.LoggerAdapter = _SessionLog(log, {"conn": "-", "peer": "-"})  # type: ignore[type-arg]
        self._version = Version.V1_2
        self._ack_by_id = True
        self.access = SessionAccess(context.guard, self.broker)
        self.identity: Identity | None = None
        # Heart-beat grace after reading resumes: the peer's beats were waiting in our socket.
        self._resumed_at = float("-inf")
        self._read_grace_s = 1.0
        # Inbound bytes held by the parser as last reported to the broker-wide budget; when the
        # frame they belong to began (None: no partial frame); when anything was last read.
        self._held = 0
        self._frame_started: float | None = None
        self._last_received = 0.0

    # -- asyncio protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Set buffer limits and arm the CONNECT deadline."""
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = self.outbound.transport = transport = cast(asyncio.Transport, transport)
        limits = self.config.limits
        transport.set_write_buffer_limits(
            high=limits.write_buffer_high_bytes, low=limits.write_buffer_low_bytes
        )
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.log = _SessionLog(log, {"conn": id(self) % 100000, "peer": peer})
        limit = limits.max_connections
        if len(self.context.sessions) >= limit:
            self.broker.count("limit_max_connections")
            self.log.warning("refusing a connection: limit max_connections=%d reached", limit)
            self._fail(CloseReason.LIMIT, f"limit max_connections={limit} reached")
            return
        self.context.sessions.add(self)
        self._timer = self.loop.call_later(limits.connect_timeout_s, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        """Feed the parser and handle what it yields."""
        if self._closing:
            return
        now = self._last_received = self.loop.time()
        self.stomp.receive_data(data, now)
        self._process()

    def eof_received(self) -> bool:
        """The peer half-closed: treat it as a close."""
        self._shutdown(CloseReason.PEER_CLOSED)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """Release everything the connection held."""
        self._shutdown(self.close_reason or CloseReason.PEER_CLOSED)
        self.context.sessions.discard(self)

    def pause_writing(self) -> None:
        """The peer is not keeping up: stop dispatching to this connection and reading from it."""
        self.flow.writing_paused(self.loop.time())
        self.broker.count("write_paused")
        if self._slow_timer is None:
            self._slow_timer = self.loop.call_later(
                self.config.limits.slow_consumer_timeout_s, self._slow_consumer
            )

    def resume_writing(self) -> None:
        """The peer caught up: read and dispatch again."""
        self.outbound.drained()
        self.flow.writing_resumed()
        if self._slow_timer is not None:
            self._slow_timer.cancel()
            self._slow_timer = None
        if self.core is not None:
            for sub in self.core.subs.values():
                sub.destination.wakeup()

    # -- flow control ---------------------------------------------------------------------------

    def _pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._resumed_at = self.loop.time()
            if self._frame_started is not None:
                # The frame's deadline stood still while we did not read it.
                self._frame_started = self._resumed_at
            self.transport.resume_reading()
            # Frames already buffered in the parser are handled now, not at the next read.
            self.loop.call_soon(self._process)

    @property
    def writable(self) -> bool:
        """The core dispatches to this connection only while it is writable."""
        return self.flow.writable and not self._closing

    @property
    def reading_paused(self) -> bool:
        """The broker is not reading this connection (flow control)."""
        return self.flow.reading_paused

    @property
    def outbound_bytes(self) -> int:
        """Bytes queued for the peer that its socket has not taken yet."""
        return self.outbound.pending_bytes

    @property
    def pending_receipts(self) -> int:
        """Receipts waiting for their frame's work or for an earlier receipt."""
        return len(self._receipts)

    def pause_producer(self, reason: FlowReason) -> None:
        """The core asks to stop reading this producer."""
        self.flow.pause(_FLOW_TO_PAUSE[reason])

    def resume_producer(self, reason: FlowReason) -> None:
        """The core allows reading this producer again."""
        self.flow.resume(_FLOW_TO_PAUSE[reason])

    # -- the frame loop -------------------------------------------------------------------------

    def _process(self) -> None:
        if self._processing or self._closing:
            return
        self._processing = True
        stomp = self.stomp
        reasons = self.flow.reasons_held
        # A frame (or heart-beat) ended: what is left belongs to a frame begun just now.
        ended = False
        try:
            while not reasons and not self._closing:
                event = stomp.next_event()
                if event is None:
                    break
                ended = True
                if isinstance(event, HeartBeat):
                    continue
                self._handle(event)
        except RemoteProtocolError as exc:
            self.broker.count("protocol_errors")
            if isinstance(exc, FrameLimitExceeded):
                self.broker.count("limit_" + exc.limit)
            self._fail(CloseReason.PROTOCOL_ERROR, str(exc), receipt_id=exc.receipt_id)
        except Exception:
            self.log.exception("internal error while handling a frame")
            self._fail(CloseReason.INTERNAL_ERROR, "internal error")
        finally:
            self._processing = False
        if not self._closing:
            self._note_held(ended)

    def _note_held(self, ended: bool) -> None:
        """Report the parser's bytes to the broker-wide budget; start a partial frame's clock."""
        held = self.stomp.buffered_bytes
        if not held:
            self._frame_started = None
        elif ended or self._frame_started is None:
            self._frame_started = self.loop.time()
        if held != self._held:
            self._held = held
            self.context.inbound.update(self, held)

    def refuse_inbound(self, limit_bytes: int, total_bytes: int, held_bytes: int) -> None:
        """The broker holds too much of frames still arriving, and this connection the most."""
        self._held = 0
        self._fail(
            CloseReason.LIMIT,
            f"limit max_inbound_buffered_bytes={limit_bytes} exceeded: the broker holds "
            f"{total_bytes} bytes of frames still arriving, this connection {held_bytes}, "
            "the most",
        )

    def _handle(self, frame: Frame) -> None:
        command = frame.command
        if command is Command.CONNECT or command is Command.STOMP:
            self._on_connect(frame)
            return
        core = self.core
        assert core is not None
        receipt = frame.headers.get("receipt")
        try:
            handler = self._handlers[command]
            handler(self, core, frame, receipt)
        except AccessDeniedError as exc:
            self._denied(exc, receipt)
        except (RequestError, LimitExceeded) as exc:
            if isinstance(exc, StoreFullError):
                reason = CloseReason.STORE_FULL
            elif isinstance(exc, LimitExceeded):
                reason = CloseReason.LIMIT
            elif isinstance(exc, StoreUnavailableError):
                reason = CloseReason.STORE_FAILURE
            else:
                reason = CloseReason.REQUEST_ERROR
            self._fail(reason, str(exc), receipt_id=receipt, frame=frame)

    # -- CONNECT --------------------------------------------------------------------------------

    def _on_connect(self, frame: Frame) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Nothing more is read until the credentials are checked (on a worker thread when the
        # check is a password hash); frames sent behind CONNECT wait in the parser.
        self.flow.pause(ReadPause.LOGIN)
        guard = self.context.guard
        args = (
            frame.headers.get("login"),
            frame.headers.get("passcode"),
            self._peer_host(),
            self._certificate_name(),
        )
        if guard.executor is None:
            self._logged_in(frame, guard.authenticate(*args))
            return
        future = self.loop.run_in_executor(guard.executor, guard.authenticate, *args)

        def done(future: asyncio.Future[Identity | Refusal]) -> None:
            if self._closing:
                return
            try:
                outcome = future.result()
            except Exception:
                self.log.exception("internal error while checking credentials")
                self._fail(CloseReason.INTERNAL_ERROR, "internal error")
                return
            self._logged_in(frame, outcome)

        future.add_done_callback(done)

    def _peer_host(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else "-"

    def _certificate_name(self) -> str | None:
        # From the TLS handshake (a verified certificate), never from a frame.
        transport = self.transport
        return certificate_name(transport.get_extra_info("peercert")) if transport else None

    def _logged_in(self, frame: Frame, outcome: Identity | Refusal) -> None:
        receipt = frame.headers.get("receipt")
        if isinstance(outcome, Refusal):
            self.broker.count(outcome.counter)
            if outcome.locks:
                self.broker.count("login_lockouts")
            # The login name as sent (repr: it may hold anything), never the passcode.
            self.log.warning("login refused for %r: %s", frame.headers.get("login"), outcome.reason)
            # A refused login is answered late, so guessing passwords is slow.
            self._timer = self.loop.call_later(
                self.config.limits.login_failure_delay_s,
                lambda: self._fail(CloseReason.AUTH_FAILED, outcome.reason, receipt_id=receipt),
            )
            return
        try:
            self._accept(frame, outcome, receipt)
        except UnsupportedVersionError as exc:
            self.broker.count("protocol_errors")
            versions = ",".join(v.value for v in exc.supported)
            self._fail(
                CloseReason.PROTOCOL_ERROR,
                str(exc),
                receipt_id=receipt,
                headers={"version": versions},
            )
        except RemoteProtocolError as exc:  # a malformed heart-beat
            self.broker.count("protocol_errors")
            self._fail(CloseReason.PROTOCOL_ERROR, str(exc), receipt_id=receipt)

    def _accept(self, frame: Frame, identity: Identity, receipt: str | None) -> None:
        hb = self.config.heartbeat
        data = self.stomp.accept(
            frame,
            server_heartbeat=(hb.send_ms, hb.receive_ms),
            server_name=self.context.server_name,
            session=f"{self.context.broker_name}-{secrets.token_hex(16)}",
        )
        self.identity = self.access.identity = identity
        if not identity.anonymous:
            self.broker.count("logins")
            self.log.info("logged in as %s", identity.user)
        self._version = self.stomp.version
        self._ack_by_id = self._version is Version.V1_2
        self.core = BrokerConnection(self.broker, self, frame.headers.get("client-id"))
        self.broker.count("connections_accepted")
        self.outbound.write(data)
        self._arm_heartbeat()
        if receipt is not None:
            self._receipt(receipt)
        self.flow.resume(ReadPause.LOGIN)

    def _denied(self, exc: AccessDeniedError, receipt: str | None) -> None:
        """A refused frame: counted and logged; the receipts of earlier frames go out first (what
        they acknowledge is done), then the ERROR, then the connection closes."""
        self.broker.count("access_denied_" + exc.permission)
        self.log.warning(
            "access denied: user %s has no %s permission on %s",
            exc.user,
            exc.permission,
            exc.destination,
        )
        if not self._receipts:
            self._fail(CloseReason.ACCESS_DENIED, str(exc), receipt_id=receipt)
            return
        self.flow.pause(ReadPause.CLOSING)
        self._receipts.add(receipt, done=True, error=str(exc))
        self._flush_receipts()

    def revoke(self, reason: str) -> None:
        """The user may no longer connect (removed from the users file): ERROR, then close."""
        if self._closing:
            return
        self.log.warning("closing: %s", reason)
        self._fail(CloseReason.USER_REMOVED, reason)

    def update_identity(self, identity: Identity) -> None:
        """The user's groups changed (a reload): later frames are judged with the new ones."""
        self.identity = self.access.identity = identity

    # -- frame handlers -------------------------------------------------------------------------

    def _on_send(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        self.access.check_use(frame.headers["destination"], Permission.WRITE)
        message = build_message(frame, self.broker.new_message_id(), self.broker.now_ms())
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
                self._flush_receipts()

            core.send(message, stored, txid)
        else:
            core.send(message, _ignore, txid)
            if receipt is not None:
                self._receipt(receipt)

    def _on_subscribe(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
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
            self._receipt(receipt, extra)

    def _on_unsubscribe(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
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
            self._receipt(receipt, extra)

    def _tag(self, core: BrokerConnection, frame: Frame) -> int:
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

    def _on_ack(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        if receipt is None:
            core.ack(self._tag(core, frame), frame.headers.get("transaction"))
            return
        # A receipted ACK is answered once the acknowledgement is on disk: after the RECEIPT, a
        # crash cannot bring the message back.
        entry = self._receipts.add(receipt, done=False)

        def durable() -> None:
            entry.done = True
            self._flush_receipts()

        core.ack(self._tag(core, frame), frame.headers.get("transaction"), durable)

    def _on_nack(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        core.nack(self._tag(core, frame), frame.headers.get("transaction"))
        if receipt is not None:
            self._receipt(receipt)

    def _on_begin(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        core.begin(frame.headers["transaction"])
        if receipt is not None:
            self._receipt(receipt)

    def _on_commit(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        # Even without a receipt of its own, later receipts wait for the COMMIT to be written.
        entry = self._receipts.add(receipt, done=False)

        def done() -> None:
            entry.done = True
            self._flush_receipts()

        def failed() -> None:
            self._receipt_failed(entry, not_committed_message(self.broker.store_failure))

        core.commit(frame.headers["transaction"], done, failed)

    def _on_abort(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        core.abort(frame.headers["transaction"])
        if receipt is not None:
            self._receipt(receipt)

    def _on_disconnect(self, core: BrokerConnection, frame: Frame, receipt: str | None) -> None:
        self.close_reason = CloseReason.CLIENT_DISCONNECT
        # Stop reading; answer once every earlier persistent send is written, then close.
        self.flow.pause(ReadPause.CLOSING)
        self._receipts.add(receipt, done=True, closes=True)
        self._flush_receipts()

    _handlers: ClassVar[
        dict[Command, Callable[[StompSession, BrokerConnection, Frame, str | None], None]]
    ] = {
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

    def _receipt(self, receipt_id: str, extra_headers: str = "") -> None:
        if self._receipts:
            self._receipts.add(receipt_id, done=True, extra_headers=extra_headers)
            self._flush_receipts()
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
        if self._closing:
            return
        # `entry` is not done, so this takes only the finished receipts queued before it.
        for done in self._receipts.pop_done():
            if done.receipt_id is not None:
                self.outbound.write(
                    receipt_frame(done.receipt_id, done.extra_headers, self._version)
                )
        self._fail(reason, message, receipt_id=entry.receipt_id)

    def _flush_receipts(self) -> None:
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

    # -- delivery (called by the core) ----------------------------------------------------------

    def deliver(self, sub: Subscription, message: Message, tag: int, delivery_count: int) -> None:
        """Queue a MESSAGE frame."""
        version = self._version
        if version is Version.V1_0:
            common = encode_common_headers(message, version)
        elif message.wire is not None:
            common = message.wire
        else:
            common = message.wire = encode_common_headers(message, version)
        if tag and version is Version.V1_2:
            head = b"MESSAGE\nsubscription:%b\nack:%d\nx-delivery-count:%d\n" % (
                sub.link_data,
                tag,
                delivery_count,
            )
        else:
            head = b"MESSAGE\nsubscription:%b\nx-delivery-count:%d\n" % (
                sub.link_data,
                delivery_count,
            )
        outbound = self.outbound
        out = outbound.chunks
        body = message.body
        if delivery_count > 1:
            head += b"redelivered:true\n"
        if len(body) < _COPY_BODY_BELOW:
            # One buffer per frame: cheaper than three for the transport to gather.
            frame = b"".join((head, common, body, b"\x00"))
            out.append(frame)
            size = len(frame)
        else:
            head += common
            out.append(head)
            out.append(body)
            out.append(b"\x00")
            size = len(head) + len(body) + 1
        outbound.queued(size)

    # -- writing --------------------------------------------------------------------------------

    def _sent(self) -> None:
        self.stomp.data_sent(self.loop.time())

    # -- heart-beats and timers -----------------------------------------------------------------

    def _arm_heartbeat(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closing:
            return
        deadline = self.stomp.next_deadline(self.loop.time())
        if deadline is not None:
            self._timer = self.loop.call_at(deadline, self._on_heartbeat_timer)

    def _on_heartbeat_timer(self) -> None:
        self._timer = None
        now = self.loop.time()
        held = self.flow.reading_paused or now - self._resumed_at < self._read_grace_s
        if held:
            # We stopped reading this peer (flow control): its heart-beats wait in our socket.
            self.stomp.peer_held(now)
        if self.stomp.peer_timed_out(now):
            self.broker.count("heartbeat_timeouts")
            self.log.info("no data from the peer within its heart-beat interval; closing")
            self._close(CloseReason.HEARTBEAT_TIMEOUT)
            return
        if self.stomp.heartbeat_due(now):
            if not self.outbound.chunks:
                self.outbound.write(self.stomp.heartbeat())
            self.outbound.flush()
        self._arm_heartbeat()

    def check_deadlines(self, now: float) -> None:
        """Close the connection if its partial frame is older than `frame_timeout_s`, or if it
        is idle past `idle_timeout_s`: no heart-beats expected from the peer, nothing read, and
        nothing held (subscription, transaction, stream, receipt, bytes owed to it)."""
        if self._closing:
            return
        limits = self.config.limits
        started = self._frame_started
        if (
            started is not None
            and limits.frame_timeout_s
            and now - started >= limits.frame_timeout_s
            and not self.flow.reading_paused
        ):
            self.broker.count("frame_timeouts")
            self._fail(
                CloseReason.FRAME_TIMEOUT,
                f"limit frame_timeout_s={limits.frame_timeout_s:g} exceeded: a frame begun "
                f"{now - started:.1f} s ago is not complete",
            )
            return
        idle_s = now - self._last_received
        if limits.idle_timeout_s and idle_s >= limits.idle_timeout_s and self._idle():
            self.broker.count("idle_timeouts")
            self._fail(
                CloseReason.IDLE_TIMEOUT,
                f"limit idle_timeout_s={limits.idle_timeout_s:g} exceeded: nothing received "
                f"for {idle_s:.1f} s on a connection without heart-beats or subscriptions",
            )

    def _idle(self) -> bool:
        """Does the connection hold nothing that a silent peer may be waiting on?"""
        core = self.core
        negotiated = self.stomp.negotiated
        if core is None or negotiated is None or negotiated.receive_heartbeat_ms:
            # Before CONNECT the CONNECT deadline applies; with heart-beats, their own.
            return False
        return not (
            core.subs
            or core.wildcard_subs
            or core.txs
            or core.open_streams
            or self._receipts
            or self.outbound.pending_bytes
            or self.flow.reading_paused
        )

    def _connect_timeout(self) -> None:
        self._timer = None
        if self.core is None:
            self.broker.count("connect_timeouts")
            self._close(CloseReason.CONNECT_TIMEOUT)

    def _slow_consumer(self) -> None:
        self._slow_timer = None
        if not self.flow.writable:
            self.broker.count("slow_consumers_closed")
            self.log.warning(
                "slow consumer: write buffer above its high-water mark for %.1f s; closing",
                self.config.limits.slow_consumer_timeout_s,
            )
            self._close(CloseReason.SLOW_CONSUMER, abort=True)

    # -- errors and closing ---------------------------------------------------------------------

    def _fail(
        self,
        reason: CloseReason,
        message: str,
        *,
        receipt_id: str | None = None,
        frame: Frame | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send ERROR (with `receipt-id` when the failing frame asked for a receipt), then close."""
        if self._closing:
            return
        self.log.info("closing after error: %s", message)
        body = b""
        if frame is not None:
            body = f"The {frame.command} frame could not be processed.\n".encode()
        self.outbound.write(
            self.stomp.error_frame(message, receipt_id=receipt_id, body=body, headers=headers)
        )
        self._close(reason)

    def _close(self, reason: CloseReason, *, abort: bool = False) -> None:
        if self.close_reason is None or self.close_reason is CloseReason.CLIENT_DISCONNECT:
            self.close_reason = reason
        self._shutdown(reason)
        transport = self.transport
        if transport is None:
            return
        self.outbound.flush()
        if abort:
            transport.abort()
        else:
            transport.close()

    def shutdown(self) -> None:
        """The broker is stopping."""
        self._close(CloseReason.SHUTDOWN)

    def _shutdown(self, reason: CloseReason) -> None:
        if self._closing:
            return
        self._closing = True
        self.broker.count("closed_" + reason.value)
        for timer in (self._timer, self._slow_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._slow_timer = None
        # Give back what the parser holds now: the session itself may live on until the cyclic
        # garbage collector gets to it.
        held = max(self._held, self.stomp.buffered_bytes)
        self.stomp.release()
        self._frame_started = None
        if self._held:
            self._held = 0
            self.context.inbound.update(self, 0)
        self.context.trim.freed(held)
        if self.core is not None:
            self.core.close()


def _ignore(handle: WriteHandle | None) -> None:
    """A send nobody waits on."""


__all__ = ["CloseReason", "ConnState", "StompSession"]
