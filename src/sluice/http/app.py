"""The management server: an aiohttp application on the broker's event loop, its routes, the
checks every request goes through (`_guard`: who calls, and errors as JSON), and the health
checks. The API's handlers are in `api.py`, `messages.py`, `downloads.py`, `connections.py`,
`store.py` and `definitions.py`, the metrics in `metrics.py`; the web console's files and the
security headers of every answer in `pages.py`, its logins (sessions, CSRF, Origin) in
`sessions.py`.

No thread per request: handlers run on the loop and only ask the core for values; a password
hash runs on the broker's login threads (`gate.py`).

Over HTTPS the server accepts through the STOMP listeners' `TlsListener`, not aiohttp's site:
a failed handshake is then logged (at most `LOG_BURST` lines in `LOG_WINDOW_S`) and counted in
`tls_handshake_failures` as a listener's is, and in `http_tls_handshake_failures` besides.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from sluice import __version__
from sluice.auth.handshake import TlsListener
from sluice.auth.tls import server_context
from sluice.errors import SluiceError
from sluice.http import api, connections, definitions, downloads, messages, metrics, store
from sluice.http.context import Managed
from sluice.http.errors import ApiError, ErrorCode, error_response
from sluice.http.gate import CALLER
from sluice.http.pages import ConsoleFiles, security_headers
from sluice.http.rates import RateSampler
from sluice.http.sessions import ConsoleAuth
from sluice.http.websocket import STOMP_PATH, install_stomp

__all__ = ["ManagementServer"]

log = logging.getLogger(__name__)

# Request bodies are small JSON documents; a definitions document may be larger (its handler
# reads it within this bound itself).
MAX_REQUEST_BYTES = 64 * 1024
LARGE_BODY_PATHS = {"/api/definitions": definitions.MAX_DEFINITIONS_BYTES}
# In-flight requests get this long to finish when the broker stops.
SHUTDOWN_TIMEOUT_S = 1.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Answered without credentials: probes of an orchestrator, and the API's description; STOMP
# over WebSocket logs in with its CONNECT frame.
_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/api/openapi.json", STOMP_PATH})

_TOO_LARGE = (ErrorCode.PAYLOAD_TOO_LARGE, f"request body over {MAX_REQUEST_BYTES} bytes")
_HTTP_ERRORS = {
    404: (ErrorCode.NOT_FOUND, "no such resource"),
    405: (ErrorCode.METHOD_NOT_ALLOWED, "method not allowed on this resource"),
    413: _TOO_LARGE,
}


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI 3 document (written by hand, `openapi.json` beside this module)."""
    text = resources.files("sluice.http").joinpath("openapi.json").read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    document["info"]["version"] = __version__
    return document


class ManagementServer:
    """`/api/`, `/metrics`, `/healthz` and `/readyz` on `[http]` host and port, over HTTPS with
    `[http] tls`."""

    def __init__(self, managed: Managed, *, clock: Callable[[], float] = time.time) -> None:
        self.managed = managed
        self.settings = managed.config.http
        self.started_at = clock()
        self._clock = clock
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._tls_listener: TlsListener | None = None
        self._sampler: RateSampler | None = None
        # Console logins and the cross-site checks; the console's files when it is on.
        self.auth = ConsoleAuth(managed, self.settings)
        self.console = ConsoleFiles() if self.settings.console else None
        self.app = self._build_app()

    # -- the application ------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_REQUEST_BYTES)
        app.router.add_get("/healthz", self._healthz, allow_head=False)
        app.router.add_get("/readyz", self._readyz, allow_head=False)
        app.router.add_get("/api/openapi.json", self._openapi, allow_head=False)
        app.router.add_routes(api.routes(self))
        app.router.add_routes(messages.routes(self))
        app.router.add_routes(downloads.routes(self))
        app.router.add_routes(store.routes(self))
        app.router.add_routes(definitions.routes(self))
        app.router.add_routes(connections.routes(self))
        app.router.add_routes(metrics.routes(self))
        app.router.add_routes(self.auth.routes())
        if self.console is not None:
            app.router.add_routes(self.console.routes())
        app.on_response_prepare.append(security_headers)
        install_stomp(app, self)
        return app

    def _is_open(self, request: web.Request) -> bool:
        if request.path in _OPEN_PATHS or self.auth.is_open(request):
            return True
        return self.console is not None and self.console.is_open(request)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            length = request.content_length
            limit = LARGE_BODY_PATHS.get(request.path, MAX_REQUEST_BYTES)
            if length is not None and length > limit:
                raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"request body over {limit} bytes")
            if not self._is_open(request):
                request[CALLER] = await self.auth.caller(request)
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.code, exc.message, exc.headers, exc.problems)
        except web.HTTPException as exc:
            known = _HTTP_ERRORS.get(exc.status)
            if known is None:
                raise
            return error_response(*known)
        except SluiceError as exc:
            # A refusal the core raised that a handler did not name: still the client's.
            return error_response(ErrorCode.BAD_REQUEST, str(exc))
        except Exception:
            log.exception("internal error answering %s %s", request.method, request.path)
            return error_response(ErrorCode.INTERNAL_ERROR, "internal error; see the broker log")

    @property
    def rates(self) -> RateSampler:
        """The rates of the last sampling interval."""
        assert self._sampler is not None, "the management server is not started"
        return self._sampler

    def uptime_s(self) -> float:
        """Seconds since the management server started with the broker."""
        return max(0.0, self._clock() - self.started_at)

    # -- health ---------------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        reasons = self.not_ready()
        if reasons:
            return web.json_response({"status": "not_ready", "reasons": reasons}, status=503)
        return web.json_response({"status": "ready"})

    def not_ready(self) -> list[str]:
        """Why the broker would not take a persistent SEND now (empty: it would)."""
        broker = self.managed.broker
        reasons = []
        if broker.recovery is None or broker.closed:
            reasons.append("the message store is not open")
        if broker.shutting_down:
            reasons.append("the broker is stopping")
        if broker.store_failed:
            cause = f": {broker.store_failure}" if broker.store_failure else ""
            reasons.append(f"the message store failed{cause}; persistent sends are refused")
        if broker.store.stats().unavailable:
            reasons.append(
                "the message store's database cannot be reached; persistent sends wait while "
                "the store connects again"
            )
        if broker.store_disk.full:
            reasons.append(
                f"the message store is full; persistent sends are "
                f"{'refused' if broker.store_disk.policy.value == 'error' else 'held back'}"
            )
        return reasons

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    # -- start and stop -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on `[http]` host and port. Raises `SluiceError` if that address cannot be
        had."""
        settings = self.settings
        # Built as a listener's is; a file that cannot be used stops the start (`ConfigError`).
        context = server_context(settings.tls, "[http]") if settings.tls is not None else None
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        try:
            if context is None:
                site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
                await site.start()
                self.port = int(runner.addresses[0][1])
            else:
                self.port = self._listen_tls(runner, context)
        except OSError as exc:
            await runner.cleanup()
            raise SluiceError(
                f"cannot listen for HTTP on {settings.host}:{settings.port} ([http]): "
                f"{exc.strerror or exc}; set [http] port, or enabled = false"
            ) from None
        self._runner = runner
        self._sampler = RateSampler(self.managed.broker, asyncio.get_running_loop())
        self._sampler.start()
        log.info("management API on %s", self.url)

    def _listen_tls(self, runner: web.AppRunner, context: ssl.SSLContext) -> int:
        """Accept HTTPS connections through a `TlsListener` feeding aiohttp's protocol; the
        port it got."""
        server = runner.server
        assert server is not None, "the runner is set up"
        broker = self.managed.broker

        def count(name: str) -> None:
            broker.count(name)  # the listeners' counters: every TLS handshake of the broker
            broker.count("http_" + name)

        listener = TlsListener(
            context,
            server,
            timeout_s=self.managed.config.limits.connect_timeout_s or None,
            count=count,
            where=" on the management server",
        )
        listener.listen(self.settings.host, self.settings.port)
        self._tls_listener = listener
        return listener.port

    @property
    def url(self) -> str:
        """Where the server listens: `http://HOST:PORT/`, or `https://` with `[http] tls`."""
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self.settings.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}/"

    async def stop(self) -> None:
        """Stop listening; requests in progress get `SHUTDOWN_TIMEOUT_S` to finish."""
        if self._sampler is not None:
            self._sampler.stop()
        if self._tls_listener is not None:
            self._tls_listener.close()
            self._tls_listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
