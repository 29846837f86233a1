"""State that must survive a restart of a journal-store broker: the dedup window, durable
subscriptions and their cursors, retained topic logs, and queue contents."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from rawstomp import RawStomp


def _broker(tmp_path: Path) -> BrokerProcess:
    return BrokerProcess(
        f'[store]\nkind = "journal"\ndata_dir = "{tmp_path / "data"}"\n'
        '[[destination]]\npattern = "/topic/kept.>"\nretention_s = 3600\n',
        tmp_path,
    ).start()


def _send(port: int, destination: str, body: str, headers: str = "") -> None:
    c = RawStomp(port)
    c.connect()
    c.send(
        f"SEND\ndestination:{destination}\npersistent:true\n{headers}receipt:r\n\n{body}\0".encode()
    )
    assert c.frame().headers["receipt-id"] == "r"
    c.close()


@pytest.mark.parametrize("kill", [False, True], ids=["stop", "sigkill"])
def test_dedup_window_survives_a_restart(tmp_path: Path, kill: bool) -> None:
    broker = _broker(tmp_path)
    _send(broker.port, "/queue/d", "first", "x-dedup-id:order-1\n")
    broker.kill() if kill else broker.stop()
    broker = _broker(tmp_path)
    try:
        _send(broker.port, "/queue/d", "retry", "x-dedup-id:order-1\n")
        c = RawStomp(broker.port)
        c.connect()
        c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/d\n\n\0")
        assert c.frame().body == b"first"
        with pytest.raises(TimeoutError):
            c.frame(timeout=0.5)
    finally:
        assert broker.stop() == 0


@pytest.mark.parametrize("kill", [False, True], ids=["stop", "sigkill"])
def test_durable_subscription_and_retained_log_survive_a_restart(
    tmp_path: Path, kill: bool
) -> None:
    broker = _broker(tmp_path)
    durable = RawStomp(broker.port)
    durable.connect(extra="client-id:auditor\n")
    durable.send(
        b"SUBSCRIBE\nid:1\ndestination:/topic/kept.events\nack:client-individual\n"
        b"activemq.subscriptionName:audit\nreceipt:s\n\n\0"
    )
    assert durable.frame().command == "RECEIPT"
    _send(broker.port, "/topic/kept.events", "e1")
    first = durable.frame()
    durable.send(b"ACK\nid:" + first.headers["ack"].encode() + b"\nreceipt:a\n\n\0")
    assert durable.frame().command == "RECEIPT"
    durable.close()
    _send(broker.port, "/topic/kept.events", "e2")
    _send(broker.port, "/topic/kept.events", "e3")
    broker.kill() if kill else broker.stop()
    broker = _broker(tmp_path)
    try:
        back = RawStomp(broker.port)
        back.connect(extra="client-id:auditor\n")
        back.send(
            b"SUBSCRIBE\nid:1\ndestination:/topic/kept.events\nack:auto\n"
            b"activemq.subscriptionName:audit\n\n\0"
        )
        # Acknowledged before the restart: not again. Published while away: delivered.
        assert [back.frame().body for _ in range(2)] == [b"e2", b"e3"]
        reader = RawStomp(broker.port)
        reader.connect()
        reader.send(b"SUBSCRIBE\nid:1\ndestination:/topic/kept.events\nx-offset:earliest\n\n\0")
        replay = [reader.frame() for _ in range(3)]
        assert [m.body for m in replay] == [b"e1", b"e2", b"e3"]
        assert [m.headers["x-offset"] for m in replay] == ["1", "2", "3"]
    finally:
        assert broker.stop() == 0
