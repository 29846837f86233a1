"""A store that fails its writes, through real sockets: a persistent message is never receipted
unless it was written; the producer gets an ERROR naming the store failure (not the internal
error); nothing unwritten is delivered; persistent sends are refused from then on."""

from __future__ import annotations

import logging
import uuid

import pytest

from conftest import start_broker
from failing_store import INJECTED, FailingStore
from rawstomp import RawStomp


def _send(dest: str, body: str, receipt: str, *, persistent: bool = True) -> bytes:
    flag = "persistent:true\n" if persistent else ""
    return f"SEND\ndestination:{dest}\n{flag}receipt:{receipt}\n\n{body}\0".encode()


def test_a_failed_write_gets_an_error_never_a_receipt(caplog: pytest.LogCaptureFixture) -> None:
    store = FailingStore()
    running = start_broker(message_store=store)
    try:
        queue = f"/queue/orders-{uuid.uuid4().hex[:8]}"
        producer = RawStomp(running.port)
        producer.connect()
        producer.send(_send(queue, "written", "r1"))
        assert producer.frame().headers == {"receipt-id": "r1"}
        running.call(store.fail_writes)
        with caplog.at_level(logging.ERROR, logger="sluice"):
            producer.send(_send(queue, "not written", "r2"))
            error = producer.frame()
        assert error.command == "ERROR"
        assert error.headers["receipt-id"] == "r2"
        assert "message store failed" in error.headers["message"]
        assert INJECTED not in error.headers["message"]  # the internal error stays in the log
        assert producer.closed()
        assert "a store write failed" in caplog.text

        # While the store is failed, persistent SENDs are refused: an ERROR, no RECEIPT.
        refused = RawStomp(running.port)
        refused.connect()
        refused.send(_send(queue, "refused", "r3"))
        error = refused.frame()
        assert error.command == "ERROR"
        assert error.headers["receipt-id"] == "r3"
        assert "persistent messages are refused" in error.headers["message"]
        assert refused.closed()

        # Non-persistent messages still flow; only what was written is delivered.
        consumer = RawStomp(running.port)
        consumer.connect()
        consumer.send(_send(queue, "in memory", "r4", persistent=False))
        assert consumer.frame().headers == {"receipt-id": "r4"}
        consumer.send(f"SUBSCRIBE\nid:s\ndestination:{queue}\nack:auto\n\n\0".encode())
        assert [consumer.frame().body for _ in range(2)] == [b"written", b"in memory"]
        with pytest.raises(TimeoutError):
            consumer.frame(timeout=0.3)
        stats = running.stats()
        assert stats["store_failed"] == 1
        assert stats["store_write_errors"] == 1
        assert stats["sends_refused_store_failed"] == 1
        assert stats["closed_store_failure"] == 2
    finally:
        running.stop()


def test_a_failed_commit_gets_an_error_and_shows_nothing() -> None:
    store = FailingStore()
    running = start_broker(message_store=store)
    try:
        topic = f"/topic/ledger-{uuid.uuid4().hex[:8]}"
        consumer = RawStomp(running.port)
        consumer.connect()
        consumer.send(f"SUBSCRIBE\nid:s\ndestination:{topic}\nack:auto\n\n\0".encode())
        producer = RawStomp(running.port)
        producer.connect()
        producer.send(b"BEGIN\ntransaction:t\nreceipt:b\n\n\0")
        assert producer.frame().headers == {"receipt-id": "b"}
        producer.send(
            f"SEND\ndestination:{topic}\npersistent:true\ntransaction:t\n\nentry\0".encode()
        )
        running.call(store.fail_writes)
        producer.send(b"COMMIT\ntransaction:t\nreceipt:c\n\n\0")
        error = producer.frame()
        assert error.command == "ERROR"
        assert error.headers["receipt-id"] == "c"
        assert "not committed" in error.headers["message"]
        with pytest.raises(TimeoutError):
            consumer.frame(timeout=0.3)
    finally:
        running.stop()
