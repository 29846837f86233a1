"""One TCP connection to one broker: an asyncio protocol around a client `StompConnection`.

A `ClientLink` owns the transport and the STOMP state machine of a single connection, and nothing
that outlives it: the receipts it is waiting for, its write batch, its heart-beat timer and its
flow control. The `Connector` makes a new link for every (re)connection and is told, through
`LinkOwner`, about each MESSAGE and about the link's end.

Writes are batched: frames are appended to a list that is written once per loop turn (or at once
past `FLUSH_BYTES`), so that many small sends in a row cost one system call. When the transport
pauses writing, `drain` waits until it resumes. Reading pauses while the owner says deliveries are
blocked (a subscription's buffer is full): frames already read stay in the parser, which then holds
at most one read's worth of bytes beyond a frame, and TCP pushes back on the broker.

Heart-beats run on one `loop.call_at` timer, never a task. A broker silent for longer than its
interval times the grace factor is declared dead and the transport aborted; while reading is
paused on purpose, and for one grace period after it resumes, silence is not held against it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, cast

from sluice.client.errors import ConnectionLost, ReceiptTimeout
from sluice.config import KiB
from sluice.errors import BrokerErrorFrame, ClientError, LocalProtocolError, ProtocolError
from sluice.stomp.codec import StompLimits
from sluice.stomp.connection import ConnState, Negotiated, Role, StompConnection
from sluice.stomp.frames import Command, Frame, HeartBeat, Version

__all__ = [
    "FLUSH_BYTES",
    "WRITE_BUFFER_HIGH_BYTES",
    "WRITE_BUFFER_LOW_BYTES",
    "ClientLink",
    "LinkOwner",
]

logger = logging.getLogger(__name__)

# Write the batch at once when it grows past this, instead of at the end of the loop turn.
FLUSH_BYTES = 64 * KiB
# The transport's write buffer marks: `drain` waits above the high mark until below the low one.
WRITE_BUFFER_HIGH_BYTES = 256 * KiB
WRITE_BUFFER_LOW_BYTES = 64 * KiB
# Shortest wait between two looks at the heart-beat clock when a deadline is being ignored.
_MIN_TIMER_S = 0.01


class LinkOwner(Protocol):
    """What a link tells the client it belongs to."""

    def link_message(self, link: ClientLink, frame: Frame) -> None:
        """A MESSAGE frame arrived."""

    def link_lost(self, link: ClientLink, error: ClientError) -> None:
        """The transport is gone; `error` says why."""

    def deliveries_blocked(self) -> bool:
        """Whether a subscription buffer is full, so no more frames may be handed over now."""


def _retrieve(future: asyncio.Future[Negotiated]) -> None:
    # The handshake future may fail after its waiter gave up; mark the exception as seen.
    if not future.cancelled():
        future.exception()


class ClientLink(asyncio.Protocol):
    """One connection to one broker. Made by `loop.create_connection`; see the module docstring."""

    def __init__(
        self,
        owner: LinkOwner,
        *,
        epoch: int,
        label: str,
        limits: StompLimits,
        grace_factor: float,
    ) -> None:
        self._owner = owner
        self.epoch = epoch
        self.label = label
        self._loop = asyncio.get_running_loop()
        self._conn = StompConnection(Role.CLIENT, limits, grace_factor=grace_factor)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_sent_s = 0.0
        self._receipts: dict[str, asyncio.Future[None]] = {}
        self._receipt_counter = 0
        self._connected: asyncio.Future[Negotiated] = self._loop.create_future()
        self._connected.add_done_callback(_retrieve)
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._reading_paused = False
        self._watch_peer_from_s = 0.0
        self._processing = False
        self._eof_pending = False
        # Over TLS (to explain a connection a broker closes right after the handshake).
        self._tls = False
        self._error: ClientError | None = None

    # State seen by the client.

    @property
    def usable(self) -> bool:
        """Whether new frames may be sent: connected, and not failing or disconnecting."""
        return (
            self._transport is not None
            and self._error is None
            and self._conn.state is ConnState.CONNECTED
        )

    @property
    def version(self) -> Version:
        """The negotiated STOMP version."""
        return self._conn.version

    @property
    def negotiated(self) -> Negotiated | None:
        """Version and heart-beats agreed with the broker, once CONNECTED."""
        return self._conn.negotiated

    @property
    def error(self) -> ClientError | None:
        """Why the link failed or ended, once it has."""
        return self._error

    @property
    def lost(self) -> asyncio.Future[None]:
        """Completes when the transport is gone."""
        return self._lost

    @property
    def reading_paused(self) -> bool:
        """Whether reading from the socket is paused because deliveries are blocked."""
        return self._reading_paused

    @property
    def pending_receipts(self) -> int:
        """Frames sent with a `receipt` whose RECEIPT has not come yet."""
        return len(self._receipts)

    @property
    def write_buffer_bytes(self) -> int:
        """Bytes waiting in the batch and in the transport's buffer."""
        buffered = self._transport.get_write_buffer_size() if self._transport is not None else 0
        return self._out_bytes + buffered

    # Transport callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but have its methods.
        self._transport = transport = cast(asyncio.Transport, transport)
        self._tls = transport.get_extra_info("ssl_object") is not None
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=WRITE_BUFFER_LOW_BYTES)

    def data_received(self, data: bytes) -> None:
        try:
            self._conn.receive_data(data, self._loop.time())
        except ProtocolError as exc:
            self.abort(ConnectionLost(f"connection to {self.label} failed: {exc}"))
            return
        self._process()

    def eof_received(self) -> bool | None:
        self._conn.receive_data(b"", self._loop.time())
        self._process()
        if self._conn.state in (ConnState.CLOSED, ConnState.ERROR) or self._error is not None:
            return None
        # Frames read before the EOF wait behind a full subscription: close once they are out.
        self._eof_pending = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._conn.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._out.clear()
        self._out_bytes = 0
        if self._error is None:
            reason = f": {exc}" if exc is not None else ""
            self._error = ConnectionLost(f"connection to {self.label} lost{reason}{self._hint()}")
        error = self._error
        receipts = list(self._receipts.values())
        self._receipts.clear()
        for future in receipts:
            if not future.done():
                future.set_exception(error)
        if not self._connected.done():
            self._connected.set_exception(error)
        self._wake_drainers()
        logger.debug("%s: transport closed (%s)", self.label, error)
        try:
            self._owner.link_lost(self, error)
        finally:
            if not self._lost.done():
                self._lost.set_result(None)

    def _hint(self) -> str:
        # A TLS 1.3 broker checks our certificate after the handshake: a refusal is a close.
        if self._tls and not self._connected.done():
            return " (a TLS broker that requires a client certificate, or refuses ours)"
        return ""

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drainers()

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # Reading.

    def _process(self) -> None:
        """Hand over received frames until the parser is empty or deliveries are blocked."""
        if self._processing:
            return
        self._processing = True
        try:
            conn = self._conn
            while self._error is None:
                if conn.state is ConnState.CONNECTED and self._owner.deliveries_blocked():
                    self._pause_reading()
                    return
                try:
                    event = conn.next_event()
                except ProtocolError as exc:
                    self.abort(ConnectionLost(f"broker {self.label} broke the protocol: {exc}"))
                    return
                if event is None:
                    break
                if type(event) is HeartBeat:
                    continue
                assert isinstance(event, Frame)
                self._handle(event)
            if self._error is None:
                if self._eof_pending and conn.state is ConnState.CLOSED:
                    self.close_transport()
                else:
                    self._resume_reading()
        finally:
            self._processing = False

    def resume_deliveries(self) -> None:
        """The owner's buffers have room again: hand over what waits, then read on."""
        self._process()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()
            logger.debug("%s: reading paused, a subscription buffer is full", self.label)

    def _resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            negotiated = self._conn.negotiated
            if negotiated is not None and negotiated.receive_heartbeat_ms:
                grace_s = negotiated.receive_heartbeat_ms / 1000.0 * self._conn.grace_factor
                self._watch_peer_from_s = self._loop.time() + grace_s
            self._transport.resume_reading()
            logger.debug("%s: reading resumed", self.label)

    def _handle(self, frame: Frame) -> None:
        command = frame.command
        if command is Command.MESSAGE:
            self._owner.link_message(self, frame)
        elif command is Command.RECEIPT:
            receipt_id = frame.headers["receipt-id"]
            future = self._receipts.pop(receipt_id, None)
            if future is None:
                logger.debug("%s: RECEIPT for unknown receipt %r", self.label, receipt_id)
            elif not future.done():
                future.set_result(None)
        elif command is Command.CONNECTED:
            negotiated = self._conn.negotiated
            assert negotiated is not None
            self._arm_timer(self._loop.time())
            if not self._connected.done():
                self._connected.set_result(negotiated)
        elif command is Command.ERROR:
            self._handle_error(frame)

    def _handle_error(self, frame: Frame) -> None:
        headers = frame.headers
        message = headers.get("message", "")
        error = BrokerErrorFrame(message, frame.body, dict(headers))
        logger.warning("%s: broker sent ERROR: %s", self.label, message[:200])
        receipt_id = headers.get("receipt-id")
        target = self._receipts.pop(receipt_id, None) if receipt_id is not None else None
        if target is not None:
            # That frame failed; the others fail as lost when the broker closes the connection.
            if not target.done():
                target.set_exception(error)
            self._error = ConnectionLost(
                f"connection to {self.label} closed after an ERROR: {message[:200]}"
            )
        else:
            self._error = error
            receipts = list(self._receipts.values())
            self._receipts.clear()
            for future in receipts:
                if not future.done():
                    future.set_exception(error)
        if not self._connected.done():
            self._connected.set_exception(error)
        self.close_transport()

    # Writing.

    def start(
        self,
        *,
        host: str,
        login: str | None,
        passcode: str | None,
        heartbeat_ms: tuple[int, int],
        versions: Sequence[Version],
        extra_headers: Mapping[str, str],
    ) -> None:
        """Send CONNECT; `ConnectionLost` if the connection ended already (a TLS broker that
        refuses our certificate closes right after the handshake)."""
        if self._error is not None:
            raise self._error
        if self._transport is None or self._conn.state is not ConnState.AWAITING_CONNECT:
            raise ConnectionLost(f"connection to {self.label} closed before CONNECT{self._hint()}")
        data = self._conn.connect(
            host=host,
            login=login,
            passcode=passcode,
            heartbeat=heartbeat_ms,
            versions=versions,
            extra_headers=extra_headers,
        )
        self._write(data)
        self._flush()

    async def wait_connected(self, timeout_s: float) -> Negotiated:
        """Wait for CONNECTED. Raises `BrokerErrorFrame`, `ConnectionLost` or `ClientError`."""
        try:
            return await asyncio.wait_for(self._connected, max(timeout_s, 0.0))
        except TimeoutError:
            raise ClientError(f"no CONNECTED from {self.label} within {timeout_s:g} s") from None

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high mark."""
        while self._write_paused and self._transport is not None:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter
        if not self.usable:
            raise self._dead()

    def _dead(self) -> ClientError:
        if self._error is not None:
            return self._error
        return ConnectionLost(f"connection to {self.label} is not usable")

    def send_frame(self, frame: Frame) -> None:
        """Queue one frame for writing. Raises `ClientError` if the link is unusable."""
        if not self.usable:
            raise self._dead()
        try:
            data = self._conn.send(frame)
        except LocalProtocolError as exc:
            raise ClientError(str(exc)) from None
        self._write(data)

    def send_with_receipt(
        self, command: Command, headers: dict[str, str], body: bytes = b""
    ) -> tuple[str, asyncio.Future[None]]:
        """Queue a frame with a fresh `receipt` header; return the id and its future."""
        self._receipt_counter += 1
        receipt_id = f"r-{self._receipt_counter}"
        headers["receipt"] = receipt_id
        future: asyncio.Future[None] = self._loop.create_future()
        self.send_frame(Frame(command, headers, body))
        self._receipts[receipt_id] = future
        return receipt_id, future

    async def wait_receipt(
        self, receipt_id: str, future: asyncio.Future[None], timeout_s: float, what: str
    ) -> None:
        """Wait for the RECEIPT of `what`. Raises `ReceiptTimeout`, `BrokerErrorFrame` or
        `ConnectionLost`."""
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise ReceiptTimeout(
                f"no RECEIPT for {what} from {self.label} within {timeout_s:g} s"
            ) from None
        finally:
            if self._receipts.get(receipt_id) is future:
                del self._receipts[receipt_id]

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._out or self._transport is None:
            return
        out = self._out
        self._out = []
        self._out_bytes = 0
        self._transport.write(out[0] if len(out) == 1 else b"".join(out))
        now = self._loop.time()
        self._last_sent_s = now
        self._conn.data_sent(now)

    async def disconnect(self, timeout_s: float) -> None:
        """Send DISCONNECT with a receipt and wait for it."""
        receipt_id, future = self.send_with_receipt(Command.DISCONNECT, {})
        self._flush()
        # No longer CONNECTED, so nothing holds deliveries back: read on until the RECEIPT.
        self._process()
        await self.wait_receipt(receipt_id, future, timeout_s, "DISCONNECT")

    def close_transport(self) -> None:
        """Write what is batched, then close the transport."""
        self._flush()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self, error: ClientError) -> None:
        """Drop the connection at once, recording `error` as the reason."""
        if self._error is None:
            self._error = error
        if self._transport is not None:
            self._transport.abort()

    async def close(self, timeout_s: float) -> None:
        """Close the transport and wait (bounded) until it is gone."""
        self.close_transport()
        if self._transport is None and not self._lost.done():
            # Never connected: there is nothing to wait for.
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), timeout_s)
        except TimeoutError:
            self.abort(ConnectionLost(f"connection to {self.label} closed"))
            try:
                await asyncio.wait_for(asyncio.shield(self._lost), timeout_s)
            except TimeoutError:
                logger.warning("%s: transport did not close within %g s", self.label, timeout_s)

    # Heart-beats.

    def _arm_timer(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._conn.next_deadline(now)
        if deadline is None:
            return
        if deadline <= now:
            deadline = self._deadline_while_ignoring_peer(now)
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _deadline_while_ignoring_peer(self, now: float) -> float:
        # The peer's deadline has passed but is not enforced now: wake for our own heart-beat or
        # for the end of the grace period, whichever comes first.
        negotiated = self._conn.negotiated
        assert negotiated is not None
        candidates = []
        if negotiated.send_heartbeat_ms:
            candidates.append(self._last_sent_s + negotiated.send_heartbeat_ms / 1000.0)
        if not self._reading_paused:
            candidates.append(self._watch_peer_from_s)
        elif negotiated.receive_heartbeat_ms:
            candidates.append(now + negotiated.receive_heartbeat_ms / 1000.0)
        future = [c for c in candidates if c > now]
        return min(future) if future else now + _MIN_TIMER_S

    def _on_timer(self) -> None:
        self._timer = None
        conn = self._conn
        if self._transport is None or conn.state not in (
            ConnState.CONNECTED,
            ConnState.DISCONNECTING,
        ):
            return
        now = self._loop.time()
        if conn.heartbeat_due(now):
            self._write(conn.heartbeat())
            self._flush()
        if conn.peer_timed_out(now) and not self._reading_paused and now >= self._watch_peer_from_s:
            negotiated = conn.negotiated
            interval_ms = negotiated.receive_heartbeat_ms if negotiated is not None else 0
            logger.warning(
                "%s: no data or heart-beat from the broker within %d ms x %.1f; dropping it",
                self.label,
                interval_ms,
                conn.grace_factor,
            )
            self.abort(
                ConnectionLost(
                    f"broker {self.label} sent no heart-beat within "
                    f"{interval_ms * conn.grace_factor:g} ms"
                )
            )
            return
        self._arm_timer(now)
