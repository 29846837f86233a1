"""Helpers for the store tests: a sink that records deliveries, and store harnesses that can be
reopened (a new JournalStore on the same directory, a new PostgresStore on the same schema; the
same MemoryStore instance)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluice.config import MiB, StoreConfig
from sluice.store.api import Recovery, StoredMessage, WriteHandle
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore
from sluice.store.postgres.store import PostgresStore

WAIT_S = 20.0


class Sink:
    """Records every handle the store completes, and lets a test wait for them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.delivered: list[WriteHandle] = []
        self.calls = 0

    def __call__(self, handles: Sequence[WriteHandle]) -> None:
        with self.cond:
            self.delivered.extend(handles)
            self.calls += 1
            self.cond.notify_all()

    def wait(self, handles: Sequence[WriteHandle], timeout: float = WAIT_S) -> None:
        """Wait until every handle has gone through the sink."""
        wanted = {id(h) for h in handles}

        def arrived() -> bool:
            return wanted <= {id(h) for h in self.delivered}

        with self.cond:
            assert self.cond.wait_for(arrived, timeout), "handles not delivered in time"

    def count(self, handle: WriteHandle) -> int:
        with self.cond:
            return sum(1 for h in self.delivered if h is handle)


def msg(
    destination: str,
    seq: int,
    body: bytes = b"body",
    *,
    ts: int = 1_000,
    headers: dict[str, str] | None = None,
    priority: int = 4,
    expires_ms: int = 0,
    persistent: bool = True,
) -> StoredMessage:
    """A message with a predictable id."""
    return StoredMessage(
        destination,
        seq,
        f"id-{destination}-{seq}-{len(body)}",
        ts,
        dict(headers or {"k": "v"}),
        body,
        expires_ms=expires_ms,
        priority=priority,
        persistent=persistent,
    )


def fields(m: StoredMessage) -> tuple[object, ...]:
    """Everything a stored message carries, for comparisons."""
    return (
        m.destination,
        m.seq,
        m.message_id,
        m.timestamp_ms,
        dict(m.headers),
        bytes(m.body),
        m.expires_ms,
        m.priority,
        m.persistent,
    )


def journal_config(path: Path, **overrides: object) -> StoreConfig:
    """A small-file journal configuration for tests."""
    values: dict[str, object] = {"data_dir": path, "journal_file_bytes": 1 * MiB}
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


@dataclass
class Harness:
    """One store under test, with the sink and a way to reopen it."""

    kind: str
    make: Callable[[], MemoryStore | JournalStore | PostgresStore]
    sink: Sink = field(default_factory=Sink)
    store: MemoryStore | JournalStore | PostgresStore | None = None
    recovery: Recovery | None = None
    handles: list[WriteHandle] = field(default_factory=list)

    def open(self) -> Recovery:
        if self.store is None or self.kind != "memory":
            self.store = self.make()
        self.recovery = self.store.open(self.sink)
        return self.recovery

    @property
    def s(self) -> MemoryStore | JournalStore | PostgresStore:
        assert self.store is not None
        return self.store

    def track(self, handle: WriteHandle) -> WriteHandle:
        self.handles.append(handle)
        return handle

    def settle(self) -> None:
        """Wait for every handle issued so far."""
        self.sink.wait(self.handles)

    def reopen(self) -> Recovery:
        self.settle()
        self.s.close()
        return self.open()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


@pytest.fixture
def make_journal(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Build journal harnesses on a temporary directory (closed at the end)."""
    made: list[Harness] = []

    def build(path: Path | None = None, dedup_window: int = 10_000, **overrides: object) -> Harness:
        config = journal_config(path or tmp_path / "data", **overrides)
        h = Harness("journal", lambda: JournalStore(config, dedup_window=dedup_window))
        made.append(h)
        return h

    yield build
    for h in made:
        h.close()


def copy_running(store: JournalStore, target: Path) -> None:
    """Copy the data directory of a running store as a crash would leave it (no close)."""
    with store.writes_paused():
        shutil.copytree(store.config.data_dir, target)


class FailingCommit:
    """An LMDB write transaction whose commit fails with `error`, as LMDB fails one: the
    transaction is aborted first (the index stays as the last commit left it)."""

    def __init__(self, txn: object, error: Exception) -> None:
        self._txn = txn
        self._error = error

    def __getattr__(self, name: str) -> object:
        return getattr(self._txn, name)

    def commit(self) -> None:
        self._txn.abort()  # type: ignore[attr-defined]
        raise self._error
