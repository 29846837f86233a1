"""The emptiness check: after the consumers of a queue left, drain it up to a marker sent last.

Consumers acknowledge what they received and disconnect with a receipt before the check starts,
so anything the broker still holds for the queue is a message it never delivered, or one it
delivered and would deliver again (an acknowledgement it lost). The check sends an end marker to
the queue (with a receipt), then subscribes (ack `auto`) and receives until that marker arrives:
on a FIFO queue nothing the broker held can be behind it, and a redelivered message goes back
ahead of it. What it drains is returned as a `SeenTracker`, which `verify` sets against what the
consumers received: a late duplicate, or a message left queued.

It gives up when nothing arrives for `idle_timeout_s`, and says so: a check that could not finish
fails the run.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from sluice.bench.channel import Channel
from sluice.bench.payload import CHECK_PRODUCER, HEAD_STRUCT, MAGIC, MARKER_MAGIC, encode_marker
from sluice.bench.payload import filler as make_filler
from sluice.bench.stats import SeenTracker
from sluice.bench.stomplink import BrokerTarget, LinkError, StompLink, open_link
from sluice.stomp import Command, Frame

__all__ = ["QueueCheck", "run_queue_check"]

_DISCONNECT_TIMEOUT_S = 5.0
_TOKEN_BITS = 62
# Headers the check sets itself; a user's extra SEND or SUBSCRIBE header of these names is dropped.
_OWN_SEND_HEADERS = frozenset({"destination", "receipt", "content-length", "persistent"})
_OWN_SUBSCRIBE_HEADERS = frozenset({"id", "destination", "ack", "receipt"})


class QueueCheck:
    """Drains one queue up to its own marker and records what came before it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.address = BrokerTarget.from_spec(spec)
        self.destination = str(spec["destination"])
        self.size = int(spec["size"])
        self.persistent = bool(spec.get("persistent", False))
        self.send_headers: dict[str, str] = dict(spec.get("send_headers", {}))
        self.subscribe_headers: dict[str, str] = dict(spec.get("subscribe_headers", {}))
        self.connect_timeout_s = float(spec.get("connect_timeout_s", 10.0))
        self.idle_timeout_s = float(spec.get("idle_timeout_s", 10.0))
        self.tracker = SeenTracker(spec["per_producer"])
        self.drained = 0
        self.failure: str | None = None
        self._token = secrets.randbits(_TOKEN_BITS)
        self._filler = make_filler(self.size)
        self._found = asyncio.Event()

    def _message(self, frame: Frame, now_ns: int) -> None:
        del now_ns
        body = frame.body
        tracker = self.tracker
        if not (len(body) == self.size and body.endswith(self._filler)):
            tracker.corrupt += 1
            self.drained += 1
            return
        magic, producer, seq, _, _ = HEAD_STRUCT.unpack_from(body)
        if magic == MARKER_MAGIC and producer == CHECK_PRODUCER and seq == self._token:
            self._found.set()
            return
        self.drained += 1
        if magic == MAGIC:
            tracker.add(producer, seq)
        elif magic == MARKER_MAGIC:
            # A producer's end marker still queued: delivered twice, or never.
            tracker.duplicates += 1
        else:
            tracker.corrupt += 1

    async def run(self) -> dict[str, Any]:
        """Run the check; the result (JSON-safe) says what was drained and whether it finished."""
        try:
            link = await open_link(self.address, "queue check", self.connect_timeout_s)
        except (LinkError, OSError) as exc:
            self.failure = f"queue check could not connect: {exc}"
            return self.result()
        link.on_message = self._message
        try:
            await self._drain(link)
        except LinkError as exc:
            self.failure = f"queue check failed: {exc}"
        finally:
            await link.disconnect(_DISCONNECT_TIMEOUT_S)
        return self.result()

    async def _drain(self, link: StompLink) -> None:
        headers = {k: v for k, v in self.send_headers.items() if k not in _OWN_SEND_HEADERS}
        headers["destination"] = self.destination
        if self.persistent:
            headers["persistent"] = "true"
        marker = encode_marker(CHECK_PRODUCER, self._token, time.monotonic_ns(), self.size)
        await link.request(Command.SEND, headers, "check-marker", self.connect_timeout_s, marker)
        subscribe = {
            k: v for k, v in self.subscribe_headers.items() if k not in _OWN_SUBSCRIBE_HEADERS
        }
        subscribe.update(id="check", destination=self.destination, ack="auto")
        await link.request(Command.SUBSCRIBE, subscribe, "check-sub", self.connect_timeout_s)
        seen = -1
        while not self._found.is_set():
            if self.drained == seen:
                self.failure = (
                    f"queue check: its marker did not come back within {self.idle_timeout_s:g} s "
                    f"({self.drained} message(s) drained before giving up)"
                )
                return
            seen = self.drained
            try:
                await asyncio.wait_for(self._found.wait(), self.idle_timeout_s)
            except TimeoutError:
                link.check()

    def result(self) -> dict[str, Any]:
        """What the check found, JSON-safe."""
        return {
            "destination": self.destination,
            "finished": self._found.is_set(),
            "drained": self.drained,
            "tracker": self.tracker.to_dict(),
            "failure": self.failure,
        }


async def run_queue_check(channel: Channel, spec: dict[str, Any]) -> None:
    """The body of a check worker: run the check and send its result."""
    result = await QueueCheck(spec).run()
    channel.send({"event": "result", "producers": [], "consumers": [], "check": result})
