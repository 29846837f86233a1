"""A TLS listener: it accepts connections itself and runs each TLS handshake before the
connection's protocol begins (a STOMP session on a `[[listeners]]` table with `tls`, the
management server's HTTP with `[http] tls`).

`loop.create_server(ssl=...)` would drop a failed handshake without a word (asyncio and uvloop
only log those in debug mode). Here each accepted socket is handed to
`loop.connect_accepted_socket` with the listener's context, which returns once the handshake is
done (the protocol's `connection_made` has then run) or raises. A failure (wrong CA, an expired
or missing client certificate, an old protocol version, a peer that does not speak TLS, no
handshake within the deadline) is logged as one line with the peer and OpenSSL's reason, without
a traceback, and counted (`tls_handshake_failures`; `tls_handshakes` counts the good ones). Every
failure is counted, but no more than `LOG_BURST` lines are logged in `LOG_WINDOW_S`
(`FailureLog`). Here, below `sluice.server` and `sluice.http`, so that both listen the same way.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable

from sluice.errors import reason_of

log = logging.getLogger(__name__)

__all__ = ["FailureLog", "TlsListener"]

BACKLOG = 4096
# Out of file descriptors: accept again after this, rather than spin.
_ACCEPT_RETRY_S = 0.1
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# Handshake failures logged one by one: at most LOG_BURST lines in each LOG_WINDOW_S.
LOG_WINDOW_S = 10.0
LOG_BURST = 10


def _listening_sockets(host: str, port: int) -> list[socket.socket]:
    """One socket per address `host` names (`""`: every interface), as `create_server` binds."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class TlsListener:
    """Accepts TCP connections on `host:port` and gives each, once its TLS handshake is done, to
    a session from `make_session`."""

    def __init__(
        self,
        context: ssl.SSLContext,
        make_session: Callable[[], asyncio.Protocol],
        *,
        timeout_s: float | None,
        count: Callable[[str], None],
        where: str = "",
    ) -> None:
        """`count` is called with the name of each counter to add one to; `where` (say " on
        the management server") follows the peer in the log lines."""
        self.context = context
        self.make_session = make_session
        self.timeout_s = timeout_s
        self.count = count
        self.sockets: list[socket.socket] = []
        self.port = 0
        self._accepting: list[asyncio.Task[None]] = []
        self._handshakes: set[asyncio.Task[None]] = set()
        self.failures = FailureLog(where=where)

    def listen(self, host: str, port: int) -> None:
        """Bind, listen and start accepting; `OSError` if the address cannot be had."""
        self.sockets = _listening_sockets(host, port)
        self.port = self.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self._accepting = [loop.create_task(self._accept(sock)) for sock in self.sockets]

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL):  # the socket was closed
                    return
                self.count("accept_failures")
                log.warning("cannot accept a TLS connection: %s", exc.strerror or exc)
                if exc.errno in _OUT_OF_FILES:
                    # Waiting for whatever holds the descriptors to give some back.
                    await asyncio.sleep(_ACCEPT_RETRY_S)
                continue
            task = loop.create_task(self._handshake(conn, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, peer: object) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self.make_session, conn, ssl=self.context, ssl_handshake_timeout=self.timeout_s
            )
        except (OSError, EOFError, TimeoutError, ssl.SSLError) as exc:
            conn.close()
            self.count("tls_handshake_failures")
            self.failures.warn(_peer(peer), _reason(exc))
        except BaseException:
            conn.close()
            raise
        else:
            self.count("tls_handshakes")

    def close(self) -> None:
        """Stop accepting and drop the handshakes in progress."""
        for task in [*self._accepting, *self._handshakes]:
            task.cancel()
        self._accepting = []
        for sock in self.sockets:
            sock.close()
        self.sockets = []


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "-"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no handshake within the deadline"
    return reason_of(exc)


class FailureLog:
    """Warnings about failed handshakes, at most `burst` in each `window_s`: a flood of bad
    handshakes (a scanner, a client with the wrong CA in a reconnect loop) must not fill the log.
    The lines held back are counted and summed up in one line when the window ends."""

    def __init__(
        self,
        window_s: float = LOG_WINDOW_S,
        burst: int = LOG_BURST,
        clock: Callable[[], float] = time.monotonic,
        where: str = "",
    ) -> None:
        self.window_s = window_s
        self.where = where
        self.burst = burst
        self.clock = clock
        self._window_start = clock()
        self._logged = 0
        self.held_back = 0

    def warn(self, peer: str, reason: str) -> None:
        """Log one failure, unless this window's lines are spent."""
        now = self.clock()
        if now - self._window_start >= self.window_s:
            if self.held_back:
                log.warning(
                    "%d more TLS handshake failures%s not logged in the last %.0f s "
                    "(counted in tls_handshake_failures)",
                    self.held_back,
                    self.where,
                    now - self._window_start,
                )
            self._window_start = now
            self._logged = self.held_back = 0
        if self._logged < self.burst:
            self._logged += 1
            log.warning("TLS handshake with %s%s failed: %s", peer, self.where, reason)
        else:
            self.held_back += 1
