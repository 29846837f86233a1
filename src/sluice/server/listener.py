"""The broker server: recovers the stores it is given, checks who connects (the users file and
the `[[acl]]` rules, reloaded on demand), listens for STOMP connections on each listener (plain
TCP or TLS), serves those the management server accepts over WebSocket, and shuts down
cleanly."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sluice import __version__
from sluice.auth.acl import AccessControl
from sluice.auth.handshake import TlsListener
from sluice.auth.identity import Identity
from sluice.auth.login import Authenticator as UsersAuthenticator
from sluice.auth.tls import server_context
from sluice.auth.users import UsersFile, load_users
from sluice.config import Config, Listener
from sluice.core.broker import Broker
from sluice.core.views import ConnectionProtocol, ConnectionView
from sluice.server.context import Authenticator, Guard, LiveSession, SessionContext
from sluice.server.hops import HopRecorder
from sluice.server.inbound import InboundBudget, MemoryTrim
from sluice.server.session import StompSession
from sluice.server.traced import TracedStompSession
from sluice.server.websocket import MessageSocket, serve_websocket
from sluice.stomp.codec import StompLimits
from sluice.stomp.records import BLOCK_FEATURES
from sluice.store.api import MessageStore

log = logging.getLogger(__name__)

# Passwords are hashed on this many threads at most (scrypt takes tens of MiB and ms each).
LOGIN_THREADS = 2


@dataclass
class BoundListener:
    """A listener of the configuration, its TLS context, and the port it got."""

    listener: Listener
    tls: ssl.SSLContext | None
    port: int = 0
    server: asyncio.base_events.Server | None = None
    tls_listener: TlsListener | None = None

    def __str__(self) -> str:
        host = self.listener.host
        address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        return f"{address} (tls)" if self.tls is not None else address


def _bind_listeners(config: Config) -> list[BoundListener]:
    """Each listener with its TLS context, built now so that a bad file stops the start."""
    bound = []
    for number, listener in enumerate(config.stomp_listeners, 1):
        context = None
        if listener.tls is not None:
            context = server_context(listener.tls, f"[[listeners]] {number} ({listener})")
        bound.append(BoundListener(listener, context))
    return bound


def _users(config: Config) -> UsersFile | None:
    path = config.auth.users_file
    return load_users(path) if path is not None else None


class BrokerServer:
    """A broker and its STOMP listener on one event loop."""

    def __init__(
        self,
        config: Config,
        store: MessageStore,
        *,
        temp_store: MessageStore | None = None,
        authenticate: Authenticator | None = None,
        now_ms: Callable[[], int] | None = None,
        login_clock: Callable[[], float] | None = None,
    ) -> None:
        """`store` and `temp_store` come from `stores.open_stores` (or a test); `authenticate`
        replaces the check of CONNECT's credentials against `[auth] users_file`; `now_ms` is the
        broker's wall clock in milliseconds and `login_clock` the monotonic clock of failed-login
        lockouts (the system's unless a test gives its own). Raises `ConfigError` if the users
        file cannot be used (unreadable, invalid, or open to group or others), or a TLS
        listener's certificate, key or CA."""
        self.config = config
        self.version = __version__
        self.loop = asyncio.get_running_loop()
        self.broker = Broker(config, store, self.loop, temp_store=temp_store, now_ms=now_ms)
        limits = config.limits
        self.listeners = _bind_listeners(config)
        users = _users(config)
        self.authenticator = UsersAuthenticator(
            users,
            allow_anonymous=config.auth.allow_anonymous,
            limits=limits,
            clock=login_clock or time.monotonic,
        )
        self.guard = Guard(
            authenticate=authenticate or self.authenticator, access=AccessControl(config.acl)
        )
        if authenticate is None and users is not None:
            self.guard.executor = self._login_executor()
        self.sessions: set[LiveSession] = set()
        context = SessionContext(
            broker=self.broker,
            config=config,
            loop=self.loop,
            stomp_limits=StompLimits(
                max_frame_bytes=limits.max_frame_bytes,
                max_header_bytes=limits.max_header_bytes,
                max_headers=limits.max_headers,
            ),
            server_name=f"sluice/{__version__} {BLOCK_FEATURES}",
            broker_name=config.broker_name,
            sessions=self.sessions,
            guard=self.guard,
            inbound=InboundBudget(limits.max_inbound_buffered_bytes, self.broker.count),
            trim=MemoryTrim(self.loop.call_later, self.broker.count),
            stomp_limits_before_connected=StompLimits(
                max_frame_bytes=limits.max_frame_bytes_unauthenticated,
                max_header_bytes=min(
                    limits.max_header_bytes, limits.max_frame_bytes_unauthenticated
                ),
                max_headers=limits.max_headers,
                frame_limit_name="max_frame_bytes_unauthenticated",
            ),
        )
        self.broker.memory_freed = context.trim.freed
        self.context = context
        # The first listener's port (the one `[stomp]` or the first `[[listeners]]` gives).
        self.port = 0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_interval_s = _deadline_interval_s(config)
        # Per-hop latency of persistent sends (`[latency] hops`); None when off.
        self.latency: HopRecorder | None = None
        if config.latency.hops:
            self.latency = HopRecorder()
            self.broker.snapshot_sources.append(self.latency.snapshot)

    @staticmethod
    def _login_executor() -> ThreadPoolExecutor:
        return ThreadPoolExecutor(LOGIN_THREADS, thread_name_prefix="sluice-login")

    def reload_auth(self, config: Config) -> None:
        """Read the users file and take the `[[acl]]` rules of `config` (SIGHUP). Connections
        stay up, except those of users no longer in the file (and anonymous ones, if anonymous
        access is no longer allowed) and those subscribed to a destination their user may no
        longer read, which are closed; the others keep their user with its new groups. Raises
        `ConfigError` (and changes nothing) if the users file is unusable."""
        users = _users(config)
        allow_anonymous = config.auth.allow_anonymous
        guard = self.guard
        self.authenticator.replace_users(users, allow_anonymous)
        guard.access = AccessControl(config.acl)
        if (
            users is not None
            and guard.executor is None
            and guard.authenticate is self.authenticator
        ):
            guard.executor = self._login_executor()
        self.broker.count("auth_reloads")
        closed = 0
        for session in list(self.sessions):
            identity = session.identity
            if identity is None:
                continue
            if identity.anonymous:
                if users is not None and not allow_anonymous:
                    session.revoke("anonymous access is no longer allowed")
                    closed += 1
                continue
            user = users.get(identity.user) if users is not None else None
            if user is None:
                session.revoke(f"user {identity.user} was removed")
                closed += 1
            elif user.identity != identity:
                session.update_identity(user.identity)
        # Rules may have taken `read` away from subscriptions that are still delivering.
        for session in list(self.sessions):
            if session.identity is not None and session.recheck_subscriptions():
                closed += 1
        log.info(
            "reloaded the users file (%s users) and %d access rules; closed %d connections",
            len(users) if users is not None else "no",
            len(config.acl),
            closed,
        )

    def connection_views(self) -> list[ConnectionView]:
        """Every connection that has logged in, as an operator sees it."""
        views = (session.describe() for session in self.sessions)
        return sorted((view for view in views if view is not None), key=lambda v: v.id)

    def close_connection(self, connection_id: int, reason: str) -> bool:
        """Close a logged-in connection with an ERROR saying `reason`; False if there is none."""
        for session in list(self.sessions):
            view = session.describe()
            if view is not None and view.id == connection_id:
                session.close_by_operator(reason)
                return True
        return False

    def current_identity(self, identity: Identity) -> Identity | None:
        """Who a user logged in earlier (a console session) is now, after any reload of the
        users file: None once the user was removed, or anonymous access is no longer allowed.
        With an authenticator of its own (not the users file) the identity stands."""
        if self.guard.authenticate is not self.authenticator:
            return identity
        users = self.authenticator.users
        if identity.anonymous:
            allowed = users is None or self.authenticator.allow_anonymous
            return identity if allowed else None
        user = users.get(identity.user) if users is not None else None
        return user.identity if user is not None else None

    def _new_session(self) -> StompSession:
        if self.latency is not None:
            return TracedStompSession(self.context, self.latency)
        return StompSession(self.context)

    async def serve_websocket(self, socket: MessageSocket) -> None:
        """Serve STOMP over a WebSocket the management server accepted (`/stomp`): a session
        as a listener's connections get, counted and limited with them, shown as `stomp-ws`
        (`stomp-wss` over HTTPS). Returns once the WebSocket is closed."""
        session = self._new_session()
        session.protocols = (ConnectionProtocol.STOMP_WS, ConnectionProtocol.STOMP_WSS)
        await serve_websocket(socket, session)

    def close_websockets(self) -> None:
        """Close every STOMP-over-WebSocket connection as at a stop (the management server
        stops first)."""
        for session in list(self.sessions):
            if isinstance(session, StompSession) and session.protocols[0] is (
                ConnectionProtocol.STOMP_WS
            ):
                session.shutdown()

    def report_latency(self) -> None:
        """Log the per-hop latency of persistent sends so far, and write it to
        `[latency] hops_file` when given (at stop, and on SIGUSR1)."""
        if self.latency is None:
            return
        self.latency.log_report()
        path = self.config.latency.hops_file
        if path is not None:
            self.latency.write(path)

    async def _listen(self, bound: BoundListener) -> None:
        host, port = bound.listener.host, bound.listener.port
        if bound.tls is None:
            bound.server = await self.loop.create_server(
                self._new_session, host, port, reuse_address=True, backlog=4096
            )
            bound.port = bound.server.sockets[0].getsockname()[1]
            return
        # The handshake has the CONNECT deadline: a peer that never finishes it is dropped.
        bound.tls_listener = TlsListener(
            bound.tls,
            self._new_session,
            timeout_s=self.config.limits.connect_timeout_s or None,
            count=self.broker.count,
        )
        bound.tls_listener.listen(host, port)
        bound.port = bound.tls_listener.port

    async def start(self) -> None:
        """Recover the store and start listening on every listener."""
        recovery = self.broker.open()
        for line in recovery.report:
            log.warning("store recovery: %s", line)
        try:
            for bound in self.listeners:
                await self._listen(bound)
        except BaseException:
            self._close_listeners()
            raise
        self.port = self.listeners[0].port
        if self._deadline_interval_s:
            self._deadline_timer = self.loop.call_later(
                self._deadline_interval_s, self._check_deadlines
            )
        log.info(
            "sluice %s listening for STOMP on %s (store: %s)",
            self.version,
            ", ".join(str(bound) for bound in self.listeners),
            self.config.store.kind.value,
        )
        if self.latency is not None:
            log.info(
                "timing the hops of every persistent SEND with a receipt; reported at stop "
                "and on SIGUSR1%s",
                f" (JSON in {self.config.latency.hops_file})"
                if self.config.latency.hops_file is not None
                else "",
            )

    def _close_listeners(self) -> None:
        for bound in self.listeners:
            if bound.server is not None:
                bound.server.close()
            if bound.tls_listener is not None:
                bound.tls_listener.close()

    def _check_deadlines(self) -> None:
        """Frames past `frame_timeout_s`, idle connections past `idle_timeout_s`: one sweep of
        every session, rather than a timer per frame."""
        now = self.loop.time()
        for session in list(self.sessions):
            session.check_deadlines(now)
        self._deadline_timer = self.loop.call_later(
            self._deadline_interval_s, self._check_deadlines
        )

    async def stop(self) -> None:
        """Stop listening, close every session, then close the store."""
        self._close_listeners()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self.broker.shutting_down = True
        for session in list(self.sessions):
            session.shutdown()
        for bound in self.listeners:
            if bound.server is not None:
                await bound.server.wait_closed()
                bound.server = None
        # Let the transports flush what they hold and run connection_lost.
        await asyncio.sleep(0)
        self.broker.close()
        if self.guard.executor is not None:
            self.guard.executor.shutdown(wait=False, cancel_futures=True)
        stats = self.broker.snapshot()
        names = ("store_full_episodes", "temp_full_episodes", "store_no_space_errors")
        if any(stats.get(name) for name in names):
            log.info(
                "disk while running: %d episodes of a full store (%d of the temp store), %d "
                "producer pauses, %d sends refused, %d writes refused for lack of space",
                stats.get("store_full_episodes", 0),
                stats.get("temp_full_episodes", 0),
                stats.get("flow_paused_disk", 0),
                stats.get("sends_refused_store_full", 0) + stats.get("sends_refused_temp_full", 0),
                stats.get("store_no_space_errors", 0),
            )
        self.report_latency()
        log.info("sluice stopped")


# The deadline sweep runs four times per shortest deadline, within these bounds (seconds).
_MIN_DEADLINE_SWEEP_S = 0.05
_MAX_DEADLINE_SWEEP_S = 5.0


def _deadline_interval_s(config: Config) -> float:
    """How often sessions are checked against `frame_timeout_s` and `idle_timeout_s` (0: never,
    when both are off)."""
    limits = config.limits
    deadlines = [t for t in (limits.frame_timeout_s, limits.idle_timeout_s) if t > 0]
    if not deadlines:
        return 0.0
    return max(_MIN_DEADLINE_SWEEP_S, min(_MAX_DEADLINE_SWEEP_S, min(deadlines) / 4))
