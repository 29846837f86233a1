"""Who calls, for the web console as for API clients: console logins as sessions, and the
checks against cross-site requests.

- `POST /api/session` with `{"login", "passcode"}` checks them as basic auth is checked (the
  users file, the failed-login throttle and lockout, the hash on the login threads, a refusal
  answered late). A success sets a session cookie (`HttpOnly`, `SameSite=Strict`, `Secure`
  over HTTPS, a random 256-bit value the server keeps only as a hash) and answers a CSRF token.
  `DELETE /api/session` logs out.
- A request with a basic `Authorization` header (or a verified client certificate and no
  cookie) is judged as before (`gate.authenticate`); one with the session cookie is its
  session's user, who is looked up again at each request (a reload of the users file that
  removes the user ends the session).
- A state-changing request (`POST`, `PUT`, `DELETE`, `PATCH`) made with the cookie must carry
  the session's CSRF token in `X-CSRF-Token` (a synchronizer token, compared in constant time).
  Any state-changing request that names an `Origin` must name this server's own (a browser
  always sends it; a page elsewhere cannot forge it): that covers a browser that remembers
  basic credentials too.
- Sessions are bounded (`[http] console_max_sessions`: the least recently used goes first,
  counted in `console_sessions_evicted`), end after `console_session_idle_s` unused and
  `console_session_max_s` in all.
- `GET /api/whoami` says who the caller is and what it may do: on the whole broker, and on each
  `destination` of the query (at most `MAX_WHOAMI_DESTINATIONS`), so the console offers only
  what the API would allow.
- A request marked `X-Sluice-Console` gets its 401 without a `WWW-Authenticate` challenge, so
  the browser shows the console's login form and not its own dialog.
- A server on a loopback address answers a browser's request (one with `Sec-Fetch-Site`) only
  when its `Host` is a loopback name or address: a page elsewhere whose name is made to resolve
  to 127.0.0.1 (DNS rebinding) would otherwise be of the same origin as the console.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sluice.auth.identity import Identity, Permission, Refusal
from sluice.config import HttpSettings, is_loopback
from sluice.http.context import Managed
from sluice.http.errors import ApiError, ErrorCode
from sluice.http.gate import EVERY_DESTINATION, Caller, authenticate, caller_of

__all__ = [
    "CONSOLE_HEADER",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "ConsoleAuth",
    "Sessions",
]

log = logging.getLogger(__name__)

SESSION_COOKIE = "sluice_session"
CSRF_HEADER = "X-CSRF-Token"
CONSOLE_HEADER = "X-Sluice-Console"
LOGIN_PATH = "/api/session"
MAX_WHOAMI_DESTINATIONS = 100
# A login's JSON body, and the login name and passcode in it.
MAX_LOGIN_BYTES = 4096
_UNSAFE = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Session:
    """A console login: who, its CSRF token, and when it began and was last used."""

    identity: Identity
    csrf_token: str
    address: str
    created_s: float
    used_s: float


class Sessions:
    """The sessions of console logins, by the hash of their cookie; bounded, and expiring."""

    def __init__(
        self,
        settings: HttpSettings,
        count: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = settings.console_max_sessions
        self.idle_s = settings.console_session_idle_s
        self.max_s = settings.console_session_max_s
        self._count = count
        self._clock = clock
        # Least recently used first.
        self._by_digest: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._by_digest)

    def open(self, identity: Identity, address: str) -> tuple[str, Session]:
        """A new session: its cookie value and the session."""
        now = self._clock()
        self._expire(now)
        while len(self._by_digest) >= self.max_sessions:
            _, evicted = self._by_digest.popitem(last=False)
            self._count("console_sessions_evicted")
            log.warning(
                "console: session of %s ended early: console_max_sessions (%d) reached",
                evicted.identity.user,
                self.max_sessions,
            )
        token = secrets.token_urlsafe(32)
        session = Session(identity, secrets.token_urlsafe(32), address, now, now)
        self._by_digest[_digest(token)] = session
        self._count("console_logins")
        return token, session

    def find(self, token: str) -> Session | None:
        """The live session of a cookie value (and it counts as used), or None."""
        digest = _digest(token)
        session = self._by_digest.get(digest)
        if session is None:
            return None
        now = self._clock()
        if self._expired(session, now):
            del self._by_digest[digest]
            return None
        session.used_s = now
        self._by_digest.move_to_end(digest)
        return session

    def close(self, token: str) -> bool:
        """End a session (log out); False if there was none."""
        return self._by_digest.pop(_digest(token), None) is not None

    def _expired(self, session: Session, now: float) -> bool:
        return now - session.used_s > self.idle_s or now - session.created_s > self.max_s

    def _expire(self, now: float) -> None:
        for digest in [d for d, s in self._by_digest.items() if self._expired(s, now)]:
            del self._by_digest[digest]


# The session a request came with (None: basic auth, a certificate, or anonymous).
SESSION = web.RequestKey("session", Session)


def _origin_of(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


class ConsoleAuth:
    """Authenticates every request (sessions first, then the API's own ways), and answers the
    login, logout and whoami routes."""

    def __init__(self, managed: Managed, settings: HttpSettings) -> None:
        self.managed = managed
        self.settings = settings
        self.sessions = Sessions(settings, managed.broker.count)
        self._loopback = is_loopback(settings.host)

    def is_open(self, request: web.Request) -> bool:
        """Whether a request is answered without credentials: a login."""
        return request.path == LOGIN_PATH and request.method == "POST"

    def check_host(self, request: web.Request) -> None:
        """On a loopback server, refuse a browser's request made to another name (403,
        counted)."""
        if not self._loopback or "Sec-Fetch-Site" not in request.headers:
            return
        host = request.host
        name = host[1 : host.find("]")] if host.startswith("[") else host.rpartition(":")[0]
        name = name or host
        if is_loopback(name) or name == self.settings.host:
            return
        self.managed.broker.count("http_host_refused")
        log.warning("refused a browser's %s %s to host %r", request.method, request.path, host)
        raise ApiError(
            ErrorCode.FORBIDDEN,
            "this server is on a loopback address: browsers reach it at 127.0.0.1 or localhost",
        )

    def check_origin(self, request: web.Request) -> None:
        """Refuse a state-changing request from a page of another origin (403, counted)."""
        if request.method not in _UNSAFE:
            return
        origin = request.headers.get("Origin")
        if origin is None or origin == _origin_of(request):
            return
        self.managed.broker.count("http_cross_origin_refused")
        log.warning(
            "refused a %s %s from origin %r (this server is %s)",
            request.method,
            request.path,
            origin[:200],
            _origin_of(request),
        )
        raise ApiError(ErrorCode.FORBIDDEN, "cross-origin request refused")

    async def caller(self, request: web.Request) -> Caller:
        """Who made a request: its session, or whoever its credentials name."""
        self.check_host(request)
        self.check_origin(request)
        managed = self.managed
        if "Authorization" not in request.headers:
            token = request.cookies.get(SESSION_COOKIE)
            session = self.sessions.find(token) if token else None
            if session is not None:
                identity = managed.current_identity(session.identity)
                if identity is None:
                    assert token is not None
                    self.sessions.close(token)
                else:
                    session.identity = identity
                    self._check_csrf(request, session)
                    request[SESSION] = session
                    return Caller(identity, managed.guard, managed.broker, request.remote or "-")
        try:
            return await authenticate(request, managed.guard, managed.broker)
        except ApiError as exc:
            if exc.code is ErrorCode.UNAUTHORIZED and CONSOLE_HEADER in request.headers:
                raise ApiError(exc.code, exc.message) from None
            raise

    def _check_csrf(self, request: web.Request, session: Session) -> None:
        if request.method not in _UNSAFE:
            return
        sent = request.headers.get(CSRF_HEADER, "")
        # (A header may hold bytes that are not UTF-8: compared as sent, never raised on.)
        if hmac.compare_digest(sent.encode("utf-8", "replace"), session.csrf_token.encode()):
            return
        self.managed.broker.count("http_csrf_refused")
        log.warning(
            "refused a %s %s of %s's session without its CSRF token",
            request.method,
            request.path,
            session.identity.user,
        )
        raise ApiError(ErrorCode.FORBIDDEN, f"missing or wrong {CSRF_HEADER}")

    # -- routes ---------------------------------------------------------------------------------

    async def login(self, request: web.Request) -> web.Response:
        """Check a login and passcode; on success set the session cookie."""
        self.check_host(request)
        self.check_origin(request)
        if request.content_length is not None and request.content_length > MAX_LOGIN_BYTES:
            raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"a login is at most {MAX_LOGIN_BYTES}")
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(ErrorCode.BAD_REQUEST, "the request body is not JSON") from None
        login = body.get("login") if isinstance(body, dict) else None
        passcode = body.get("passcode") if isinstance(body, dict) else None
        if not isinstance(login, str) or not isinstance(passcode, str):
            raise ApiError(ErrorCode.BAD_REQUEST, "login and passcode must be strings")
        identity = await self._check(request, login, passcode)
        token, session = self.sessions.open(identity, request.remote or "-")
        log.info("console: %s logged in from %s", identity.user, session.address)
        response = web.json_response(self._whoami(identity, session, "session", {}))
        response.set_cookie(
            SESSION_COOKIE,
            token,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
            max_age=int(self.settings.console_session_max_s),
        )
        return response

    async def _check(self, request: web.Request, login: str, passcode: str) -> Identity:
        gate = self.managed.guard
        broker = self.managed.broker
        address = request.remote or "-"
        if gate.executor is None:
            outcome = gate.authenticate(login, passcode, address, None)
        else:
            outcome = await asyncio.get_running_loop().run_in_executor(
                gate.executor, gate.authenticate, login, passcode, address, None
            )
        if isinstance(outcome, Refusal):
            broker.count(outcome.counter)
            if outcome.locks:
                broker.count("login_lockouts")
            log.warning(
                "console login refused for %r from %s: %s",
                login[:200],
                address,
                outcome.reason,
                extra={"peer": address},
            )
            await asyncio.sleep(broker.limits.login_failure_delay_s)
            raise ApiError(ErrorCode.UNAUTHORIZED, outcome.reason)
        return outcome

    async def logout(self, request: web.Request) -> web.Response:
        """End the caller's session and clear its cookie."""
        token = request.cookies.get(SESSION_COOKIE)
        ended = bool(token) and SESSION in request and self.sessions.close(token or "")
        response = web.json_response({"logged_out": ended})
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    async def whoami(self, request: web.Request) -> web.Response:
        """Who calls, how, and what they may do: on the whole broker, and on each
        `destination` of the query."""
        caller = caller_of(request)
        names = request.query.getall("destination", [])
        if len(names) > MAX_WHOAMI_DESTINATIONS:
            raise ApiError(
                ErrorCode.BAD_REQUEST, f"at most {MAX_WHOAMI_DESTINATIONS} destinations at a time"
            )
        session = request.get(SESSION)
        via = "session" if session is not None else "credentials"
        if caller.identity.anonymous:
            via = "anonymous"
        permissions = {name: _permissions(caller, (name,)) for name in names}
        return web.json_response(self._whoami(caller.identity, session, via, permissions, caller))

    def _whoami(
        self,
        identity: Identity,
        session: Session | None,
        via: str,
        destinations: dict[str, dict[str, bool]],
        caller: Caller | None = None,
    ) -> dict[str, Any]:
        if caller is None:
            managed = self.managed
            caller = Caller(identity, managed.guard, managed.broker, "-")
        return {
            "user": identity.user,
            "groups": sorted(identity.groups),
            "anonymous": identity.anonymous,
            "via": via,
            "csrf_token": session.csrf_token if session is not None else None,
            "broker": _permissions(caller, EVERY_DESTINATION),
            "destinations": destinations,
        }

    def routes(self) -> list[web.RouteDef]:
        """Login, logout, whoami."""
        return [
            web.post(LOGIN_PATH, self.login),
            web.delete(LOGIN_PATH, self.logout),
            web.get("/api/whoami", self.whoami, allow_head=False),
        ]


def _permissions(caller: Caller, names: tuple[str, ...]) -> dict[str, bool]:
    """Each permission, granted on every one of `names`."""
    return {
        permission.value: all(caller.allows(name, permission) for name in names)
        for permission in Permission
    }
