"""A broker that loses, duplicates, strands or reorders messages: `sluice bench` says what happened.

The broker here is a small scripted STOMP server (the sans-IO `StompConnection` in the server
role) on its own loop thread, so the bench's worker processes reach it over real sockets. It keeps
what it holds for a destination nobody subscribes to for the next subscription, in order, like a
FIFO queue, and its faults are:

- `drop`: message 5 is never delivered;
- `duplicate`: message 7 is delivered twice at once;
- `late-duplicate`: message 7 is delivered again 0.2 s after the end marker (seen only by going on
  receiving after the last expected message);
- `leftover`: message 7 is delivered, and a copy stays queued (as if its acknowledgement was lost),
  for whoever subscribes next (seen only by draining the queue after the run);
- `strand`: message 5 stays queued instead of being delivered;
- `reorder`: message 0 of each destination is held until message 1 went out (or until the end
  marker arrives, as `late`);
- `late`: message 0 of each destination is held until the end marker arrives, then both go out
  0.2 s later (a slow broker, not a lossy one);
- `late-duplicate-before-marker`: message 0 is delivered again 0.2 s after the end marker arrives,
  just ahead of it;
- `drop-markers`: end markers are never delivered;
- `late-receipt`: the RECEIPT of each producer's tenth measured message (`m9`) is written 0.2 s
  after the message was delivered (a consumer has it long before its producer's receipt).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from sluice.bench.payload import HEAD_STRUCT, MARKER_MAGIC
from sluice.cli import main
from sluice.stomp import Command, Frame, Role, StompConnection

DROPPED_SEQ = 5
DOUBLED_SEQ = 7
LATE_DELAY_S = 0.2
LATE_RECEIPT = "m9"


class _Session(asyncio.Protocol):
    def __init__(self, broker: _FaultyBroker) -> None:
        self.broker = broker
        self.conn = StompConnection(Role.SERVER)
        self.transport: asyncio.Transport | None = None
        self.delivered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data, 0.0)
        while self.transport is not None and (event := self.conn.next_event()) is not None:
            if isinstance(event, Frame):
                self._handle(event)

    def _write(self, command: Command, headers: dict[str, str], body: bytes = b"") -> None:
        assert self.transport is not None
        self.transport.write(self.conn.send(Frame(command, headers, body)))

    def _handle(self, frame: Frame) -> None:
        assert self.transport is not None
        command = frame.command
        if command is Command.CONNECT:
            self.transport.write(
                self.conn.accept(frame, server_heartbeat=(0, 0), server_name="faulty", session="s")
            )
            return
        receipt = frame.headers.get("receipt")
        if command is Command.SUBSCRIBE:
            # Confirm first, then hand over what was kept for the next subscription.
            if receipt is not None:
                self._write(Command.RECEIPT, {"receipt-id": receipt})
            self.broker.subscribe(self, frame.headers["destination"], frame.headers["id"])
            return
        if command is Command.SEND:
            self.broker.route(frame)
        if receipt is not None and self.broker.fault == "late-receipt" and receipt == LATE_RECEIPT:
            asyncio.get_running_loop().call_later(LATE_DELAY_S, self._late_receipt, receipt)
        elif receipt is not None:
            self._write(Command.RECEIPT, {"receipt-id": receipt})
        if command is Command.DISCONNECT:
            self.broker.unsubscribe(self)
            self.transport.close()

    def _late_receipt(self, receipt: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._write(Command.RECEIPT, {"receipt-id": receipt})

    def deliver(self, sub_id: str, frame: Frame) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        self.delivered += 1
        headers = {
            "destination": frame.headers["destination"],
            "message-id": f"m-{self.delivered}",
            "subscription": sub_id,
            "ack": f"a-{self.delivered}",
        }
        self._write(Command.MESSAGE, headers, frame.body)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.unsubscribe(self)
        self.transport = None


class _FaultyBroker:
    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.subscribers: dict[str, tuple[_Session, str]] = {}
        # Per destination: frames for the next subscription, in order.
        self.kept: dict[str, list[Frame]] = {}
        # Per destination: a message held back by `reorder` or `late`.
        self.held: dict[str, Frame] = {}
        self.copies: dict[str, Frame] = {}
        self.port = 0

    def subscribe(self, session: _Session, destination: str, sub_id: str) -> None:
        self.subscribers[destination] = (session, sub_id)
        for frame in self.kept.pop(destination, []):
            session.deliver(sub_id, frame)

    def unsubscribe(self, session: _Session) -> None:
        for destination, (owner, _) in list(self.subscribers.items()):
            if owner is session:
                del self.subscribers[destination]

    def _deliver(self, frame: Frame) -> None:
        destination = frame.headers["destination"]
        target = self.subscribers.get(destination)
        delivered = target is not None and target[0].deliver(target[1], frame)
        # A topic keeps nothing for later subscribers.
        if not delivered and destination.startswith("/queue/"):
            self.kept.setdefault(destination, []).append(frame)

    def _keep(self, frame: Frame) -> None:
        self.kept.setdefault(frame.headers["destination"], []).append(frame)

    def route(self, frame: Frame) -> None:
        destination = frame.headers["destination"]
        magic, _, seq = HEAD_STRUCT.unpack_from(frame.body)[:3]
        fault = self.fault
        if magic == MARKER_MAGIC:
            if fault == "drop-markers":
                return
            held = self.held.pop(destination, None)
            if fault == "late-duplicate-before-marker":
                held = self.copies.pop(destination, None)
            if held is not None:
                # Both a while later: only waiting for the marker sees the message.
                loop = asyncio.get_running_loop()
                loop.call_later(LATE_DELAY_S, self._deliver, held)
                loop.call_later(LATE_DELAY_S, self._deliver, frame)
                return
            self._deliver(frame)
            if fault == "late-duplicate" and destination in self.copies:
                copy = self.copies.pop(destination)
                asyncio.get_running_loop().call_later(LATE_DELAY_S, self._deliver, copy)
            return
        if fault == "drop" and seq == DROPPED_SEQ:
            return
        if fault == "strand" and seq == DROPPED_SEQ:
            self._keep(frame)
            return
        if fault in ("reorder", "late") and seq == 0:
            self.held[destination] = frame
            return
        self._deliver(frame)
        if fault == "reorder" and seq == 1 and destination in self.held:
            self._deliver(self.held.pop(destination))
        if seq == DOUBLED_SEQ and fault in ("duplicate", "leftover"):
            (self._deliver if fault == "duplicate" else self._keep)(frame)
        if seq == DOUBLED_SEQ and fault == "late-duplicate":
            self.copies[destination] = frame
        if seq == 0 and fault == "late-duplicate-before-marker":
            self.copies[destination] = frame


@pytest.fixture
def faulty_broker(request: pytest.FixtureRequest) -> Iterator[_FaultyBroker]:
    broker = _FaultyBroker(request.param)
    started: Future[None] = Future()
    stop: Future[None] = Future()

    def run() -> None:
        async def serve() -> None:
            loop = asyncio.get_running_loop()
            server = await loop.create_server(lambda: _Session(broker), "127.0.0.1", 0)
            broker.port = server.sockets[0].getsockname()[1]
            started.set_result(None)
            await asyncio.wrap_future(stop)
            server.close()

        asyncio.run(serve())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.result(10)
    try:
        yield broker
    finally:
        stop.set_result(None)
        thread.join(10)


def _bench(broker: _FaultyBroker, tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "result.json"
    address = f"127.0.0.1:{broker.port}"
    code = main(["bench", *argv, "--broker", address, "--json", str(out), "--timeout", "60"])
    return code, json.loads(out.read_text())["results"]


@pytest.mark.parametrize(
    ("faulty_broker", "missing", "duplicates", "late", "left_queued"),
    [
        ("none", 0, 0, 0, 0),
        ("drop", 1, 0, 0, 0),
        ("duplicate", 0, 1, 0, 0),
        ("late-duplicate", 0, 1, 1, 0),
        ("leftover", 0, 1, 1, 0),
        ("strand", 1, 0, 0, 1),
    ],
    indirect=["faulty_broker"],
)
def test_queue_faults_fail_the_run(
    faulty_broker: _FaultyBroker,
    missing: int,
    duplicates: int,
    late: int,
    left_queued: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, results = _bench(
        faulty_broker,
        tmp_path,
        *("throughput", "--count", "50", "--size", "64"),
        *("--idle-timeout", "2", "--drain-grace", "1.5"),
    )
    verification = results["verification"]
    assert verification["missing"] == missing
    assert verification["duplicates"] == duplicates
    assert verification["late_duplicates"] == late
    assert verification["left_queued"] == left_queued
    assert verification["queue_checked"] is True
    assert verification["reordered"] == 0
    if missing:
        assert verification["missing_examples"] == {"0": [DROPPED_SEQ]}
    assert verification["ok"] == (not missing and not duplicates)
    assert code == (0 if verification["ok"] else 1)
    err = capsys.readouterr().err
    if missing:
        assert "1 missing" in err
    if duplicates:
        assert f"1 duplicates ({late} late)" in err
    if left_queued:
        assert "1 left in the queue" in err


@pytest.mark.parametrize("faulty_broker", ["late-duplicate"], indirect=True)
def test_late_duplicates_on_a_topic_are_seen_in_the_grace_period(
    faulty_broker: _FaultyBroker, tmp_path: Path
) -> None:
    # Nothing to drain afterwards on a topic: only going on receiving sees the late copy.
    code, results = _bench(
        faulty_broker,
        tmp_path,
        *("throughput", "--count", "50", "--size", "64", "--destination", "/topic/faulty"),
        *("--idle-timeout", "2", "--drain-grace", "1.5"),
    )
    assert code == 1
    verification = results["verification"]
    assert (verification["duplicates"], verification["late_duplicates"]) == (1, 1)
    assert verification["queue_checked"] is None
    assert results["queue_checks"] is None


@pytest.mark.parametrize("faulty_broker", ["drop-markers"], indirect=True)
def test_end_markers_that_never_arrive_fail_the_run(
    faulty_broker: _FaultyBroker, tmp_path: Path
) -> None:
    code, results = _bench(
        faulty_broker,
        tmp_path,
        *("throughput", "--count", "20", "--size", "64", "--idle-timeout", "1"),
    )
    assert code == 1
    assert "end markers did not all reach the consumers within 1 s" in results["failure"]
    verification = results["verification"]
    assert verification["missing"] == 0
    assert verification["queue_checked"] is False
    assert "its marker did not come back within 1 s" in verification["check_failure"]


def _connections(broker: _FaultyBroker, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    return _bench(
        broker,
        tmp_path,
        *("connections", "--connections", "2", "--duration", "1"),
        # No grace period: what is counted is what came back before the end markers.
        *("--rate-per-connection", "10", "--marker-timeout", "10", "--drain-grace", "0"),
    )


@pytest.mark.parametrize("faulty_broker", ["reorder"], indirect=True)
def test_reordered_messages_are_not_duplicates(
    faulty_broker: _FaultyBroker, tmp_path: Path
) -> None:
    code, results = _connections(faulty_broker, tmp_path)
    assert code == 0, results["failure"]
    assert results["reordered"] == 2  # message 0 after message 1, on each connection
    assert results["duplicates"] == 0
    assert results["missing"] == 0
    assert results["received"] == results["sent"] > 2


@pytest.mark.parametrize("faulty_broker", ["late"], indirect=True)
def test_a_late_message_is_waited_for(faulty_broker: _FaultyBroker, tmp_path: Path) -> None:
    code, results = _connections(faulty_broker, tmp_path)
    assert code == 0, results["failure"]
    assert results["missing"] == 0
    assert results["markers_missing"] == 0


@pytest.mark.parametrize("faulty_broker", ["late-duplicate-before-marker"], indirect=True)
def test_late_duplicates_of_held_connections_fail_the_run(
    faulty_broker: _FaultyBroker, tmp_path: Path
) -> None:
    code, results = _connections(faulty_broker, tmp_path)
    assert code == 1
    assert results["duplicates"] == 2
    assert results["late_duplicates"] == 2
    assert results["reordered"] == 0
    assert "2 duplicated (2 late)" in results["failure"]


@pytest.mark.parametrize("faulty_broker", ["drop-markers"], indirect=True)
def test_markers_that_never_come_back_fail_the_run(
    faulty_broker: _FaultyBroker, tmp_path: Path
) -> None:
    code, results = _bench(
        faulty_broker,
        tmp_path,
        *("connections", "--connections", "2", "--duration", "0.5"),
        *("--rate-per-connection", "4", "--marker-timeout", "0.5", "--drain-grace", "0"),
    )
    assert code == 1
    assert results["markers_missing"] == 2
    assert "2 end markers did not come back" in results["failure"]


@pytest.mark.parametrize("faulty_broker", ["late-receipt"], indirect=True)
def test_sync_sends_are_timed_to_the_last_receipt(
    faulty_broker: _FaultyBroker, tmp_path: Path
) -> None:
    # The consumer has every message 0.2 s before the producers have their last receipts: the
    # run waits for those receipts, and the measured window ends with them.
    code, results = _bench(
        faulty_broker,
        tmp_path,
        *("sync", "--producers", "2", "--count", "20", "--size", "64", "--drain-grace", "0"),
    )
    assert code == 0, results["failure"]
    assert results["errors"] == []
    assert results["sent"] == 20
    assert results["send_elapsed_s"] >= LATE_DELAY_S
    assert results["receipt_latency_ms"]["count"] == 20
    assert results["receipt_latency_ms"]["max"] >= LATE_DELAY_S * 1000
    assert results["cpu"]["measured"]["wall_s"] >= LATE_DELAY_S
