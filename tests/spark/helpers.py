"""Helpers shared by the Spark tests: publishing to a topic and draining a queue, off Spark."""

from __future__ import annotations

import time
import uuid
from typing import Any

from conftest import RunningBroker
from sluice.spark.options import sink_options
from sluice.spark.produce import send_transaction
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command

# How long a drain waits for the messages it expects.
WAIT_S = 60.0


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
    """Every MESSAGE on `queue`: at least `expected` (waiting up to `WAIT_S` for them, however
    slow the machine), then whatever comes within `quiet_s`."""
    frames = []
    deadline = time.monotonic() + WAIT_S
    with WireSession.open(broker) as session:
        session.request(Command.SUBSCRIBE, {"destination": queue, "id": "1", "ack": "auto"})
        while True:
            short = len(frames) < expected
            session.set_timeout(max(0.01, deadline - time.monotonic()) if short else quiet_s)
            try:
                frames.append(session.receive())
            except TimeoutError:
                if len(frames) >= expected:
                    break
                raise AssertionError(
                    f"{queue}: {len(frames)} messages, expected {expected}"
                ) from None
    return frames
