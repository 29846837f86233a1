"""STOMP over WebSocket at `/stomp`: the upgrade, the subprotocol, the origin check and the
size bound here; the STOMP session itself is the broker's (`Managed.serve_websocket`), the very
one its TCP listeners serve.

- Subprotocols `v12.stomp`, `v11.stomp`, `v10.stomp`: the highest the client offers is echoed.
  A client that offers none is served all the same (as ActiveMQ and RabbitMQ do); one that
  offers only others is refused with 400 naming ours. The STOMP version is CONNECT's to
  negotiate, as over TCP.
- No login at the HTTP level: the CONNECT frame logs in (a browser cannot send headers with a
  WebSocket), or a verified TLS client certificate over HTTPS, as on a STOMP listener.
- Browsers send `Origin`: a page may connect from the server's own origin, or from one of
  `[http] ws_allowed_origins` (`*`: any); others get 403, so a page on another site cannot use
  a browser's network position or its client certificate. Clients that are not browsers send no
  `Origin` and are not checked.
- A message over `ws_max_message_bytes` (default: the STOMP frame limit) gets an ERROR naming the
  limit, then the close code 1009; it is counted in `limit_ws_max_message_bytes`. The bytes of
  messages received and not yet read are bounded by the WebSocket library (it stops reading the
  TCP connection past 128 KiB), the output by the session's write buffer marks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from aiohttp import WSCloseCode, WSMsgType, hdrs, web
from aiohttp.http_websocket import WebSocketError

from sluice.errors import LimitExceeded
from sluice.http.context import Serving
from sluice.http.errors import ApiError, ErrorCode

__all__ = ["STOMP_PATH", "SUBPROTOCOLS", "install_stomp", "negotiate"]

log = logging.getLogger(__name__)

STOMP_PATH = "/stomp"
# Highest first: the first the client offers, in this order, is the one echoed.
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
# The peer's close frame after ours is awaited this long (then the connection is closed).
CLOSE_TIMEOUT_S = 5.0


def negotiate(offered: list[str]) -> str | None:
    """The subprotocol to echo for the client's `Sec-WebSocket-Protocol` values: the highest
    STOMP one, or None when it offers none at all. Raises `ApiError` (400) when it offers
    only others."""
    names = {name.strip() for value in offered for name in value.split(",") if name.strip()}
    for name in SUBPROTOCOLS:
        if name in names:
            return name
    if names:
        raise ApiError(
            ErrorCode.BAD_REQUEST,
            f"no STOMP subprotocol offered ({', '.join(sorted(names))}); "
            f"this endpoint speaks {', '.join(SUBPROTOCOLS)}",
        )
    return None


def _origin_allowed(request: web.Request, allowed: tuple[str, ...]) -> bool:
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None or "*" in allowed:
        return True
    origin = origin.rstrip("/").lower()
    own = f"{request.scheme}://{request.host}".lower()
    return origin == own or origin in {entry.rstrip("/").lower() for entry in allowed}


class _StompWebSocket(web.WebSocketResponse):
    """aiohttp closes a WebSocket whose message is over the size limit at once, with 1009 and
    no reason; this one stays open (reading no further) so the session answers with an ERROR
    naming the limit first, then closes with 1009 and the reason."""

    over_size = False

    async def close(
        self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True
    ) -> bool:
        """Close, except for the library's own close of an over-size message."""
        if code == WSCloseCode.MESSAGE_TOO_BIG and not message and not self.over_size:
            self.over_size = True
            return False
        return await super().close(code=code, message=message, drain=drain)


class _Socket:
    """aiohttp's WebSocket as `StompSocket`."""

    def __init__(self, ws: _StompWebSocket, request: web.Request, max_bytes: int) -> None:
        self._ws = ws
        self._request = request
        self._max_bytes = max_bytes

    @property
    def transport(self) -> asyncio.Transport | None:
        """The HTTP connection's transport."""
        return self._request.transport

    async def receive(self) -> bytes | str | None:
        """The next text or binary message (pings are answered by aiohttp)."""
        while True:
            msg = await self._ws.receive()
            if msg.type is WSMsgType.TEXT:
                return cast(str, msg.data)
            if msg.type is WSMsgType.BINARY:
                return cast(bytes, msg.data)
            if msg.type is WSMsgType.ERROR:
                exc = msg.data
                if (
                    self._ws.over_size
                    and isinstance(exc, WebSocketError)
                    and exc.code == WSCloseCode.MESSAGE_TOO_BIG
                ):
                    raise LimitExceeded(
                        "ws_max_message_bytes", self._max_bytes, "a WebSocket message is larger"
                    )
                return None
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return None

    async def send(self, data: bytes | str) -> None:
        """One text or binary message."""
        if isinstance(data, str):
            await self._ws.send_str(data)
        else:
            await self._ws.send_bytes(data)

    async def close(self, code: int, reason: str) -> None:
        """The close frame, then the connection."""
        await self._ws.close(code=code, message=reason.encode("utf-8")[:123])


def install_stomp(app: web.Application, serving: Serving) -> None:
    """Route `/stomp` on `app`, and close its WebSockets first when the server stops."""
    managed = serving.managed

    async def stomp(request: web.Request) -> web.StreamResponse:
        config = managed.config
        if not _origin_allowed(request, config.http.ws_allowed_origins):
            managed.broker.count("websocket_origins_refused")
            raise ApiError(
                ErrorCode.FORBIDDEN,
                f"origin {request.headers.get(hdrs.ORIGIN)} may not open {STOMP_PATH}; "
                "see [http] ws_allowed_origins",
            )
        chosen = negotiate(request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, []))
        max_bytes = config.ws_max_message_bytes
        ws = _StompWebSocket(
            protocols=(chosen,) if chosen else (),
            # aiohttp refuses a message of max_msg_size bytes; ours is the largest taken.
            max_msg_size=max_bytes + 1,
            # Deflate would hide the size of what is buffered, and costs a thread per large
            # message.
            compress=False,
            # Every send waits while the TCP transport is over its mark (the session's flow
            # control relies on it).
            writer_limit=0,
            timeout=CLOSE_TIMEOUT_S,
        )
        if not ws.can_prepare(request).ok:
            raise ApiError(ErrorCode.BAD_REQUEST, f"{STOMP_PATH} takes a WebSocket upgrade only")
        await ws.prepare(request)
        managed.broker.count("websocket_connections")
        await managed.serve_websocket(_Socket(ws, request, max_bytes))
        return ws

    async def close_all(app: web.Application) -> None:
        managed.close_websockets()

    app.router.add_get(STOMP_PATH, stomp, allow_head=False)
    app.on_shutdown.append(close_all)
