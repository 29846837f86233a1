"""A STOMP session: the asyncio protocol that joins one socket (or one WebSocket, through
`websocket.WebSocketTransport`), the STOMP state machine and the core's `BrokerConnection`.

Reading: each chunk goes to the parser, and frames are handled one at a time until the parser
needs more bytes or flow control pauses reading; frames already buffered wait in the parser.
Writing: frames for the peer go to its `Outbound`, written once per loop turn in one call, or at
once at the write buffer's high-water mark. Past the mark the transport pauses writing: the
connection is then neither dispatched to nor read (`ReadPause.OUTBOUND`) until it drains.

The session itself handles deadlines and closing; CONNECT and the login are its `SessionConnect`
half (`connect.py`). Once CONNECT is accepted, the frames that follow and their receipts are its
`Requests` (`requests.py`); its heart-beat timer is a `Heartbeat` (`heartbeat.py`); MESSAGE
frames are built by `translate.append_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, cast

from sluice.auth.identity import Identity, Permission
from sluice.core.connection import BrokerConnection
from sluice.core.message import Message
from sluice.core.services import FlowReason
from sluice.core.subscription import Subscription
from sluice.core.views import ConnectionProtocol, ConnectionView
from sluice.errors import (
    AccessDeniedError,
    FrameLimitExceeded,
    LimitExceeded,
    RemoteProtocolError,
    RequestError,
    StoreFullError,
    StoreUnavailableError,
)
from sluice.server.access import SessionAccess
from sluice.server.connect import SessionConnect
from sluice.server.context import CloseReason, SessionContext
from sluice.server.flow import FlowControl, ReadPause
from sluice.server.heartbeat import Heartbeat
from sluice.server.outbound import Outbound
from sluice.server.receipts import ReceiptQueue
from sluice.server.requests import Requests
from sluice.server.translate import append_message
from sluice.stomp.connection import ConnState, Role, StompConnection
from sluice.stomp.frames import Command, Frame, HeartBeat, Version

log = logging.getLogger(__name__)

# Read for every frame, as module names: on Python 3.11 an enum member read through its class
# costs several times a global read.
_CONNECT, _STOMP = Command.CONNECT, Command.STOMP


_FLOW_TO_PAUSE = {
    FlowReason.MEMORY: ReadPause.MEMORY,
    FlowReason.PENDING_WRITES: ReadPause.PENDING_WRITES,
    FlowReason.DISK: ReadPause.DISK,
}


class _SessionLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A connection's log lines: `[id peer] ` before the message, and the connection's fields
    on the record for structured logs (`sluice.cli.logformat`)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra: Any = self.extra
        prefix = f"[{extra['conn']} {extra['peer']}] "
        peer = extra["peer"]
        kwargs["extra"] = {
            "session": extra["conn"],
            "peer": f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else None,
            "connection_id": extra.get("connection_id"),
            "user": extra.get("user"),
            "log_prefix": prefix,
        }
        return prefix + str(msg), kwargs


class StompSession(SessionConnect, asyncio.Protocol):
    """One client connection."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        self.broker = context.broker
        self.config = context.config
        self.loop = context.loop
        self.stomp = StompConnection(
            Role.SERVER,
            context.stomp_limits,
            grace_factor=self.config.heartbeat.grace_factor,
            limits_before_connected=context.stomp_limits_before_connected,
        )
        self.transport: asyncio.Transport | None = None
        self.core: BrokerConnection | None = None
        self.flow = FlowControl(self._pause_reading, self._resume_reading)
        self.outbound = self._new_outbound()
        # Receipts wait in order behind the persistent sends before them.
        self._receipts = self._new_receipt_queue()
        # The CONNECT deadline, then a refused login's delay; heart-beats have their own timer.
        self._timer: asyncio.TimerHandle | None = None
        self._slow_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._processing = False
        self.close_reason: CloseReason | None = None
        self.log: logging.LoggerAdapter = _SessionLog(log, {"conn": "-", "peer": "-"})  # type: ignore[type-arg]
        self._version = Version.V1_2
        # The frames after CONNECT, and their receipts; None until CONNECT is accepted.
        self.requests: Requests | None = None
        self.access = SessionAccess(context.guard, self.broker)
        self.identity: Identity | None = None
        # The user counted in `user_connections` while this connection is open.
        self._counted_user: str | None = None
        self.heartbeat = Heartbeat(
            self.loop,
            self.stomp,
            self.flow,
            self.outbound,
            timed_out=self._heartbeat_timeout,
            closing=lambda: self._closing,
        )
        # Inbound bytes held by the parser as last reported to the broker-wide budget; when the
        # frame they belong to began (None: no partial frame); when anything was last read.
        self._held = 0
        self._frame_started: float | None = None
        self._last_received = 0.0
        # Bytes read from the peer, and when its CONNECT was accepted (ms since the epoch).
        self.bytes_received = 0
        self.connected_at_ms = 0
        # What the connection is shown as speaking, plain and over TLS (the WebSocket pair
        # when `BrokerServer.serve_websocket` made it).
        self.protocols = (ConnectionProtocol.STOMP_TCP, ConnectionProtocol.STOMP_TLS)

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
        self.bytes_received += len(data)
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
            now = self.loop.time()
            self.heartbeat.reading_resumed(now)
            if self._frame_started is not None:
                # The frame's deadline stood still while we did not read it.
                self._frame_started = now
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
        if command is _CONNECT or command is _STOMP:
            self._on_connect(frame)
            return
        requests = self.requests
        assert requests is not None
        receipt = frame.headers.get("receipt")
        try:
            requests.handlers[command](frame, receipt)
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
        assert self.requests is not None  # only frames after CONNECT are refused this way
        self.requests.flush_receipts()

    def refuse(self, exc: LimitExceeded) -> None:
        """The transport refused what the peer sent, past a limit of its own (a WebSocket
        message over `ws_max_message_bytes`): counted, an ERROR naming it, then close."""
        self.broker.count("limit_" + exc.limit)
        self.log.warning("closing: %s", exc)
        self._fail(CloseReason.LIMIT, str(exc))

    def revoke(self, reason: str) -> None:
        """The user may no longer connect (removed from the users file): ERROR, then close."""
        if self._closing:
            return
        self.log.warning("closing: %s", reason)
        self._fail(CloseReason.USER_REMOVED, reason)

    def close_by_operator(self, reason: str) -> None:
        """An operator closes the connection (the management API): ERROR, then close."""
        if self._closing:
            return
        self.log.warning("closing: %s", reason)
        self._fail(CloseReason.OPERATOR, reason)

    def describe(self) -> ConnectionView | None:
        """What an operator sees of the connection (None before its CONNECT is accepted)."""
        core, negotiated, identity = self.core, self.stomp.negotiated, self.identity
        if core is None or negotiated is None or identity is None or self._closing:
            return None
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        tls = transport is not None and transport.get_extra_info("ssl_object") is not None
        return ConnectionView(
            id=core.id,
            address=address,
            user=identity.user,
            client_id=core.client_id,
            version=negotiated.version.value,
            heartbeat_ms=(negotiated.send_heartbeat_ms, negotiated.receive_heartbeat_ms),
            bytes_in=self.bytes_received,
            bytes_out=self.outbound.sent_bytes,
            subscriptions=len(core.subs) + len(core.wildcard_subs),
            connected_at_ms=self.connected_at_ms,
            tls=tls,
            protocol=self.protocols[1] if tls else self.protocols[0],
        )

    def update_identity(self, identity: Identity) -> None:
        """The user's groups changed (a reload): later frames are judged with the new ones."""
        self.identity = self.access.identity = identity

    def recheck_subscriptions(self) -> bool:
        """After a reload: a connection that lost `read` on a destination it subscribed to is
        refused as a frame would be (counted, logged, an ERROR naming the destination and the
        permission, then closed), so no more of its messages reach the client. Returns whether
        it was refused."""
        if self._closing or self.core is None:
            return False
        for name in self.core.subscribed_names():
            if not self.access.allows(name, Permission.READ):
                user = self.access.identity.user
                self._denied(AccessDeniedError(name, Permission.READ.value, user), None)
                return True
        return False

    # -- parts a traced session replaces (`traced.py`) ------------------------------------------

    def _new_outbound(self) -> Outbound:
        return Outbound(self.loop, self.config.limits.write_buffer_high_bytes, self._sent)

    def _new_receipt_queue(self) -> ReceiptQueue:
        limit = self.config.limits.max_pending_receipts_per_connection
        return ReceiptQueue(limit, self.flow, self.broker.count)

    # -- requests (the frames after CONNECT) ----------------------------------------------------

    def _new_core(self, client_id: str | None) -> BrokerConnection:
        """The core's side of this connection, with this session as its link."""
        return BrokerConnection(self.broker, self, client_id)

    def _new_requests(self, core: BrokerConnection) -> Requests:
        """The handlers of the frames after CONNECT, with what they may use of the session."""
        return Requests(
            core,
            access=self.access,
            outbound=self.outbound,
            receipts=self._receipts,
            version=self._version,
            fail=self._fail,
            close=self._close,
            disconnecting=self._disconnecting,
            closing=lambda: self._closing,
        )

    def _disconnecting(self) -> None:
        """DISCONNECT: read no more; the session closes once its receipt is out."""
        self.close_reason = CloseReason.CLIENT_DISCONNECT
        self.flow.pause(ReadPause.CLOSING)

    # -- delivery (called by the core) ----------------------------------------------------------

    def deliver(self, sub: Subscription, message: Message, tag: int, delivery_count: int) -> None:
        """Queue a MESSAGE frame."""
        outbound = self.outbound
        outbound.queued(
            append_message(
                outbound.chunks, sub.link_data, message, tag, delivery_count, self._version
            )
        )

    # -- writing --------------------------------------------------------------------------------

    def _sent(self) -> None:
        self.stomp.data_sent(self.loop.time())

    # -- heart-beats and timers -----------------------------------------------------------------

    def _heartbeat_timeout(self) -> None:
        self.broker.count("heartbeat_timeouts")
        self.log.info("no data from the peer within its heart-beat interval; closing")
        self._close(CloseReason.HEARTBEAT_TIMEOUT)

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
        self.heartbeat.cancel()
        # Give back what the parser holds now: the session itself may live on until the cyclic
        # garbage collector gets to it.
        held = max(self._held, self.stomp.buffered_bytes)
        self.stomp.release()
        self._frame_started = None
        if self._held:
            self._held = 0
            self.context.inbound.update(self, 0)
        self.context.trim.freed(held)
        if self._counted_user is not None:
            users = self.context.user_connections
            users[self._counted_user] -= 1
            if users[self._counted_user] <= 0:
                del users[self._counted_user]
            self._counted_user = None
        if self.core is not None:
            self.core.close()


__all__ = ["CloseReason", "ConnState", "StompSession"]
