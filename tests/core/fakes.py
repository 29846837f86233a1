"""Fakes for testing the core without sockets or an event loop."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

from sluice import config as config_mod
from sluice.core.broker import Broker
from sluice.core.connection import BrokerConnection
from sluice.core.message import Message
from sluice.core.services import FlowReason
from sluice.core.subscription import Subscription
from sluice.store.api import MessageStore, WriteHandle
from sluice.store.memory import MemoryStore


class FakeTimer:
    """A timer the test fires by hand."""

    def __init__(self, delay: float, callback: Callable[[], object]) -> None:
        self.delay = delay
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """call_soon into a queue that the test runs explicitly."""

    def __init__(self) -> None:
        self.ready: deque[Callable[[], object]] = deque()
        self.timers: list[FakeTimer] = []

    def call_soon(self, callback: Callable[[], object], /) -> None:
        self.ready.append(callback)

    def call_soon_threadsafe(self, callback: Callable[[], object], /) -> None:
        self.ready.append(callback)

    def call_later(self, delay: float, callback: Callable[[], object], /) -> FakeTimer:
        timer = FakeTimer(delay, callback)
        self.timers.append(timer)
        return timer

    def fire_timers(self) -> None:
        """Run every timer that is due now (the test moves time by firing them)."""
        timers, self.timers = self.timers, []
        for timer in timers:
            if not timer.cancelled:
                timer.callback()
        self.run()

    def run(self, limit: int = 100_000) -> None:
        """Run callbacks until none is left."""
        for _ in range(limit):
            if not self.ready:
                return
            self.ready.popleft()()
        raise AssertionError("callbacks keep scheduling themselves")


class FakeLink:
    """Collects deliveries; writability and producer pauses are visible to the test."""

    def __init__(self) -> None:
        self.delivered: list[tuple[str, Message, int, int]] = []
        self.writable = True
        self.paused: set[FlowReason] = set()

    def deliver(self, sub: Subscription, message: Message, tag: int, delivery_count: int) -> None:
        self.delivered.append((sub.id, message, tag, delivery_count))

    def pause_producer(self, reason: FlowReason) -> None:
        self.paused.add(reason)

    def resume_producer(self, reason: FlowReason) -> None:
        self.paused.discard(reason)

    @property
    def reading_paused(self) -> bool:
        return bool(self.paused)

    def bodies(self) -> list[bytes]:
        return [m.body for _, m, _, _ in self.delivered]

    def take(self) -> list[tuple[str, Message, int, int]]:
        out, self.delivered = self.delivered, []
        return out


def paging_store() -> MemoryStore:
    """A memory store the broker pages to as it would to the journal."""
    store = MemoryStore()
    store.capabilities = dataclasses.replace(store.capabilities, pages_to_disk=True)
    return store


class Harness:
    """A broker on the memory store with a fake loop and a fake clock. Pass `message_store` to
    share one between harnesses: a second harness on it is the broker restarted after a crash."""

    def __init__(self, message_store: MessageStore | None = None, **overrides: Any) -> None:
        self.loop = FakeLoop()
        self.now = 1_000_000
        self.config = config_mod.load(env={}, overrides={"store": {"kind": "memory"}, **overrides})
        self.store = message_store if message_store is not None else MemoryStore()
        self.broker = Broker(self.config, self.store, self.loop, now_ms=lambda: self.now)
        self.broker.open()
        self.loop.run()
        self.receipts: list[str] = []

    def connect(self, client_id: str | None = None) -> tuple[BrokerConnection, FakeLink]:
        link = FakeLink()
        return BrokerConnection(self.broker, link, client_id), link

    def message(self, dest: str, body: bytes, **kw: Any) -> Message:
        headers = kw.pop("headers", {})
        return Message(dest, 0, self.broker.new_message_id(), self.now, headers, body, **kw)

    def send(
        self, conn: BrokerConnection, dest: str, body: bytes, txid: str | None = None, **kw: Any
    ) -> Message:
        message = self.message(dest, body, **kw)

        def stored(handle: WriteHandle | None) -> None:
            self.receipts.append(message.message_id)

        conn.send(message, stored, txid)
        self.loop.run()
        return message
