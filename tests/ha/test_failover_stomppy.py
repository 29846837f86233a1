"""The stomp.py recipe of docs/high-availability.md against a master killed with SIGKILL: a host
list, and a listener that connects again, subscribes again and resends what was not receipted
with its `x-dedup-id`. Every receipted message is delivered, none twice unless redelivered."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import stomp

from ha.harness import ha_pair

pytestmark = pytest.mark.crash

QUEUE = "/queue/ha-stomppy"


class Failover(stomp.ConnectionListener):  # type: ignore[misc]
    """The documented listener, recording what it sees for the test."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.unconfirmed: dict[str, str] = {}
        self.receipts: queue.Queue[str] = queue.Queue()
        self.deliveries: dict[str, list[bool]] = {}
        self.delivered: queue.Queue[str] = queue.Queue()
        self.reconnects = 0
        self.closing = False
        self.reconnecting = threading.Lock()

    def start(self) -> None:
        self.conn.connect(wait=True, headers={"client-id": "ha-stomppy"})
        self.conn.subscribe(QUEUE, id="orders", ack="client-individual")

    def send(self, body: str) -> None:
        with self.lock:
            self.unconfirmed[body] = body
        self._send(body)

    def _send(self, body: str) -> None:
        headers = {"persistent": "true", "x-dedup-id": body}
        self.conn.send(QUEUE, body, headers=headers, receipt=body)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.unconfirmed.pop(frame.headers["receipt-id"], None)
        self.receipts.put(frame.headers["receipt-id"])

    def on_message(self, frame: Any) -> None:
        with self.lock:
            flags = self.deliveries.setdefault(frame.body, [])
            flags.append(frame.headers.get("redelivered") == "true")
        self.conn.ack(frame.headers["ack"])
        self.delivered.put(frame.body)

    def on_disconnected(self) -> None:
        # Not on stomp.py's receiver thread, which is ending: a thread of its own.
        if not self.closing:
            threading.Thread(target=self._reconnect, daemon=True).start()

    def _reconnect(self) -> None:
        with self.reconnecting:
            if self.closing or self.conn.is_connected():
                return
            while True:
                try:
                    self.start()
                    break
                except (stomp.exception.StompException, OSError):
                    # A broker dying as it accepted the connection; the list is walked again.
                    time.sleep(0.2)
            self.reconnects += 1
            with self.lock:
                pending = list(self.unconfirmed)
            for body in pending:
                self._send(body)


def test_stomppy_host_list_fails_over(tmp_path: Path) -> None:
    with ha_pair(tmp_path, lease_s=5) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log("waiting for the lease")
        hosts = [("127.0.0.1", pair.ports["a"]), ("127.0.0.1", pair.ports["b"])]
        conn = stomp.Connection12(hosts, reconnect_attempts_max=-1, reconnect_sleep_initial=0.05)
        listener = Failover(conn)
        conn.set_listener("failover", listener)
        listener.start()
        try:
            for n in range(20):
                listener.send(f"m-{n}")
                assert listener.receipts.get(timeout=10) == f"m-{n}"
            # Sent, not receipted yet, as the master dies.
            for n in range(20, 30):
                listener.send(f"m-{n}")
            master.kill()
            slave.wait_listening()
            bodies = {f"m-{n}" for n in range(30)}
            seen: set[str] = set()
            while not bodies <= seen:
                seen.add(listener.delivered.get(timeout=30))
            assert listener.reconnects >= 1
            with listener.lock:
                assert not listener.unconfirmed
                doubled = {b: f for b, f in listener.deliveries.items() if not all(f[1:])}
            assert not doubled
        finally:
            listener.closing = True
            conn.disconnect()
        assert slave.stop() == 0
