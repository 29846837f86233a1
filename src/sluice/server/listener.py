"""The broker server: recovers the stores it is given, listens for STOMP connections, and
shuts down cleanly."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from sluice import __version__
from sluice.config import Config
from sluice.core.broker import Broker
from sluice.server.context import Authenticator, LiveSession, SessionContext
from sluice.server.inbound import InboundBudget, MemoryTrim
from sluice.server.session import StompSession
from sluice.stomp.codec import StompLimits
from sluice.store.api import MessageStore

log = logging.getLogger(__name__)


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
    ) -> None:
        """`store` and `temp_store` come from `stores.open_stores` (or a test); `authenticate`
        checks CONNECT's login and passcode (everyone is let in without one); `now_ms` is the
        broker's wall clock in milliseconds (the system's unless a test gives its own)."""
        self.config = config
        self.version = __version__
        self.loop = asyncio.get_running_loop()
        self.broker = Broker(config, store, self.loop, temp_store=temp_store, now_ms=now_ms)
        limits = config.limits
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
            server_name=f"sluice/{__version__}",
            broker_name=config.broker_name,
            sessions=self.sessions,
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
        if authenticate is not None:
            context = dataclasses.replace(context, authenticate=authenticate)
        self.context = context
        self._server: asyncio.base_events.Server | None = None
        self.port = 0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_interval_s = _deadline_interval_s(config)

    def _new_session(self) -> StompSession:
        return StompSession(self.context)

    async def start(self) -> None:
        """Recover the store and start listening."""
        recovery = self.broker.open()
        for line in recovery.report:
            log.warning("store recovery: %s", line)
        self._server = await self.loop.create_server(
            self._new_session,
            self.config.stomp.host,
            self.config.stomp.port,
            reuse_address=True,
            backlog=4096,
        )
        if self._deadline_interval_s:
            self._deadline_timer = self.loop.call_later(
                self._deadline_interval_s, self._check_deadlines
            )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info(
            "sluice %s listening for STOMP on %s:%d (store: %s)",
            self.version,
            self.config.stomp.host,
            self.port,
            self.config.store.kind.value,
        )

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
        if self._server is not None:
            self._server.close()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self.broker.shutting_down = True
        for session in list(self.sessions):
            session.shutdown()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        # Let the transports flush what they hold and run connection_lost.
        await asyncio.sleep(0)
        self.broker.close()
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
