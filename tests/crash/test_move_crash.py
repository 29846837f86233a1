"""A move through the management API killed half way: a broker on the journal in a subprocess
moves 20,000 persistent messages to another queue (twenty steps, each one store transaction),
and is killed with SIGKILL as soon as a step is written. After the restart each
message is in exactly one of the two queues: the steps whose COMMIT was written are moved, the
one that was not left nothing behind in the target, and nothing was lost."""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from management.conftest import Http
from rawstomp import RawStomp
from waiting import wait_until

pytestmark = pytest.mark.crash

COUNT = 20_000
_HTTP = re.compile(r"management API on http://127\.0\.0\.1:(\d+)/")


def _fill(port: int) -> None:
    client = RawStomp(port, timeout=60)
    client.connect()
    batch = []
    for i in range(COUNT):
        receipt = "receipt:all\n" if i == COUNT - 1 else ""
        batch.append(f"SEND\ndestination:/queue/src\npersistent:true\n{receipt}\nm{i}\0".encode())
        if len(batch) == 500 or i == COUNT - 1:
            client.send(b"".join(batch))
            batch = []
    assert client.frame().command == "RECEIPT"
    client.sock.close()


def _drain(port: int, queue: str) -> list[str]:
    client = RawStomp(port, timeout=60)
    client.connect()
    client.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:auto\nreceipt:sub\n\n\0".encode())
    bodies = []
    frame = client.frame()
    assert frame.command == "RECEIPT"
    while True:
        try:
            frame = client.frame(timeout=3.0)
        except TimeoutError:
            break
        bodies.append(frame.body.decode())
    client.sock.close()
    return bodies


def _start(tmp_path: Path) -> tuple[BrokerProcess, Http]:
    config = f'[store]\nkind = "journal"\ndata_dir = "{tmp_path / "data"}"\n'
    broker = BrokerProcess(config, tmp_path, "--http", "127.0.0.1:0").start()
    match = _HTTP.search(broker.log_text)
    assert match, broker.log_text
    return broker, Http(int(match.group(1)))


def test_a_move_killed_half_way_leaves_each_message_in_one_place(tmp_path: Path) -> None:
    broker, http = _start(tmp_path)
    try:
        _fill(broker.port)

        def move() -> None:
            with contextlib.suppress(OSError):  # the broker is killed under it
                http.post(
                    "/api/destinations/queue/src/messages/move", {"all": True, "to": "/queue/dst"}
                )

        mover = threading.Thread(target=move, daemon=True)
        mover.start()

        def some_moved() -> bool:
            # A step takes its messages out of the source at once and runs its COMMIT; the
            # next begins once that is written: 2,000 gone means one step at least is moved.
            reply = http.get("/api/destinations/queue/src")
            return reply.json["messages_ready"] <= COUNT - 2000

        wait_until(some_moved, timeout=60, what="the first steps moved")
        broker.kill()
        mover.join(30)
    finally:
        broker.kill()
    broker, http = _start(tmp_path)
    try:
        moved = _drain(broker.port, "/queue/dst")
        stayed = _drain(broker.port, "/queue/src")
    finally:
        assert broker.stop() == 0
    assert moved, "nothing was moved before the kill"
    assert stayed, "the move finished before the kill: nothing was cut half way"
    assert len(moved) % 1000 == 0, "a step is all or nothing"
    assert len(set(moved)) == len(moved)
    assert len(set(stayed)) == len(stayed)
    assert not set(moved) & set(stayed)
    assert set(moved) | set(stayed) == {f"m{i}" for i in range(COUNT)}
