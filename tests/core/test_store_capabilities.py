"""What a store can do is declared (`StoreCapabilities`), and the broker pages to a store only
when its declaration says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice.config import MiB, StoreConfig
from sluice.core.connection import SubscribeOptions
from sluice.core.destination import STORE_RETRY_S
from sluice.core.message import AckMode
from sluice.errors import StoreOfflineError
from sluice.store.api import StoreCapabilities, StoredMessage
from sluice.store.journal.store import JournalStore
from sluice.store.memory import MemoryStore
from sluice.store.postgres.store import PostgresStore

from .fakes import Harness


def test_every_store_declares_what_it_can_do(tmp_path: Path) -> None:
    config = StoreConfig(data_dir=tmp_path, journal_file_bytes=MiB)
    assert MemoryStore().capabilities == StoreCapabilities(
        pages_to_disk=False, durable=False, data_files=False
    )
    assert JournalStore(config).capabilities == StoreCapabilities(
        pages_to_disk=True, durable=True, data_files=True
    )
    # The temp store spools non-persistent messages: nothing of it survives a restart.
    assert not JournalStore(config, temporary=True).capabilities.durable
    assert PostgresStore("postgresql://127.0.0.1/x").capabilities == StoreCapabilities(
        pages_to_disk=True, durable=True, data_files=False
    )


@pytest.mark.parametrize("pages", [False, True])
def test_the_broker_pages_to_a_store_that_declares_it(pages: bool) -> None:
    store = MemoryStore()
    store.capabilities = dataclasses.replace(store.capabilities, pages_to_disk=pages)
    harness = Harness(store)
    assert harness.broker.store_pages is pages
    with pytest.raises(dataclasses.FrozenInstanceError):
        store.capabilities.pages_to_disk = not pages  # type: ignore[misc]


class _OfflineStore(MemoryStore):
    """A store whose reads fail while `offline` (a database restarting under it)."""

    offline = False

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        if self.offline:
            raise StoreOfflineError("postgres: no read connection (connecting again)")
        return super().load(destination, after_seq, max_count, max_bytes)


def test_a_dispatch_pass_the_store_cannot_serve_runs_again_later() -> None:
    store = _OfflineStore()
    store.capabilities = dataclasses.replace(store.capabilities, pages_to_disk=True)
    before = Harness(store)
    producer, _ = before.connect()
    for n in range(3):
        before.send(producer, "/queue/q", f"m{n}".encode(), persistent=True)
    store.offline = True
    h = Harness(store)  # started again: the three wait in the store, to be read back
    consumer, link = h.connect()
    consumer.subscribe("s", "/queue/q", AckMode.CLIENT_INDIVIDUAL, SubscribeOptions(prefetch=10))
    h.loop.run()
    assert link.bodies() == []
    retries = h.broker.counters["store_read_retries"]
    assert retries >= 1
    assert STORE_RETRY_S in {timer.delay for timer in h.loop.timers}
    # Every failed pass of the queue (at the start, at the subscribe) shares one pending retry.
    assert [timer.delay for timer in h.loop.timers].count(STORE_RETRY_S) == 1
    h.loop.fire_timers()  # still offline: tried again, and again later
    assert link.bodies() == []
    assert h.broker.counters["store_read_retries"] > retries
    store.offline = False
    h.loop.fire_timers()
    assert link.bodies() == [b"m0", b"m1", b"m2"]
    assert STORE_RETRY_S not in {timer.delay for timer in h.loop.timers}
