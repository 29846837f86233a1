"""Helpers shared by the Spark tests: publishing to a topic and draining a queue, off Spark."""

from __future__ import annotations

import uuid
from typing import Any

from conftest import RunningBroker
from sluice.spark.options import sink_options
from sluice.spark.produce import send_transaction
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command


def publish(
    broker: RunningBroker,
    topic: str,
    bodies: list[bytes],
    *,
    persistent: bool = True,
    **headers: str,
) -> None:
    """Send `bodies` to `topic` in one transaction, each with `headers` and its index as `n`."""
    options = sink_options(
        {"broker": broker.address, "destination": topic, "persistent": str(persistent)}
    )
    rows = ((None, {**headers, "n": str(i)}, body) for i, body in enumerate(bodies))
    send_transaction(options, rows, f"test-{uuid.uuid4().hex}:")


def drain_queue(broker: str, queue: str, expected: int, *, quiet_s: float = 2.0) -> list[Any]:
    """Every MESSAGE on `queue`: at least `expected`, then whatever comes within `quiet_s`."""
    frames = []
    with WireSession.open(broker) as session:
        session.request(Command.SUBSCRIBE, {"destination": queue, "id": "1", "ack": "auto"})
        session.set_timeout(quiet_s)
        while True:
            try:
                frames.append(session.receive())
            except TimeoutError:
                if len(frames) >= expected:
                    break
                raise AssertionError(
                    f"{queue}: {len(frames)} messages, expected {expected}"
                ) from None
    return frames
