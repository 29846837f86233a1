"""Interoperability with stomp.py, a STOMP client we did not write."""

from __future__ import annotations

import queue
import uuid
from typing import Any

import pytest
import stomp

from conftest import RunningBroker, start_broker

CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Collector(stomp.ConnectionListener):  # type: ignore[misc]
    """Hands frames from stomp.py's receiver thread to the test thread."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()
        self.errors: queue.Queue[Any] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def message(self, timeout: float = 10.0) -> Any:
        return self.messages.get(timeout=timeout)

    def receipt(self, expected: str, timeout: float = 10.0) -> None:
        assert self.receipts.get(timeout=timeout) == expected

    def no_message(self, timeout: float = 0.3) -> bool:
        try:
            self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        return False


def _connect(port: int, version: str = "1.2", **kwargs: Any) -> tuple[Any, Collector]:
    conn = CONNECTIONS[version]([("127.0.0.1", port)], **kwargs)
    collector = Collector()
    conn.set_listener("collector", collector)
    conn.connect(wait=True)
    return conn, collector


def _subscribe(conn: Any, col: Collector, dest: str, sub_id: str, ack: str, **headers: str) -> None:
    conn.subscribe(dest, id=sub_id, ack=ack, receipt="sub-" + sub_id, headers=headers)
    col.receipt("sub-" + sub_id)


def _ack(conn: Any, version: str, frame: Any, sub_id: str) -> None:
    if version == "1.2":
        conn.ack(frame.headers["ack"])
    elif version == "1.1":
        conn.ack(frame.headers["message-id"], sub_id)
    else:
        conn.ack(frame.headers["message-id"])


@pytest.fixture
def port(broker: RunningBroker) -> int:
    return broker.port


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_send_receive_ack_each_version(port: int, version: str) -> None:
    dest = f"/queue/interop-{uuid.uuid4().hex}"
    conn, col = _connect(port, version)
    _subscribe(conn, col, dest, "s1", "client-individual" if version != "1.0" else "client")
    conn.send(dest, "hello", receipt="r1", headers={"persistent": "true", "colour": "red"})
    col.receipt("r1")
    frame = col.message()
    assert frame.body == "hello"
    assert frame.headers["colour"] == "red"
    assert frame.headers["persistent"] == "true"
    _ack(conn, version, frame, "s1")
    conn.disconnect(receipt="bye")
    # Acknowledged: a new consumer gets nothing.
    conn2, col2 = _connect(port, version)
    _subscribe(conn2, col2, dest, "s2", "auto")
    assert col2.no_message()
    conn2.disconnect()


def test_client_ack_mode_is_cumulative(port: int) -> None:
    dest = f"/queue/interop-{uuid.uuid4().hex}"
    conn, col = _connect(port)
    _subscribe(conn, col, dest, "s", "client")
    for i in range(5):
        conn.send(dest, str(i))
    frames = [col.message() for _ in range(5)]
    conn.ack(frames[3].headers["ack"], receipt="acked")
    col.receipt("acked")
    conn.disconnect()
    conn2, col2 = _connect(port)
    _subscribe(conn2, col2, dest, "s", "client")
    last = col2.message()
    assert last.body == "4"
    assert last.headers["redelivered"] == "true"
    assert col2.no_message()
    conn2.disconnect()


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_redelivers(port: int, version: str) -> None:
    dest = f"/queue/interop-{uuid.uuid4().hex}"
    conn, col = _connect(port, version)
    _subscribe(conn, col, dest, "s", "client-individual")
    conn.send(dest, "retry me")
    first = col.message()
    if version == "1.2":
        conn.nack(first.headers["ack"])
    else:
        conn.nack(first.headers["message-id"], "s")
    again = col.message()
    assert again.body == "retry me"
    assert again.headers["redelivered"] == "true"
    conn.disconnect()


def test_transactions_commit_and_abort(port: int) -> None:
    dest = f"/queue/interop-{uuid.uuid4().hex}"
    conn, col = _connect(port)
    _subscribe(conn, col, dest, "s", "auto")
    tx = conn.begin()
    conn.send(dest, "dropped", transaction=tx)
    conn.abort(tx)
    tx = conn.begin()
    conn.send(dest, "kept-1", transaction=tx)
    conn.send(dest, "kept-2", transaction=tx)
    assert col.no_message()  # invisible before COMMIT
    conn.commit(tx)
    assert [col.message().body, col.message().body] == ["kept-1", "kept-2"]
    assert col.no_message()
    conn.disconnect()


def test_topic_subscribers_each_get_a_copy(port: int) -> None:
    dest = f"/topic/interop-{uuid.uuid4().hex}"
    a, col_a = _connect(port)
    b, col_b = _connect(port, "1.1")
    _subscribe(a, col_a, dest, "a", "auto")
    _subscribe(b, col_b, dest, "b", "auto")
    a.send(dest, "news", receipt="r")
    col_a.receipt("r")
    assert col_a.message().body == "news"
    assert col_b.message().body == "news"
    a.disconnect()
    b.disconnect()


def test_error_frame_reaches_stomp_py(port: int) -> None:
    conn, col = _connect(port)
    conn.send("not-a-destination", "x")
    error = col.errors.get(timeout=10)
    assert "destination" in error.headers["message"]


def test_heartbeats_keep_stomp_py_connected() -> None:
    running = start_broker(heartbeat={"send_ms": 100, "receive_ms": 100})
    try:
        conn, col = _connect(running.port, heartbeats=(100, 100))
        dest = f"/queue/interop-{uuid.uuid4().hex}"
        _subscribe(conn, col, dest, "s", "auto")
        # Several beat intervals pass with no traffic; the connection must survive them.
        assert col.no_message(timeout=1.0)
        conn.send(dest, "still here", receipt="r")
        col.receipt("r")
        assert col.message().body == "still here"
        assert running.stats().get("heartbeat_timeouts", 0) == 0
        conn.disconnect()
    finally:
        running.stop()
