"""A broker that loses or duplicates a message makes `sluice bench` fail, and say what happened.

The broker here is a small scripted STOMP server (the sans-IO `StompConnection` in the server
role) on its own loop thread, so the bench's worker processes reach it over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from sluice.bench.payload import HEAD_STRUCT
from sluice.cli import main
from sluice.stomp import Command, Frame, Role, StompConnection

DROPPED_SEQ = 5
DOUBLED_SEQ = 7


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
        if command is Command.SUBSCRIBE:
            self.broker.subscribers[frame.headers["destination"]] = (self, frame.headers["id"])
        elif command is Command.SEND:
            self.broker.route(frame)
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._write(Command.RECEIPT, {"receipt-id": receipt})
        if command is Command.DISCONNECT:
            self.transport.close()

    def deliver(self, sub_id: str, frame: Frame) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.delivered += 1
        headers = {
            "destination": frame.headers["destination"],
            "message-id": f"m-{self.delivered}",
            "subscription": sub_id,
            "ack": f"a-{self.delivered}",
        }
        self._write(Command.MESSAGE, headers, frame.body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class _FaultyBroker:
    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.subscribers: dict[str, tuple[_Session, str]] = {}
        self.port = 0

    def route(self, frame: Frame) -> None:
        target = self.subscribers.get(frame.headers["destination"])
        if target is None:
            return
        session, sub_id = target
        seq = HEAD_STRUCT.unpack_from(frame.body)[2]
        if self.fault == "drop" and seq == DROPPED_SEQ:
            return
        session.deliver(sub_id, frame)
        if self.fault == "duplicate" and seq == DOUBLED_SEQ:
            session.deliver(sub_id, frame)


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


@pytest.mark.parametrize(
    ("faulty_broker", "missing", "duplicates"),
    [("drop", 1, 0), ("duplicate", 0, 1), ("none", 0, 0)],
    indirect=["faulty_broker"],
)
def test_loss_and_duplicates_fail_the_run(
    faulty_broker: _FaultyBroker,
    missing: int,
    duplicates: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "result.json"
    argv = ["bench", "throughput", "--count", "50", "--size", "64", "--idle-timeout", "0.5"]
    code = main([*argv, "--broker", f"127.0.0.1:{faulty_broker.port}", "--json", str(out)])
    verification = json.loads(out.read_text())["results"]["verification"]
    assert verification["missing"] == missing
    assert verification["duplicates"] == duplicates
    if missing:
        assert verification["missing_examples"] == {"0": [DROPPED_SEQ]}
    assert verification["ok"] == (not missing and not duplicates)
    assert code == (0 if verification["ok"] else 1)
    err = capsys.readouterr().err
    if missing:
        assert "1 missing" in err
    if duplicates:
        assert "1 duplicates" in err
