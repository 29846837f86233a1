"""A blocking STOMP connection for Spark: one socket and the sans-IO codec, nothing else.

Spark calls `read()` and `write()` on plain Python worker threads, one partition at a time, and the
driver-side reader makes a few calls per micro-batch. The asyncio client would add an event-loop
thread and a thread hop per message (about ten times slower here), and it does not hand out the
headers of a RECEIPT, which is how the broker reports a topic's offsets. So this module speaks
STOMP 1.2 over a blocking socket with `sluice.stomp.StompConnection`: frames out are encoded into a
buffer written in large pieces, frames in are parsed as they come.

A `WireSession` is opened inside `read()`/`write()` (never kept on an object Spark pickles) and
closed before they return. Heart-beats are off: a session is busy for its whole life, and the
socket timeout bounds every wait instead.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Mapping
from types import TracebackType

from sluice.client.address import BrokerAddress, parse_brokers
from sluice.client.tls import client_context
from sluice.errors import BrokerErrorFrame, ClientError, ProtocolError
from sluice.spark.options import TlsOptions
from sluice.stomp.connection import ConnState, Role, StompConnection
from sluice.stomp.frames import Command, Frame, HeartBeat, Version

__all__ = ["DEFAULT_TIMEOUT_S", "WireSession"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
# With several brokers, how long to wait before trying them all again: doubling from the first
# to the second.
FAILOVER_BACKOFF_MIN_S = 0.1
FAILOVER_BACKOFF_MAX_S = 1.0
# Write the output buffer once it holds this much.
_FLUSH_BYTES = 256 * 1024
_RECV_BYTES = 256 * 1024
# How long a closing session waits for the broker's DISCONNECT receipt.
_CLOSE_TIMEOUT_S = 5.0


def _wrap(context: ssl.SSLContext, sock: socket.socket, host: str) -> ssl.SSLSocket:
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


class WireSession:
    """One STOMP 1.2 connection to the first broker of a list that answers.

    `send` queues a frame; `request` sends one with a `receipt` and returns the RECEIPT frame;
    `receive` returns the next MESSAGE. MESSAGE frames that arrive while a request waits for its
    receipt are kept, in order, for `receive`. An ERROR frame raises `BrokerErrorFrame`.
    """

    def __init__(self, sock: socket.socket, conn: StompConnection, label: str) -> None:
        self._sock = sock
        self._conn = conn
        self.label = label
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._messages: deque[Frame] = deque()
        self._receipt_ids = itertools.count(1)
        self._closed = False
        # CONNECTED's `server` header: the broker's name, version and features.
        self.server = ""

    @classmethod
    def open(
        cls,
        brokers: str,
        *,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tls: TlsOptions | None = None,
    ) -> WireSession:
        """Connect to the first broker of `brokers` (`host:port[,host:port...]`) that answers,
        over TLS with `tls`.

        With several brokers (a master and its slaves), none answering is what a failover looks
        like for a few seconds: they are tried in turn again, backing off up to
        `FAILOVER_BACKOFF_MAX_S`, until `timeout_s` has passed. One broker is tried once.

        Raises `BrokerErrorFrame` if a broker refuses the CONNECT, `ClientError` if none answers.
        """
        context = None
        if tls is not None:
            context = client_context(
                ca=tls.ca, cert=tls.cert, key=tls.key, key_password=tls.key_password
            )
        addresses = parse_brokers(brokers)
        deadline = time.monotonic() + timeout_s
        backoff_s = FAILOVER_BACKOFF_MIN_S
        while True:
            failures: list[str] = []
            for address in addresses:
                session = cls._try(address, context, login, passcode, client_id, timeout_s)
                if isinstance(session, WireSession):
                    return session
                failures.append(session)
            left = deadline - time.monotonic()
            if len(addresses) == 1 or left <= 0:
                raise ClientError("no broker answered: " + "; ".join(failures))
            time.sleep(min(backoff_s, left))
            backoff_s = min(backoff_s * 2, FAILOVER_BACKOFF_MAX_S)

    @classmethod
    def _try(
        cls,
        address: BrokerAddress,
        context: ssl.SSLContext | None,
        login: str | None,
        passcode: str | None,
        client_id: str | None,
        timeout_s: float,
    ) -> WireSession | str:
        """A session with `address`, or why there is none."""
        label = str(address)
        try:
            sock = socket.create_connection((address.host, address.port), timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = _wrap(context, sock, address.host)
        except OSError as exc:
            return f"{label}: {exc.strerror or exc}"
        session = cls(sock, StompConnection(Role.CLIENT), label)
        try:
            session._handshake(login, passcode, client_id)
        except BrokerErrorFrame:
            session._drop()
            raise
        except (OSError, ClientError) as exc:
            session._drop()
            return f"{label}: {exc}"
        return session

    def _handshake(self, login: str | None, passcode: str | None, client_id: str | None) -> None:
        extra = {"client-id": client_id} if client_id else None
        host = self.label.rpartition(":")[0].strip("[]")
        data = self._conn.connect(
            host=host,
            login=login,
            passcode=passcode,
            heartbeat=(0, 0),
            versions=(Version.V1_2,),
            extra_headers=extra,
        )
        self._sock.sendall(data)
        frame = self._next_frame()
        if frame.command is not Command.CONNECTED:
            raise ClientError(f"{self.label} answered CONNECT with {frame.command}")
        self.server = frame.headers.get("server", "")

    def has_feature(self, feature: str) -> bool:
        """Does the broker name `feature` among the comments of its `server` header?"""
        _, _, comments = self.server.partition(" ")
        return feature in comments.strip("()").split()

    def __enter__(self) -> WireSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            # The broker aborts what was open (a transaction) when the connection goes.
            self._drop()

    # -- writing --------------------------------------------------------------------------------

    def send(self, command: Command, headers: dict[str, str], body: bytes = b"") -> None:
        """Queue a frame; it is written once the buffer is large or at the next `flush`."""
        try:
            data = self._conn.send(Frame(command, headers, body))
        except ProtocolError as exc:
            raise ClientError(f"cannot send {command} to {self.label}: {exc}") from None
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write every queued frame."""
        if not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._out_bytes = 0
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise ClientError(f"connection to {self.label} failed: {exc}") from None

    def request(
        self, command: Command, headers: dict[str, str], body: bytes = b""
    ) -> Mapping[str, str]:
        """Send a frame with a `receipt`, wait for the RECEIPT and return its headers."""
        receipt_id = f"r{next(self._receipt_ids)}"
        headers["receipt"] = receipt_id
        self.send(command, headers, body)
        self.flush()
        while True:
            frame = self._next_frame()
            if frame.command is Command.RECEIPT:
                if frame.headers.get("receipt-id") == receipt_id:
                    return frame.headers
                logger.debug("%s: RECEIPT for another frame ignored", self.label)
            elif frame.command is Command.MESSAGE:
                self._messages.append(frame)

    # -- reading --------------------------------------------------------------------------------

    def receive(self) -> Frame:
        """The next MESSAGE frame. Raises `TimeoutError` when none comes within the timeout."""
        if self._messages:
            return self._messages.popleft()
        while True:
            frame = self._next_frame()
            if frame.command is Command.MESSAGE:
                return frame
            logger.debug("%s: %s frame ignored while reading", self.label, frame.command)

    def take_messages(self) -> list[Frame]:
        """The MESSAGE frames that came while a request waited for its receipt."""
        frames = list(self._messages)
        self._messages.clear()
        return frames

    def set_timeout(self, timeout_s: float) -> None:
        """How long any single wait for the broker may last."""
        self._sock.settimeout(timeout_s)

    def _next_frame(self) -> Frame:
        conn = self._conn
        while True:
            try:
                event = conn.next_event()
            except ProtocolError as exc:
                raise ClientError(f"broker {self.label} broke the protocol: {exc}") from None
            if event is None:
                try:
                    data = self._sock.recv(_RECV_BYTES)
                except TimeoutError:
                    raise
                except OSError as exc:
                    raise ClientError(f"connection to {self.label} failed: {exc}") from None
                if not data:
                    conn.receive_data(b"", time.monotonic())
                    with contextlib.suppress(ProtocolError):
                        conn.next_event()
                    raise ClientError(f"connection to {self.label} closed by the broker")
                conn.receive_data(data, time.monotonic())
                continue
            if type(event) is HeartBeat:
                continue
            assert isinstance(event, Frame)
            if event.command is Command.ERROR:
                message = event.headers.get("message", "")
                raise BrokerErrorFrame(message, event.body, dict(event.headers))
            return event

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Send DISCONNECT, wait (briefly) for its receipt and close. Safe to call twice."""
        if self._closed:
            return
        try:
            if self._conn.state is ConnState.CONNECTED:
                self._sock.settimeout(_CLOSE_TIMEOUT_S)
                self.request(Command.DISCONNECT, {})
        except (OSError, ClientError) as exc:
            logger.debug("%s: DISCONNECT not confirmed: %s", self.label, exc)
        finally:
            self._drop()

    def _drop(self) -> None:
        self._closed = True
        self._messages.clear()
        with contextlib.suppress(OSError):
            self._sock.close()
