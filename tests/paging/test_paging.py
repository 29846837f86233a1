"""Paging and disk limits on the journal store, with the broker in a subprocess.

Messages are sent with no consumer, far beyond the memory limits, then drained: the broker keeps
only a window in memory (persistent messages stay in the store, non-persistent ones spool to the
temp store) and its resident memory stays under the configured limit plus a stated allowance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from rawstomp import RawStomp

MiB = 1024 * 1024
MESSAGE_BYTES = 64 * 1024
DESTINATION_LIMIT = 16 * MiB
BROKER_LIMIT = 32 * MiB
# Beyond the limit, the broker holds: a page read back from the store (8 MiB), Python objects of
# the messages in memory, the writer's pending batch (max_async_write_bytes below), transport and
# parser buffers, LMDB's mapped pages it touched. Measured at 20-40 MiB.
ALLOWANCE = 96 * MiB


def _config(data: Path, extra: str = "", store: str = "") -> str:
    return f"""
[store]
kind = "journal"
data_dir = "{data}"
{store}
[limits]
destination_memory_limit_bytes = {DESTINATION_LIMIT}
memory_limit_bytes = {BROKER_LIMIT}
max_async_write_bytes = {16 * MiB}
{extra}
"""


def _fill_and_drain(tmp_path: Path, total_bytes: int, *, persistent: bool) -> None:
    broker = BrokerProcess(_config(tmp_path / "data"), tmp_path).start()
    try:
        count = total_bytes // MESSAGE_BYTES
        producer = RawStomp(broker.port, timeout=120)
        producer.connect()
        baseline = broker.rss_bytes()
        peak = baseline
        flag = "persistent:true\n" if persistent else ""
        filler = b"x" * (MESSAGE_BYTES - 8)
        window = 32
        for start in range(0, count, window):
            batch = []
            for i in range(start, min(start + window, count)):
                receipt = f"receipt:r{i}\n" if i == min(start + window, count) - 1 else ""
                batch.append(
                    f"SEND\ndestination:/queue/paging\n{flag}{receipt}"
                    f"content-length:{MESSAGE_BYTES}\n\n".encode()
                    + b"%08d" % i
                    + filler
                    + b"\0"
                )
            producer.send(b"".join(batch))
            assert producer.frame().command == "RECEIPT"
            if start % (window * 16) == 0:
                peak = max(peak, broker.rss_bytes())
        filled = broker.rss_bytes()
        consumer = RawStomp(broker.port, timeout=120)
        consumer.connect()
        consumer.send(
            b"SUBSCRIBE\nid:1\ndestination:/queue/paging\nack:client\n"
            b"activemq.prefetchSize:64\n\n\0"
        )
        for expected in range(count):
            frame = consumer.frame()
            assert int(frame.body[:8]) == expected
            if expected % 32 == 31:
                consumer.send(b"ACK\nid:" + frame.headers["ack"].encode() + b"\n\n\0")
            if expected % 512 == 0:
                peak = max(peak, broker.rss_bytes())
        growth = peak - baseline
        print(
            f"{total_bytes // MiB} MiB {'persistent' if persistent else 'non-persistent'}: "
            f"baseline {baseline / MiB:.1f} MiB, after filling {filled / MiB:.1f} MiB, "
            f"peak {peak / MiB:.1f} MiB (growth {growth / MiB:.1f} MiB)"
        )
        assert growth < BROKER_LIMIT + ALLOWANCE, growth
    finally:
        assert broker.stop() == 0


def test_persistent_backlog_pages_to_disk(tmp_path: Path) -> None:
    _fill_and_drain(tmp_path, 256 * MiB, persistent=True)


def test_non_persistent_backlog_spools_to_the_temp_store(tmp_path: Path) -> None:
    _fill_and_drain(tmp_path, 256 * MiB, persistent=False)


@pytest.mark.slow
def test_two_gib_of_persistent_messages_page_through(tmp_path: Path) -> None:
    _fill_and_drain(tmp_path, 2048 * MiB, persistent=True)


def test_store_limit_refuses_sends_when_asked_to(tmp_path: Path) -> None:
    broker = BrokerProcess(
        _config(tmp_path / "data", store='max_bytes = 1\nstore_full = "error"'),
        tmp_path,
    ).start()
    try:
        client = RawStomp(broker.port)
        client.connect()
        client.send(b"SEND\ndestination:/queue/full\npersistent:true\nreceipt:r\n\nx\0")
        error = client.frame()
        assert error.command == "ERROR"
        assert "limit store.max_bytes=1 exceeded" in error.headers["message"]
        assert error.headers["receipt-id"] == "r"
    finally:
        assert broker.stop() == 0


def test_store_limit_pauses_producers(tmp_path: Path) -> None:
    broker = BrokerProcess(_config(tmp_path / "data", store="max_bytes = 1"), tmp_path).start()
    try:
        client = RawStomp(broker.port)
        client.connect()
        client.send(b"SEND\ndestination:/queue/full\npersistent:true\nreceipt:r1\n\nx\0")
        assert client.frame().command == "RECEIPT"  # accepted, then the producer is paused
        client.send(b"SEND\ndestination:/queue/full\npersistent:true\nreceipt:r2\n\ny\0")
        with pytest.raises(TimeoutError):
            client.frame(timeout=1.5)
    finally:
        assert broker.stop() == 0
    assert "the store is full: store.max_bytes=0.0 MiB reached" in broker.log_text


def test_a_large_transaction_is_never_held_in_memory(tmp_path: Path) -> None:
    broker = BrokerProcess(_config(tmp_path / "data"), tmp_path).start()
    try:
        count = (128 * MiB) // MESSAGE_BYTES  # four times the broker's memory limit
        producer = RawStomp(broker.port, timeout=120)
        producer.connect()
        baseline = broker.rss_bytes()
        producer.send(b"BEGIN\ntransaction:big\n\n\0")
        filler = b"x" * (MESSAGE_BYTES - 8)
        for i in range(count):
            producer.send(
                b"SEND\ndestination:/queue/tx-paging\npersistent:true\ntransaction:big\n"
                b"content-length:%d\n\n%08d%b\0" % (MESSAGE_BYTES, i, filler)
            )
        producer.send(b"COMMIT\ntransaction:big\nreceipt:committed\n\n\0")
        assert producer.frame().headers["receipt-id"] == "committed"
        peak = broker.rss_bytes()
        consumer = RawStomp(broker.port, timeout=120)
        consumer.connect()
        consumer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/tx-paging\nack:auto\n\n\0")
        for expected in range(count):
            assert int(consumer.frame().body[:8]) == expected
            if expected % 256 == 0:
                peak = max(peak, broker.rss_bytes())
        print(f"128 MiB transaction: growth {(peak - baseline) / MiB:.1f} MiB")
        assert peak - baseline < BROKER_LIMIT + ALLOWANCE
    finally:
        assert broker.stop() == 0
