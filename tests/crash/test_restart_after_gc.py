"""The broker starts again after collection left a gap in its journal.

The scenario, through real sockets with a broker subprocess: persistent 1 KiB messages to
`/queue/pending` are never consumed, so they pin `db-1.log`; persistent 64 KiB messages to
`/queue/big` are consumed and acknowledged, so collection removes the files after `db-1.log`.
The broker is stopped (SIGTERM, or SIGKILL as a crash), `sluice store verify` passes, and a new
broker on the same directory starts and delivers every pending message exactly once. Run once
with our client and once with stomp.py, a client we did not write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import stomp

from brokerproc import BrokerProcess
from sluice.client import BlockingClient
from sluice.store.journal.files import list_files
from sluice.store.journal.tools import verify
from waiting import wait_until

PENDING = "/queue/pending"
BIG = "/queue/big"
PENDING_COUNT = 8000
BIG_COUNT = 2000
WAIT_S = 60.0

pytestmark = pytest.mark.crash


def _config(data: Path) -> str:
    return f'[store]\nkind = "journal"\ndata_dir = "{data}"\ngc_interval_s = 2.0\n'


def _fill_ours(port: int) -> None:
    with BlockingClient(f"127.0.0.1:{port}") as client:
        for i in range(PENDING_COUNT):
            client.send(PENDING, f"p-{i}".encode() + b"." * 1020, persistent=True)
        body = b"b" * (64 * 1024)
        for _ in range(BIG_COUNT):
            client.send(BIG, body, persistent=True)
        sub = client.subscribe(BIG, ack="client-individual", prefetch=100)
        for _ in range(BIG_COUNT):
            message = sub.receive(timeout=WAIT_S)
            assert message is not None, "a big message was not delivered"
            client.ack(message)


class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Counts receipts and acknowledges every message of `/queue/big`."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cond = threading.Condition()
        self.receipts = 0
        self.acked = 0
        self.errors: list[str] = []

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts += 1
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        self.conn.ack(frame.headers["ack"])
        with self.cond:
            self.acked += 1
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame.body)
            self.cond.notify_all()

    def wait(self, what: str, condition: Callable[[], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: condition() or bool(self.errors), WAIT_S), what
            assert not self.errors, self.errors


def _fill_stomppy(port: int) -> None:
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    listener = _Listener(conn)
    conn.set_listener("l", listener)
    conn.connect(wait=True)
    try:
        for i in range(PENDING_COUNT):
            body = f"p-{i}" + "." * 1020
            conn.send(PENDING, body, headers={"persistent": "true", "receipt": f"p{i}"})
        body = "b" * (64 * 1024)
        for i in range(BIG_COUNT):
            conn.send(BIG, body, headers={"persistent": "true", "receipt": f"b{i}"})
        total = PENDING_COUNT + BIG_COUNT
        listener.wait("receipts", lambda: listener.receipts >= total)
        conn.subscribe(BIG, id="big", ack="client-individual")
        listener.wait("big messages", lambda: listener.acked >= BIG_COUNT)
    finally:
        conn.disconnect()


def _drain_pending(port: int) -> list[str]:
    bodies: list[str] = []
    with BlockingClient(f"127.0.0.1:{port}") as client:
        sub = client.subscribe(PENDING, ack="client-individual", prefetch=500)
        while True:
            message = sub.receive(timeout=2.0 if bodies else WAIT_S)
            if message is None:
                return bodies
            bodies.append(bytes(message.body).split(b".", 1)[0].decode())
            client.ack(message)


@pytest.mark.parametrize(
    ("fill", "crash"),
    [(_fill_ours, False), (_fill_stomppy, True)],
    ids=["sluice-client-sigterm", "stomppy-sigkill"],
)
def test_restart_after_gc_collected_files_behind_a_pinned_one(
    tmp_path: Path, fill: Callable[[int], None], crash: bool
) -> None:
    data = tmp_path / "data"
    journal = data / "journal"
    broker = BrokerProcess(_config(data), tmp_path).start()
    try:
        try:
            fill(broker.port)
        except BaseException:
            print(broker.log_text[-5000:])
            raise
        # The acks free db-2.log on; collection runs every 2 s.
        wait_until(lambda: list_files(journal)[:2] != [1, 2], WAIT_S, "collection after db-1.log")
    finally:
        if crash:
            broker.kill()
        else:
            assert broker.stop() == 0, broker.log_text
    files = list_files(journal)
    assert files[0] == 1, files
    assert files[1] > 2, f"collection left no gap: {files}"
    report = verify(data)
    assert report.ok, "\n".join(report.lines)

    broker = BrokerProcess(_config(data), tmp_path).start()
    try:
        bodies = _drain_pending(broker.port)
    finally:
        assert broker.stop() == 0, broker.log_text
    assert len(bodies) == PENDING_COUNT
    assert set(bodies) == {f"p-{i}" for i in range(PENDING_COUNT)}
