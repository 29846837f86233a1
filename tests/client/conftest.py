"""Fixtures for the client tests: an asyncio test runner and a small scripted STOMP server.

`async def` tests in this directory run on an asyncio loop and on a uvloop loop, each with a time
limit. After the test body the runner fails the test if any task is left pending or the loop
reported an error (such as an exception never retrieved): the client must clean up after itself.

`FakeBroker` speaks STOMP through the same sans-IO `StompConnection`, in the server role, on
127.0.0.1 port 0. It routes SENDs to matching SUBSCRIBEs (a MESSAGE goes out before the SEND's
RECEIPT), keeps transactions, records every frame and heart-beat it receives and every frame it
sends, and lets a test refuse, hold, or fail frames and drop connections.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import socket
from collections.abc import Callable, Coroutine
from typing import Any, cast

import pytest
import uvloop

from sluice.stomp.connection import ConnState, Role, StompConnection
from sluice.stomp.frames import Command, Frame, HeartBeat, Version

TEST_TIMEOUT_S = 20.0


async def _run_checked(coro: Coroutine[Any, Any, None]) -> None:
    loop = asyncio.get_running_loop()
    loop_errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    async with asyncio.timeout(TEST_TIMEOUT_S):
        await coro
    gc.collect()
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not leftover, f"tasks left pending: {leftover}"
    assert not loop_errors, f"event loop errors: {loop_errors}"


LOOP_KINDS = ("asyncio", "uvloop")


@pytest.fixture(autouse=True)
def event_loop_kind(request: pytest.FixtureRequest) -> str:
    """Which event loop an `async def` test runs on: each runs on both."""
    return str(getattr(request, "param", "asyncio"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if inspect.iscoroutinefunction(metafunc.function):
        metafunc.parametrize("event_loop_kind", LOOP_KINDS, indirect=True)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    loop_factory = None
    if pyfuncitem.funcargs.get("event_loop_kind") == "uvloop":
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_run_checked(pyfuncitem.obj(**kwargs)))
    return True


FrameHook = Callable[["FakeConnection", Frame], bool]


class FakeConnection(asyncio.Protocol):
    """The server end of one client connection."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.loop = asyncio.get_running_loop()
        self.conn = StompConnection(Role.SERVER)
        self.transport: asyncio.Transport | None = None
        self.received: list[Frame] = []
        self.sent: list[Frame] = []
        self.heartbeats = 0
        self.subscriptions: dict[str, dict[str, str]] = {}
        self.transactions: dict[str, list[Frame]] = {}
        self.write_paused = False
        self.pause_count = 0
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._ids = itertools.count(1)

    # Transport callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
        self.broker.connections.append(self)
        self.broker.notify()

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data, self.loop.time())
        while self.transport is not None and self.conn.state is not ConnState.ERROR:
            event = self.conn.next_event()
            if event is None:
                break
            if isinstance(event, HeartBeat):
                self.heartbeats += 1
            else:
                assert isinstance(event, Frame)
                self.received.append(event)
                hook = self.broker.frame_hook
                if hook is None or not hook(self, event):
                    self.broker.handle(self, event)
            self.broker.notify()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
        self.closed.set_result(None)
        self.broker.notify()

    def pause_writing(self) -> None:
        self.write_paused = True
        self.pause_count += 1
        self.broker.notify()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.broker.notify()

    # Writing.

    @property
    def version(self) -> Version:
        return self.conn.version

    def send(self, command: Command, headers: dict[str, str], body: bytes = b"") -> None:
        if self.transport is None:
            return
        frame = Frame(command, headers, body)
        self.sent.append(frame)
        self.transport.write(self.conn.send(frame))

    def receipt(self, frame: Frame) -> None:
        receipt_id = frame.headers.get("receipt")
        if receipt_id is not None:
            self.send(Command.RECEIPT, {"receipt-id": receipt_id})

    def error(self, message: str, receipt_id: str | None = None) -> None:
        if self.transport is None:
            return
        self.sent.append(Frame(Command.ERROR, {"message": message}))
        self.transport.write(self.conn.error_frame(message, receipt_id=receipt_id))
        self.transport.close()

    def deliver(
        self,
        sub_id: str,
        destination: str,
        body: bytes,
        headers: dict[str, str] | None = None,
    ) -> str:
        """Send a MESSAGE to subscription `sub_id`; return its message-id."""
        message_id = f"m-{next(self._ids)}"
        frame_headers = dict(headers or {})
        frame_headers.update(
            {"destination": destination, "message-id": message_id, "subscription": sub_id}
        )
        if self.version is Version.V1_2:
            frame_headers["ack"] = f"ack:{message_id}"
        self.send(Command.MESSAGE, frame_headers, body)
        return message_id

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _beat(self) -> None:
        self._timer = None
        negotiated = self.conn.negotiated
        if self.transport is None or negotiated is None or not self.broker.send_heartbeats:
            return
        self.transport.write(self.conn.heartbeat())
        self._timer = self.loop.call_later(negotiated.send_heartbeat_ms / 1000.0, self._beat)

    def accept(self, frame: Frame) -> None:
        assert self.transport is not None
        data = self.conn.accept(
            frame,
            server_heartbeat=self.broker.heartbeat_ms,
            server_name="fake",
            session=f"s-{len(self.broker.connections)}",
            supported=self.broker.versions,
        )
        self.transport.write(data)
        negotiated = self.conn.negotiated
        if negotiated is not None and negotiated.send_heartbeat_ms:
            self._timer = self.loop.call_later(negotiated.send_heartbeat_ms / 1000.0, self._beat)


class FakeBroker:
    """A scripted STOMP server for client tests; use as `async with FakeBroker() as broker`."""

    def __init__(
        self,
        *,
        versions: tuple[Version, ...] = (Version.V1_0, Version.V1_1, Version.V1_2),
        heartbeat_ms: tuple[int, int] = (0, 0),
        send_heartbeats: bool = True,
        refuse_connect: str | None = None,
    ) -> None:
        self.versions = versions
        self.heartbeat_ms = heartbeat_ms
        self.send_heartbeats = send_heartbeats
        self.refuse_connect = refuse_connect
        # SENDs to these destinations get an ERROR (with receipt-id when they had a receipt).
        self.fail_destinations: set[str] = set()
        # SENDs to these destinations are kept without a RECEIPT.
        self.hold_destinations: set[str] = set()
        self.frame_hook: FrameHook | None = None
        self.connections: list[FakeConnection] = []
        self.routed: list[Frame] = []
        self._server: asyncio.Server | None = None
        self._changed = asyncio.Event()
        self.port = 0

    async def __aenter__(self) -> FakeBroker:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: FakeConnection(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for connection in self.connections:
            connection.drop()
        for connection in self.connections:
            await connection.closed

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def last(self) -> FakeConnection:
        return self.connections[-1]

    def notify(self) -> None:
        self._changed.set()

    async def wait_for(self, predicate: Callable[[], object], timeout: float = 5.0) -> None:
        """Wait until `predicate()` is true; it is checked after every change seen here."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    def frames(self, command: Command, connection: FakeConnection | None = None) -> list[Frame]:
        sources = [connection] if connection is not None else self.connections
        return [f for c in sources for f in c.received if f.command is command]

    def route(self, frame: Frame) -> None:
        destination = frame.headers["destination"]
        self.routed.append(frame)
        headers = {
            k: v
            for k, v in frame.headers.items()
            if k not in ("destination", "receipt", "transaction", "content-length")
        }
        for connection in self.connections:
            if connection.transport is None or connection.conn.state is not ConnState.CONNECTED:
                continue
            for sub_id, sub in connection.subscriptions.items():
                if sub["destination"] == destination:
                    connection.deliver(sub_id, destination, frame.body, headers)
                    if destination.startswith("/queue/"):
                        return

    def handle(self, connection: FakeConnection, frame: Frame) -> None:
        command = frame.command
        headers = frame.headers
        if command in (Command.CONNECT, Command.STOMP):
            if self.refuse_connect is not None:
                connection.error(self.refuse_connect)
            else:
                connection.accept(frame)
            return
        if command is Command.SEND:
            destination = headers["destination"]
            if destination in self.fail_destinations:
                connection.error(f"refused {destination}", receipt_id=headers.get("receipt"))
                return
            if destination in self.hold_destinations:
                return
            transaction = headers.get("transaction")
            if transaction is not None:
                connection.transactions[transaction].append(frame)
            else:
                self.route(frame)
        elif command is Command.SUBSCRIBE:
            connection.subscriptions[headers["id"]] = dict(headers)
        elif command is Command.UNSUBSCRIBE:
            connection.subscriptions.pop(headers["id"], None)
        elif command is Command.BEGIN:
            connection.transactions[headers["transaction"]] = []
        elif command is Command.COMMIT:
            for sent in connection.transactions.pop(headers["transaction"]):
                self.route(sent)
        elif command is Command.ABORT:
            connection.transactions.pop(headers["transaction"])
        connection.receipt(frame)
        if command is Command.DISCONNECT and connection.transport is not None:
            connection.transport.close()


@pytest.fixture
def fake_broker() -> type[FakeBroker]:
    """The `FakeBroker` class, to make brokers with `async with fake_broker(...) as broker`."""
    return FakeBroker


@pytest.fixture
def refused_address() -> str:
    """A 127.0.0.1 address where nothing listens (connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"
