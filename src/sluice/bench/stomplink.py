"""One raw STOMP client connection for the load generator, on the sans-IO codec.

`StompLink` is an asyncio protocol around a `FrameParser`. It does the CONNECT handshake,
SUBSCRIBE and DISCONNECT with receipts, and otherwise leaves the hot path to its owner: the owner
writes pre-encoded bytes with `write` and gets every MESSAGE through `on_message` and every RECEIPT
it did not wait for through `on_receipt`, both with the time the bytes arrived. No high-level
client sits in between, so the generator costs the broker nothing it would not cost a real client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from sluice.client.tls import client_context
from sluice.errors import ClientError, RemoteProtocolError
from sluice.stomp import Command, Frame, FrameParser, StompLimits, Version, encode_frame

__all__ = ["BrokerTarget", "LinkError", "StompLink", "open_link"]

_WRITE_HIGH_WATER_BYTES = 1024 * 1024
_WRITE_LOW_WATER_BYTES = 256 * 1024
_ERROR_TEXT_CHARS = 200
_VERSIONS = {"1.2": Version.V1_2, "1.1": Version.V1_1}

MessageHandler = Callable[[Frame, int], None]
ReceiptHandler = Callable[[str, int], None]


class LinkError(ClientError):
    """A bench connection failed: refused, closed, timed out, or the broker sent ERROR."""


@dataclass(frozen=True)
class BrokerTarget:
    """The broker a bench connection goes to, and as whom: address, credentials, virtual host."""

    host: str
    port: int
    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    # The CONNECT `host` header: RabbitMQ reads it as the virtual host.
    host_header: str = "/"
    # TLS: on when `tls` or any file is given (`sluice.client.tls.client_context`).
    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def uses_tls(self) -> bool:
        """Whether connections to this target speak TLS."""
        return self.tls or any(f is not None for f in (self.ca, self.cert, self.key))

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client context of this target (one per process and set of files), or None."""
        if not self.uses_tls:
            return None
        return _client_context(self.ca, self.cert, self.key)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> BrokerTarget:
        """The target of a worker's spec (its `broker` object, JSON-safe)."""
        broker = spec["broker"]
        return cls(
            host=broker["host"],
            port=int(broker["port"]),
            login=broker.get("login"),
            passcode=broker.get("passcode"),
            host_header=broker.get("host_header", "/"),
            tls=bool(broker.get("tls", False)),
            ca=broker.get("ca"),
            cert=broker.get("cert"),
            key=broker.get("key"),
        )


@functools.cache
def _client_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    # Built once: loading the CA file for each connection would weigh on the handshake rate.
    return client_context(ca=ca, cert=cert, key=key)


def _ignore_message(frame: Frame, now_ns: int) -> None:
    del frame, now_ns


def _ignore_receipt(receipt_id: str, now_ns: int) -> None:
    del receipt_id, now_ns


class StompLink(asyncio.Protocol):
    """A client connection speaking STOMP 1.2 (or 1.1) with heart-beats off."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.on_message: MessageHandler = _ignore_message
        self.on_receipt: ReceiptHandler = _ignore_receipt
        # Called once when the connection ends, with the reason (None for a clean close).
        self.on_close: Callable[[str | None], None] | None = None
        self._version = Version.V1_2
        self.transport: asyncio.Transport | None = None
        self.error: str | None = None
        self.closed = False
        self._parser = FrameParser(StompLimits(), Version.V1_0)
        self._connected: asyncio.Future[Frame] | None = None
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = asyncio.get_running_loop().create_future()

    @property
    def version(self) -> Version:
        """The negotiated STOMP version (1.2 until CONNECTED says otherwise)."""
        return self._version

    @version.setter
    def version(self, version: Version) -> None:
        self._version = version
        self._parser.version = version

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport; turn Nagle off and set write-buffer limits."""
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(_WRITE_HIGH_WATER_BYTES, _WRITE_LOW_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        """Parse what arrived and hand out frames."""
        now_ns = time.monotonic_ns()
        parser = self._parser
        parser.feed(data)
        on_message = self.on_message
        message = Command.MESSAGE
        try:
            while (event := parser.next_event()) is not None:
                if type(event) is not Frame:
                    continue  # a heart-beat
                if event.command is message:
                    on_message(event, now_ns)
                else:
                    self._control_frame(event, now_ns)
                    on_message = self.on_message
        except RemoteProtocolError as exc:
            self._fail(f"protocol error from the broker: {exc}")

    def _control_frame(self, frame: Frame, now_ns: int) -> None:
        command = frame.command
        if command is Command.RECEIPT:
            receipt_id = frame.headers.get("receipt-id", "")
            waiter = self._waiters.pop(receipt_id, None)
            if waiter is None:
                self.on_receipt(receipt_id, now_ns)
            elif not waiter.done():
                waiter.set_result(None)
        elif command is Command.CONNECTED:
            if self._connected is not None and not self._connected.done():
                self._connected.set_result(frame)
        elif command is Command.ERROR:
            text = frame.headers.get("message", "") or frame.body.decode("utf-8", "replace")
            self._fail(f"broker sent ERROR: {text[:_ERROR_TEXT_CHARS]}")
        else:
            self._fail(f"unexpected {command} frame from the broker")

    def pause_writing(self) -> None:
        """The transport's buffer is above the high-water mark."""
        self._writable.clear()

    def resume_writing(self) -> None:
        """The transport's buffer drained below the low-water mark."""
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        """Wake everyone waiting on this connection."""
        if exc is not None and self.error is None:
            self.error = f"connection lost: {exc}"
        elif not self.closed and self.error is None:
            self.error = "connection closed by the broker"
        self._finish()

    # Operations

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        if self.transport is not None:
            self.transport.abort()
        self._finish()

    def _finish(self) -> None:
        first = not self._lost.done()
        reason = self.error
        exc = LinkError(f"{self.name}: {reason or 'closed'}")
        if self._connected is not None and not self._connected.done():
            self._connected.set_exception(exc)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(exc)
        self._waiters.clear()
        self._writable.set()
        if first:
            self._lost.set_result(None)
            if self.on_close is not None:
                self.on_close(reason if not self.closed else None)

    @property
    def alive(self) -> bool:
        """True until the connection has ended."""
        return not self._lost.done()

    @property
    def write_paused(self) -> bool:
        """True while the transport's write buffer is above its high-water mark."""
        return not self._writable.is_set()

    async def drain(self) -> None:
        """Wait until the write buffer is below its low-water mark; raise if the link died."""
        await self._writable.wait()
        self.check()

    def check(self) -> None:
        """Raise `LinkError` if the connection has failed."""
        if not self.alive:
            raise LinkError(f"{self.name}: {self.error or 'closed'}")

    def write(self, data: bytes) -> None:
        """Write bytes (whole frames) to the broker."""
        transport = self.transport
        if transport is None or transport.is_closing():
            self.check()
            raise LinkError(f"{self.name}: not connected")
        transport.write(data)

    def send_frame(self, command: Command, headers: Mapping[str, str], body: bytes = b"") -> None:
        """Encode and write one frame in the negotiated version."""
        self.write(encode_frame(command, headers, body, self.version))

    async def request(
        self,
        command: Command,
        headers: Mapping[str, str],
        receipt_id: str,
        timeout_s: float,
        body: bytes = b"",
    ) -> None:
        """Send a frame with a `receipt` header and wait for its RECEIPT."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[receipt_id] = waiter
        self.send_frame(command, {**headers, "receipt": receipt_id}, body)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            self._waiters.pop(receipt_id, None)
            raise LinkError(
                f"{self.name}: no RECEIPT for {command} within {timeout_s:g} s"
            ) from None

    async def handshake(self, address: BrokerTarget, timeout_s: float) -> None:
        """Send CONNECT and wait for CONNECTED (STOMP 1.2 or 1.1)."""
        headers = {"accept-version": "1.2,1.1", "host": address.host_header, "heart-beat": "0,0"}
        if address.login is not None:
            headers["login"] = address.login
        if address.passcode is not None:
            headers["passcode"] = address.passcode
        self._connected = asyncio.get_running_loop().create_future()
        self.write(encode_frame(Command.CONNECT, headers, b"", Version.V1_2))
        try:
            frame = await asyncio.wait_for(self._connected, timeout_s)
        except TimeoutError:
            raise LinkError(f"{self.name}: no CONNECTED within {timeout_s:g} s") from None
        version = _VERSIONS.get(frame.headers.get("version", "1.0"))
        if version is None:
            self._fail("the broker speaks neither STOMP 1.2 nor 1.1")
            self.check()
            return
        self.version = version

    def ack_id_header(self) -> str:
        """The MESSAGE header whose value an ACK names: `ack` in 1.2, `message-id` in 1.1."""
        return "ack" if self.version is Version.V1_2 else "message-id"

    async def disconnect(self, timeout_s: float) -> None:
        """DISCONNECT with a receipt (so every frame before it was processed), then close."""
        if self.alive and self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(LinkError):
                await self.request(Command.DISCONNECT, {}, "bye", timeout_s)
        self.close()

    def close(self) -> None:
        """Close the transport now."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended."""
        await self._lost


async def open_link(address: BrokerTarget, name: str, timeout_s: float) -> StompLink:
    """Connect over TCP and complete the STOMP handshake; raises `LinkError` or `OSError`."""
    loop = asyncio.get_running_loop()
    try:
        _, link = await asyncio.wait_for(
            loop.create_connection(
                lambda: StompLink(name), address.host, address.port, ssl=address.ssl_context()
            ),
            timeout_s,
        )
    except TimeoutError:
        raise LinkError(f"{name}: TCP connect timed out after {timeout_s:g} s") from None
    try:
        await link.handshake(address, timeout_s)
    except BaseException:
        link.close()
        raise
    return link
