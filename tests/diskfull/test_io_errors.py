"""I/O errors fail safe, through real sockets (brokers in this process, errors injected).

- A failed fsync (EIO) is never taken as safe nor tried again: the producer gets an ERROR naming
  the cause, persistent sends are refused from then on, and a restart recovers from the journal.
- A send the disk had no room for (ENOSPC before any byte of it was written) gets an ERROR that
  says so; the store is not failed and takes the next sends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import start_broker
from rawstomp import RawStomp
from sluice.errors import DiskFullError
from sluice.store.api import StoredMessage, WriteHandle, WriteState
from sluice.store.memory import MemoryStore


def _send(dest: str, body: str, receipt: str) -> bytes:
    return f"SEND\ndestination:{dest}\npersistent:true\nreceipt:{receipt}\n\n{body}\0".encode()


def _journal(data: Path) -> dict[str, object]:
    return {"kind": "journal", "data_dir": str(data)}


def test_a_failed_fsync_is_never_retried_and_a_restart_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"/queue/ledger-{uuid.uuid4().hex[:8]}"
    running = start_broker(store=_journal(tmp_path / "data"))
    syncs_after_failure: list[int] = []
    lock = threading.Lock()
    try:
        producer = RawStomp(running.port)
        producer.connect()
        producer.send(_send(queue, "safe", "r1"))
        assert producer.frame().headers == {"receipt-id": "r1"}

        def failing_fdatasync(fd: int) -> None:
            with lock:
                syncs_after_failure.append(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        producer.send(_send(queue, "unsafe", "r2"))
        error = producer.frame()
        assert error.command == "ERROR"
        assert error.headers["receipt-id"] == "r2"
        assert error.headers["message"] == (
            "the message was not stored: the message store failed "
            "(journal sync failed: Input/output error); see the broker log"
        )
        assert producer.closed()

        refused = RawStomp(running.port)
        refused.connect()
        refused.send(_send(queue, "later", "r3"))
        error = refused.frame()
        assert error.command == "ERROR"
        assert "persistent messages are refused" in error.headers["message"]
        assert "journal sync failed: Input/output error" in error.headers["message"]
        stats = running.stats()
        assert stats["store_failed"] == 1
        assert stats["closed_store_failure"] == 2
    finally:
        running.stop()
    # One failed sync, never tried again: not for later batches, not when the store closed.
    assert len(syncs_after_failure) == 1
    monkeypatch.undo()

    again = start_broker(store=_journal(tmp_path / "data"))
    try:
        consumer = RawStomp(again.port)
        consumer.connect()
        consumer.send(f"SUBSCRIBE\nid:s\ndestination:{queue}\nack:auto\n\n\0".encode())
        bodies = [consumer.frame().body]
        with contextlib.suppress(TimeoutError):
            bodies.append(consumer.frame(timeout=1.0).body)
    finally:
        again.stop()
    # The receipted message is back; the one whose sync failed may be (its bytes reached the
    # file), but it was never receipted, and nothing comes twice.
    assert bodies[0] == b"safe"
    assert bodies[1:] in ([], [b"unsafe"])


class NoRoomStore(MemoryStore):
    """The memory store, refusing the next adds for lack of space as the journal does when the
    next data file cannot be made: the handle fails with `DiskFullError`, nothing is stored."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = 0

    def add(
        self,
        message: StoredMessage,
        on_complete: Callable[[WriteHandle], None] | None,
        txid: str | None = None,
    ) -> WriteHandle:
        if not self.refuse:
            return super().add(message, on_complete, txid)
        self.refuse -= 1
        handle = WriteHandle(on_complete, message.size)
        handle.state = WriteState.FAILED
        handle.error = DiskFullError(
            "starting a data file", os.strerror(errno.ENOSPC), "journal/db-9.log"
        )
        if self._sink is not None:
            self._sink((handle,))
        return handle


def test_a_send_the_disk_had_no_room_for_gets_an_error_and_the_store_goes_on() -> None:
    store = NoRoomStore()
    running = start_broker(message_store=store)
    queue = f"/queue/orders-{uuid.uuid4().hex[:8]}"
    try:
        producer = RawStomp(running.port)
        producer.connect()
        producer.send(_send(queue, "kept", "r1"))
        assert producer.frame().headers == {"receipt-id": "r1"}
        running.call(lambda: setattr(store, "refuse", 1))
        producer.send(
            f"SEND\ndestination:{queue}\npersistent:true\nreceipt:r2\nx-dedup-id:d2\n\n"
            "no room\0".encode()
        )
        error = producer.frame()
        assert error.command == "ERROR"
        assert error.headers["receipt-id"] == "r2"
        assert error.headers["message"] == (
            "the message was not stored: the store's disk is full (No space left on device); "
            "send it again later"
        )
        assert "db-9.log" not in error.headers["message"]

        # The store is not failed: the same message, sent again (its dedup id was not kept),
        # is stored, and only what was stored is delivered.
        again = RawStomp(running.port)
        again.connect()
        again.send(
            f"SEND\ndestination:{queue}\npersistent:true\nreceipt:r3\nx-dedup-id:d2\n\n"
            "no room\0".encode()
        )
        assert again.frame(timeout=5.0).headers == {"receipt-id": "r3"}
        again.send(f"SUBSCRIBE\nid:s\ndestination:{queue}\nack:auto\n\n\0".encode())
        assert [again.frame().body for _ in range(2)] == [b"kept", b"no room"]
        with pytest.raises(TimeoutError):
            again.frame(timeout=0.3)
        stats = running.stats()
        assert stats["store_failed"] == 0
        assert stats["store_no_space_errors"] == 1
        assert stats["closed_store_full"] == 1
        assert stats.get("duplicates_dropped", 0) == 0
    finally:
        running.stop()
