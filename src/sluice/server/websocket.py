"""STOMP over WebSocket: a `StompSession`, the very one a TCP listener serves, fed by one
WebSocket instead of a socket. `WebSocketTransport` stands in for the session's asyncio
transport, so CONNECT and the login, the rules, credit, flow control, heart-beats, receipts,
transactions and errors all take the TCP connection's code paths.

Reading: each WebSocket message's bytes go to the session's `data_received` (a text message as
its UTF-8 bytes), through the same incremental parser as a socket's chunks, so a message may hold
several frames and a frame may span messages. While the session's flow control holds reading,
no message is taken from the WebSocket: its own queue (bounded by the WebSocket library) fills,
and the library stops reading the TCP connection.

Writing: what the session hands over is queued and sent, one WebSocket message per batch, by a
sender task; a batch goes out as text while the client writes text and the batch is UTF-8, as
binary otherwise. The bytes queued plus those in the TCP transport's buffer are the session's
write buffer: past `write_buffer_high_bytes` the session is paused writing, as over TCP (not
dispatched to, not read, closed as a slow consumer past `slow_consumer_timeout_s`), and resumed
once the queue is sent and the TCP buffer is back under `write_buffer_low_bytes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from typing import Any, Protocol

from sluice.errors import LimitExceeded
from sluice.server.context import CloseReason
from sluice.server.session import StompSession

__all__ = ["CloseCode", "MessageSocket", "WebSocketTransport", "serve_websocket"]

log = logging.getLogger(__name__)


class CloseCode(enum.IntEnum):
    """The WebSocket close codes the broker sends (RFC 6455, section 7.4.1)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011


_CLOSE_CODES = {
    CloseReason.CLIENT_DISCONNECT: CloseCode.NORMAL,
    CloseReason.PEER_CLOSED: CloseCode.NORMAL,
    CloseReason.SHUTDOWN: CloseCode.GOING_AWAY,
    CloseReason.PROTOCOL_ERROR: CloseCode.PROTOCOL_ERROR,
    CloseReason.INTERNAL_ERROR: CloseCode.INTERNAL_ERROR,
    CloseReason.STORE_FAILURE: CloseCode.INTERNAL_ERROR,
}


class MessageSocket(Protocol):
    """One WebSocket, as the broker uses it (the management server adapts aiohttp's to this)."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection the WebSocket runs on: its peer, its TLS, its write buffer."""
        ...

    async def receive(self) -> bytes | str | None:
        """The next message, bytes if binary and str if text; None once the WebSocket is
        closed. Raises `LimitExceeded` for a message over the size limit (the WebSocket then
        stays open for an ERROR, then `close`)."""
        ...

    async def send(self, data: bytes | str) -> None:
        """Send one message, binary for bytes and text for str; waits while the connection's
        write buffer is over its high-water mark."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame with `code` and `reason`, and close the connection."""
        ...


class WebSocketTransport(asyncio.Transport):
    """The asyncio transport a `StompSession` writes to and pauses, over a `MessageSocket`."""

    def __init__(self, socket: MessageSocket, protocol: StompSession) -> None:
        super().__init__()
        self._socket = socket
        self._protocol = protocol
        self._chunks: list[bytes] = []
        # Bytes queued and not yet sent (those being sent included).
        self._queued_bytes = 0
        self._high_bytes = 64 * 1024
        self._low_bytes = 16 * 1024
        self._writing_paused = False
        self._closing = False
        self._aborted = False
        self._reading = asyncio.Event()
        self._reading.set()
        self._wakeup = asyncio.Event()
        # Whether the client last wrote text (the broker answers in kind while it can).
        self.text = True
        # Sent when the session closes the WebSocket; None: from the session's close reason.
        self.close_code: CloseCode | None = None

    # -- what the session asks of its transport --------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The underlying connection's (`peername`, `socket`, `ssl_object`, `peercert`)."""
        transport = self._socket.transport
        return default if transport is None else transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        """Whether `close` or `abort` was called."""
        return self._closing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """The session's marks. The TCP transport under the WebSocket pauses at the low one, so
        that when a send returns its buffer is under it."""
        self._high_bytes = high if high is not None else self._high_bytes
        self._low_bytes = low if low is not None else self._high_bytes // 4
        transport = self._socket.transport
        if transport is not None:
            transport.set_write_buffer_limits(high=self._low_bytes, low=self._low_bytes // 2)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        """(low, high) as asyncio's transports answer."""
        return self._low_bytes, self._high_bytes

    def get_write_buffer_size(self) -> int:
        """Bytes queued for the WebSocket plus those in the TCP transport's buffer."""
        transport = self._socket.transport
        under = transport.get_write_buffer_size() if transport is not None else 0
        return self._queued_bytes + under

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue bytes for the peer."""
        self.writelines([bytes(data)])

    def writelines(self, list_of_data: Any) -> None:
        """Queue bytes for the peer; past the high-water mark, pause the session's writing."""
        if self._closing:
            return
        for chunk in list_of_data:
            self._chunks.append(chunk)
            self._queued_bytes += len(chunk)
        self._wakeup.set()
        if not self._writing_paused and self.get_write_buffer_size() > self._high_bytes:
            self._writing_paused = True
            self._protocol.pause_writing()

    def pause_reading(self) -> None:
        """Take no more messages from the WebSocket until `resume_reading`."""
        self._reading.clear()

    def resume_reading(self) -> None:
        """Take messages again."""
        self._reading.set()

    def is_reading(self) -> bool:
        """Whether messages are being taken."""
        return self._reading.is_set()

    def can_write_eof(self) -> bool:
        """A WebSocket has no half-close."""
        return False

    def close(self) -> None:
        """Send what is queued, then close the WebSocket."""
        if self._closing:
            return
        self._closing = True
        self._reading.set()
        self._wakeup.set()

    def abort(self) -> None:
        """Drop the connection at once, without sending what is queued (a slow consumer)."""
        self._closing = self._aborted = True
        self._chunks.clear()
        self._queued_bytes = 0
        self._reading.set()
        self._wakeup.set()
        transport = self._socket.transport
        if transport is not None:
            transport.abort()

    # -- the two loops -----------------------------------------------------------------------------

    async def receive_loop(self) -> None:
        """Feed the session each message until the WebSocket or the session closes."""
        socket, session = self._socket, self._protocol
        while not self._closing:
            if not self._reading.is_set():
                await self._reading.wait()
                continue
            try:
                message = await socket.receive()
            except LimitExceeded as exc:
                self.close_code = CloseCode.MESSAGE_TOO_BIG
                session.refuse(exc)
                return
            except (ConnectionError, RuntimeError) as exc:
                # The connection went under the WebSocket (aiohttp raises RuntimeError once the
                # WebSocket is closed).
                log.debug("WebSocket receive ended: %s", exc)
                return
            if message is None:
                return
            if isinstance(message, str):
                self.text = True
                session.data_received(message.encode("utf-8"))
            else:
                self.text = False
                session.data_received(message)

    async def send_loop(self, close_code: Callable[[], CloseCode]) -> None:
        """Send each batch as one message; once closing, send the rest and close."""
        socket = self._socket
        try:
            while not self._aborted:
                if not self._chunks:
                    if self._closing:
                        break
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                chunks, self._chunks = self._chunks, []
                data = b"".join(chunks)
                await socket.send(self._message(data))
                # (An abort meanwhile emptied the queue.)
                self._queued_bytes = max(0, self._queued_bytes - len(data))
                if self._writing_paused and not self._chunks:
                    self._writing_paused = False
                    self._protocol.resume_writing()
            if not self._aborted:
                code = close_code()
                await socket.close(code, _close_text(code, self._protocol.close_reason))
        except (ConnectionError, RuntimeError) as exc:
            # The peer went away under a send (aiohttp raises ConnectionResetError, or a
            # RuntimeError once the WebSocket is closed).
            log.debug("WebSocket send ended: %s", exc)
            self.abort()

    def _message(self, data: bytes) -> bytes | str:
        if self.text:
            with contextlib.suppress(UnicodeDecodeError):
                return data.decode("utf-8")
        return data


def _close_text(code: CloseCode, reason: CloseReason | None) -> str:
    # The STOMP ERROR frame before the close says what happened; the close frame names it.
    return reason.value if reason is not None else code.name.lower()


async def serve_websocket(socket: MessageSocket, session: StompSession) -> None:
    """Serve `session` over `socket` until either closes; then release the session. The close
    (the rest of the output, the close frame) gets `slow_consumer_timeout_s`, then the
    connection is dropped."""
    limits = session.config.limits
    transport = WebSocketTransport(socket, session)

    def close_code() -> CloseCode:
        if transport.close_code is not None:
            return transport.close_code
        reason = session.close_reason
        if reason is None:
            return CloseCode.NORMAL
        return _CLOSE_CODES.get(reason, CloseCode.POLICY_VIOLATION)

    session.connection_made(transport)
    sender = asyncio.get_running_loop().create_task(transport.send_loop(close_code))
    try:
        await transport.receive_loop()
        if transport.is_closing():
            # The session closed: its last frames (an ERROR, a RECEIPT) and the close frame.
            try:
                await asyncio.wait_for(asyncio.shield(sender), limits.slow_consumer_timeout_s)
            except TimeoutError:
                session.log.warning(
                    "WebSocket not closed within slow_consumer_timeout_s=%g; dropping it",
                    limits.slow_consumer_timeout_s,
                )
                transport.abort()
    finally:
        if not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        session.connection_lost(None)
