"""`MessageStore.inspect`: a journal's files as its last checkpoint has them, live messages by
destination with the oldest sequence of each, transactions' and state records, a bound on the
messages attributed; read from another thread while the writer goes on; the memory store's
empty view."""

from __future__ import annotations

import threading
from pathlib import Path

from sluice.store.api import StoredMessage
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore

from .helpers import journal_config


def _message(destination: str, seq: int) -> StoredMessage:
    return StoredMessage(destination, seq, f"{destination}-{seq}", 0, {}, b"x" * 700)


def _sink(handles: object) -> None:
    """Completions are not waited on here."""


def test_files_live_messages_and_what_pins_them(tmp_path: Path) -> None:
    store = JournalStore(journal_config(tmp_path))
    store.open(_sink)
    try:
        for seq in range(1, 2001):
            store.add(_message("/queue/a", seq), None)
            if seq <= 500:
                store.add(_message("/queue/b", seq), None)
        store.checkpoint()
        for seq in range(1, 1001):
            store.remove("/queue/a", seq)
        store.begin("t1")
        store.add(_message("/queue/c", 0), None, "t1")
        store.checkpoint()
        view = store.inspect(10**6)
        assert view.kind == "journal"
        assert view.complete
        assert view.checkpoint is not None
        assert view.head is not None
        assert view.checkpoint[0] == view.head[0]
        live: dict[str, int] = {}
        for f in view.files:
            for name, count in f.live_by_destination.items():
                live[name] = live.get(name, 0) + count
            assert f.live_messages == sum(f.live_by_destination.values())
            assert f.size_bytes >= f.data_bytes
        assert live == {"/queue/a": 1000, "/queue/b": 500}
        oldest_a = min(f.oldest_by_destination.get("/queue/a", 1 << 62) for f in view.files)
        assert oldest_a == 1001
        assert view.files[0].oldest_by_destination["/queue/b"] == 1
        assert sum(f.transaction_pins for f in view.files) >= 1
        assert [f.head for f in view.files].count(True) == 1
        assert any("/queue/a" in f.state_of for f in view.files)
        assert view.messages_scanned == 1500
        bounded = store.inspect(100)
        assert not bounded.complete
        assert bounded.messages_scanned == 100
    finally:
        store.close()


def test_read_from_another_thread_while_writing(tmp_path: Path) -> None:
    store = JournalStore(journal_config(tmp_path, checkpoint_interval_s=0.01))
    store.open(_sink)
    errors: list[BaseException] = []
    done = threading.Event()

    def inspect() -> None:
        try:
            while not done.is_set():
                view = store.inspect(10**6)
                assert all(f.live_messages >= 0 for f in view.files)
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    reader = threading.Thread(target=inspect)
    reader.start()
    try:
        for seq in range(1, 3001):
            store.add(_message("/queue/a", seq), None)
            if seq % 2:
                store.remove("/queue/a", seq)
    finally:
        done.set()
        reader.join(30)
        store.close()
    assert not errors


def test_the_memory_store_has_no_files() -> None:
    view = MemoryStore().inspect(10)
    assert (view.kind, view.files, view.checkpoint) == ("memory", [], None)
