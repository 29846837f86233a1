"""The broker server: opens the store, listens for STOMP connections, and shuts down cleanly."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from sluice import __version__
from sluice.config import Config, MiB, StoreKind
from sluice.core.broker import Broker
from sluice.errors import StoreError
from sluice.server.session import StompSession
from sluice.stomp.codec import StompLimits
from sluice.store.api import MessageStore
from sluice.store.memory import MemoryStore

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0


def check_disk_space(config: Config) -> None:
    """Refuse to start, in one line, when the disk cannot hold what opening the stores creates.

    A new store needs its first data file, the next one prepared ahead, and the reserve; an
    existing one needs nothing new (so a broker stopped on a full disk starts again, and its
    consumers drain it). The temp store needs its first data file either way (its old files are
    deleted when it opens)."""
    from sluice.store.journal.files import free_bytes, list_files  # noqa: PLC0415

    store = config.store
    data_dir = store.data_dir
    file_bytes = store.journal_file_bytes
    temp_dir = data_dir / "tmp"
    reclaimed = 0
    if temp_dir.is_dir():
        reclaimed = sum(path.stat().st_size for path in temp_dir.rglob("*") if path.is_file())
    free = free_bytes(data_dir) + reclaimed
    needed = file_bytes
    what = f"the temp store's first data file of {file_bytes / MiB:.1f} MiB"
    if not list_files(data_dir / "journal"):
        reserve = store.disk_reserve_bytes
        needed += 2 * file_bytes + reserve
        what = (
            f"3 data files of {file_bytes / MiB:.1f} MiB (a new journal, its next file, the temp "
            f"store) and store.reserve_bytes={reserve / MiB:.1f} MiB"
        )
    if free < needed:
        raise StoreError(
            f"not enough disk space to start: {data_dir} has {free / MiB:.1f} MiB free, "
            f"{needed / MiB:.1f} MiB needed ({what})"
        )


def open_stores(config: Config) -> tuple[MessageStore, MessageStore | None]:
    """The store the configuration asks for, and the temp store non-persistent messages spool
    to (only with the journal: with the memory store, a full memory pauses producers)."""
    if config.store.kind is StoreKind.MEMORY:
        return MemoryStore(), None
    from sluice.store.journal.store import JournalStore  # noqa: PLC0415 - only when asked for

    check_disk_space(config)

    store = JournalStore(config.store, dedup_window=config.limits.dedup_window)
    temp_config = dataclasses.replace(config.store, data_dir=config.store.data_dir / "tmp")
    return store, JournalStore(temp_config, temporary=True)


class BrokerServer:
    """A broker and its STOMP listener on one event loop."""

    def __init__(
        self,
        config: Config,
        *,
        store: MessageStore | None = None,
        authenticate: Callable[[str | None, str | None], bool] | None = None,
    ) -> None:
        self.config = config
        self.name = config.broker_name
        self.version = __version__
        self.loop = asyncio.get_running_loop()
        temp_store: MessageStore | None = None
        if store is None:
            store, temp_store = open_stores(config)
        self.broker = Broker(config, store, self.loop, temp_store=temp_store)
        self.stomp_limits = StompLimits(
            max_frame_bytes=config.limits.max_frame_bytes,
            max_header_bytes=config.limits.max_header_bytes,
            max_headers=config.limits.max_headers,
        )
        self.connect_timeout_s = CONNECT_TIMEOUT_S
        self.sessions: set[StompSession] = set()
        self._authenticate = authenticate
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    def authenticate(self, login: str | None, passcode: str | None) -> bool:
        """Check credentials (everyone is let in unless an authenticator is configured)."""
        if self._authenticate is None:
            return True
        return self._authenticate(login, passcode)

    def _new_session(self) -> StompSession:
        return StompSession(self)

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
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info(
            "sluice %s listening for STOMP on %s:%d (store: %s)",
            self.version,
            self.config.stomp.host,
            self.port,
            self.config.store.kind.value,
        )

    async def stop(self) -> None:
        """Stop listening, close every session, then close the store."""
        if self._server is not None:
            self._server.close()
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
