"""What a store can do is declared (`StoreCapabilities`), and the broker pages to a store only
when its declaration says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice.config import MiB, StoreConfig
from sluice.store.api import StoreCapabilities
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
