"""What the broker builds per message holds no reference cycles.

The broker process freezes what survives each full collection out of the cyclic garbage
collector's sight (`sluice.cli.collector`), queued messages included, and relies on reference
counting for the objects of each message: a frame, its message, its write to the journal, the
RECEIPT, the MESSAGE, the ACK. A cycle among those would be garbage only a complete collection
finds, whose pause grows with everything the broker holds. This test sends persistent messages
with receipts through a journal store and consumes them with acknowledgements while the collector
is off, then counts what a full collection finds: nothing that grows with the messages sent.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp

QUEUE = "/queue/cycles"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = start_broker(store={"kind": "journal", "data_dir": str(tmp_path / "data")})
    try:
        yield running
    finally:
        running.stop()


def _traffic(producer: RawStomp, consumer: RawStomp, count: int, start: int) -> None:
    """`count` persistent sends, each waiting for its RECEIPT, then received and acknowledged."""
    for n in range(start, start + count):
        producer.send(
            b"SEND\ndestination:%b\npersistent:true\nreceipt:r%d\n\nmessage %d\0"
            % (QUEUE.encode(), n, n)
        )
        assert producer.frame().headers["receipt-id"] == f"r{n}"
    for _ in range(count):
        message = consumer.frame()
        assert message.command == "MESSAGE"
        consumer.send(b"ACK\nid:%b\n\n\0" % message.headers["ack"].encode())


def test_messages_leave_no_cyclic_garbage(broker: RunningBroker) -> None:
    producer, consumer = RawStomp(broker.port), RawStomp(broker.port)
    producer.connect()
    consumer.connect()
    consumer.send(
        b"SUBSCRIBE\nid:1\ndestination:%b\nack:client-individual\nreceipt:s\n\n\0" % QUEUE.encode()
    )
    assert consumer.frame().command == "RECEIPT"
    _traffic(producer, consumer, 100, 0)  # warm-up: caches, the first write of each kind
    gc.collect()
    gc.disable()
    try:
        _traffic(producer, consumer, 1000, 100)
        found = gc.collect()
    finally:
        gc.enable()
    assert found < 50, f"{found} objects in reference cycles after 1,000 messages"
