"""Shared fixtures: a real broker on 127.0.0.1 port 0, run on its own event-loop thread so
blocking clients (stomp.py) and asyncio clients can both talk to it."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest
import uvloop

from pgserver import PgServer, unavailable_reason
from sluice import config as config_mod
from sluice.server.listener import BrokerServer
from sluice.server.stores import open_stores
from sluice.store.api import MessageStore

# Brokers the tests start as subprocesses serve their management API on a port of their own,
# never on the default 8161 (another broker, or another test run, may hold it).
os.environ.setdefault("SLUICE_HTTP__PORT", "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run soak and long crash loops")
    parser.addoption(
        "--seed",
        type=int,
        default=None,
        help="lifecycle simulations: replay this one seed (as printed by a failure)",
    )
    parser.addoption(
        "--sim-minutes",
        type=float,
        default=0.0,
        help="lifecycle simulations (with --run-slow): run random seeds for this many minutes",
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server of this test session (skips with the reason when none can start)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PgServer()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@dataclass
class RunningBroker:
    """A broker serving on a private loop thread."""

    server: BrokerServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    stopped: asyncio.Event

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run `fn` on the broker's loop and return its result (to inspect state safely)."""
        future: Future[Any] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def stats(self) -> dict[str, int]:
        """The broker's counters and gauges."""
        return self.call(self.server.broker.snapshot)  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Stop the broker and wait for its thread."""
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stopped.set)
            self.thread.join(30)


def start_broker(
    *,
    message_store: MessageStore | None = None,
    now_ms: Callable[[], int] | None = None,
    login_clock: Callable[[], float] | None = None,
    **overrides: Any,
) -> RunningBroker:
    """Start a broker (memory store, port 0 unless overridden) on its own loop thread;
    `message_store` replaces the store the configuration names, `now_ms` the broker's clock,
    `login_clock` the clock of failed-login lockouts. `acl=[...]` gives `[[acl]]` rules."""
    sections: dict[str, Any] = {"store": {"kind": "memory"}}
    if "listeners" not in overrides:
        sections["stomp"] = {"port": 0}
    for section, values in overrides.items():
        if isinstance(values, list):
            sections[section] = values  # an array of tables: [[acl]]
        else:
            sections.setdefault(section, {}).update(values)
    cfg = config_mod.load(env={}, overrides=sections)
    started: Future[RunningBroker] = Future()

    def run() -> None:
        # The broker runs on uvloop in production; test it on the same loop.
        loop = uvloop.new_event_loop()

        async def main() -> None:
            temp_store = None
            store = message_store
            if store is None:
                store, temp_store = open_stores(cfg)
            server = BrokerServer(
                cfg, store, temp_store=temp_store, now_ms=now_ms, login_clock=login_clock
            )
            await server.start()
            stopped = asyncio.Event()
            started.set_result(RunningBroker(server, loop, threading.current_thread(), stopped))
            await stopped.wait()
            await server.stop()

        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported through the future
            if not started.done():
                started.set_exception(exc)
            else:
                raise
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="broker", daemon=True)
    thread.start()
    return started.result(timeout=30)


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    """A fresh broker on the memory store."""
    running = start_broker()
    try:
        yield running
    finally:
        running.stop()
