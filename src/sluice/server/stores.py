"""Opening the stores a configuration asks for: the application does this before it builds a
`BrokerServer`, so the listener only listens (and tests hand it stores of their own)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sluice.config import Config, MiB, StoreKind
from sluice.errors import StoreError
from sluice.store.api import Fence, MessageStore
from sluice.store.memory import MemoryStore

if TYPE_CHECKING:
    from sluice.store.postgres.writer import DatabaseFence


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
    if store.kind is StoreKind.JOURNAL and not list_files(data_dir / "journal"):
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


def open_stores(
    config: Config,
    fence: Fence | None = None,
    *,
    detach_previous_master: bool = False,
    database_fence: DatabaseFence | None = None,
) -> tuple[MessageStore, MessageStore | None]:
    """The store the configuration asks for, and the temp store non-persistent messages spool
    to (a journal in `data_dir/tmp`, with the journal and the PostgreSQL stores: with the memory
    store, a full memory pauses producers). `fence` is the high-availability lease the journal
    checks before it writes (`sluice.ha`); `detach_previous_master`, when the previous master may
    still be alive: cut it off from the journal's newest file and the index first
    (`sluice.store.journal.detach`). `database_fence` is the lease the PostgreSQL store checks
    in the database in every write transaction."""
    if config.store.kind is StoreKind.MEMORY:
        return MemoryStore(), None
    from sluice.store.journal.store import JournalStore  # noqa: PLC0415 - only when asked for

    check_disk_space(config)
    if detach_previous_master:
        from sluice.store.journal import detach  # noqa: PLC0415

        detach.detach_previous_master(config.store.data_dir)

    store: MessageStore
    if config.store.kind is StoreKind.POSTGRES:
        store = _postgres_store(config, database_fence)
    else:
        store = JournalStore(
            config.store,
            dedup_window=config.limits.dedup_window,
            time_writes=config.latency.hops,
            fence=fence,
        )
    temp_config = dataclasses.replace(config.store, data_dir=config.store.data_dir / "tmp")
    return store, JournalStore(temp_config, temporary=True)


def _postgres_store(config: Config, fence: DatabaseFence | None) -> MessageStore:
    try:
        from sluice.store.postgres.store import PostgresStore  # noqa: PLC0415 - psycopg then only
    except ImportError as exc:
        raise StoreError(
            "the PostgreSQL store needs psycopg: pip install 'sluice[postgres]'"
        ) from exc
    return PostgresStore(
        config.store.url,
        schema=config.store.schema,
        dedup_window=config.limits.dedup_window,
        sync_acks=config.store.sync_acks,
        fence=fence,
        reconnect_s=config.store.reconnect_s,
        write_connections=config.store.write_connections,
    )
