"""One worker process's share of the connections scenario (see `connections`).

Connection i subscribes to its own queue (ack=auto, with a receipt) and, between `start` and
`stop`, sends itself messages at its rate. On `stop` the traffic ends and every live connection
sends an end marker to its queue: one consumer on a FIFO queue, so the marker coming back proves
nothing it sent is still queued. Once every marker is back (or `marker_timeout_s` passed), the
worker goes on receiving for `drain_grace_s` to count late duplicates, then reports.

Each connection keeps a byte per message it sent to tell a duplicate (a sequence seen before)
from a message that came out of order (a new sequence below the highest seen): a reordered
message is counted as such, not as a duplicate, and is not a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

from sluice.bench.channel import Channel
from sluice.bench.limits import raise_open_files_limit
from sluice.bench.payload import HEAD_STRUCT, MAGIC, MARKER_MAGIC, filler
from sluice.bench.stats import LatencyHistogram
from sluice.bench.stomplink import BrokerTarget, LinkError, StompLink, open_link
from sluice.stomp import Command, Frame, encode_headers

__all__ = ["ConnectionsWorker"]

_NS_PER_US = 1000
_NS_PER_S = 1_000_000_000
_PROGRESS_INTERVAL_S = 1.0
_DISCONNECT_TIMEOUT_S = 5.0
_REASON_CHARS = 80
# How many sequence bytes a connection's record grows by at least.
_SEEN_GROWTH = 64
_PREFETCH = "10"


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    # Drop the per-connection name so equal failures count together.
    if ": " in text and text.startswith("conn "):
        text = text.split(": ", 1)[1]
    return text[:_REASON_CHARS]


class _Held:
    """One held connection and its own queue."""

    __slots__ = (
        "destination",
        "duplicates",
        "head",
        "index",
        "last_seq",
        "link",
        "marker_seen",
        "received",
        "reordered",
        "seen",
        "sent",
        "unexpected",
    )

    def __init__(self, index: int, link: StompLink, destination: str, size: int) -> None:
        self.index = index
        self.link = link
        self.destination = destination
        block = encode_headers(
            [("destination", destination), ("content-length", str(size))], link.version
        )
        self.head = b"SEND\n" + block + b"\n"
        self.sent = 0
        self.received = 0
        self.duplicates = 0
        self.reordered = 0
        self.unexpected = 0
        self.last_seq = -1
        # A byte per sequence received, grown as sequences come in (at most `sent` of them).
        self.seen = bytearray()
        self.marker_seen = False


class ConnectionsWorker:
    """A share of the connections, in one worker process."""

    def __init__(self, channel: Channel, spec: dict[str, Any]) -> None:
        self.channel = channel
        self.address: BrokerTarget = BrokerTarget.from_spec(spec)
        self.first = int(spec["first"])
        self.count = int(spec["count"])
        self.prefix = str(spec["destination_prefix"])
        self.size = int(spec["size"])
        self.rate_per_connection = float(spec["rate_per_connection"])
        self.concurrency = int(spec["connect_concurrency"])
        self.timeout_s = float(spec["connect_timeout_s"])
        self.marker_timeout_s = float(spec.get("marker_timeout_s", 30.0))
        self.drain_grace_s = float(spec.get("drain_grace_s", 1.0))
        self.held: list[_Held] = []
        self.connect_errors: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        self.latency = LatencyHistogram()
        # Set once the traffic stopped: duplicates from then on are late ones.
        self.draining = False
        self.late_duplicates = 0
        self._markers_wanted: set[int] = set()
        self._markers_back = asyncio.Event()
        self._tail = filler(self.size) + b"\0"
        self._body_tail = filler(self.size)

    async def _open_one(self, index: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            destination = f"{self.prefix}.{index}"
            link: StompLink | None = None
            try:
                link = await open_link(self.address, f"conn {index}", self.timeout_s)
                held = _Held(index, link, destination, self.size)
                link.on_message = lambda frame, now_ns: self._message(held, frame, now_ns)
                await link.request(
                    Command.SUBSCRIBE,
                    {
                        "id": "0",
                        "destination": destination,
                        "ack": "auto",
                        "activemq.prefetchSize": _PREFETCH,
                        "prefetch-count": _PREFETCH,
                    },
                    "sub",
                    self.timeout_s,
                )
            except (LinkError, OSError) as exc:
                self.connect_errors[_reason(exc)] += 1
                if link is not None:
                    link.close()
                return
            link.on_close = self._closed
            self.held.append(held)

    def _closed(self, reason: str | None) -> None:
        if reason is not None:
            self.lost[reason.split(": ", 1)[-1][:_REASON_CHARS]] += 1

    def _message(self, held: _Held, frame: Frame, now_ns: int) -> None:
        body = frame.body
        if not (len(body) == self.size and body.endswith(self._body_tail)):
            held.unexpected += 1
            return
        magic, index, seq, sent_ns, _intended = HEAD_STRUCT.unpack_from(body)
        if index != held.index:
            held.unexpected += 1
        elif magic == MAGIC:
            self._counted(held, seq, sent_ns, now_ns)
        elif magic == MARKER_MAGIC:
            self._marker(held)
        else:
            held.unexpected += 1

    def _counted(self, held: _Held, seq: int, sent_ns: int, now_ns: int) -> None:
        if seq >= held.sent:
            held.unexpected += 1
            return
        seen = held.seen
        if seq >= len(seen):
            seen.extend(bytes(max(seq + 1 - len(seen), _SEEN_GROWTH)))
        if seen[seq]:
            self._duplicate(held)
            return
        seen[seq] = 1
        if seq < held.last_seq:
            held.reordered += 1
        else:
            held.last_seq = seq
        held.received += 1
        self.latency.record((now_ns - sent_ns) // _NS_PER_US)

    def _duplicate(self, held: _Held) -> None:
        held.duplicates += 1
        if self.draining:
            self.late_duplicates += 1

    def _marker(self, held: _Held) -> None:
        if held.marker_seen:
            self._duplicate(held)
            return
        held.marker_seen = True
        wanted = self._markers_wanted
        wanted.discard(held.index)
        if not wanted:
            self._markers_back.set()

    async def _traffic(self) -> None:
        """Send round-robin so that each connection sends at its rate, phases spread evenly."""
        live = [h for h in self.held if h.link.alive]
        if not live or self.rate_per_connection <= 0:
            return
        interval_ns = _NS_PER_S / (self.rate_per_connection * len(live))
        origin = time.monotonic_ns()
        k = 0
        pack = HEAD_STRUCT.pack
        while True:
            now = time.monotonic_ns()
            due = origin + int(k * interval_ns)
            if due > now:
                await asyncio.sleep((due - now) / _NS_PER_S)
                continue
            held = live[k % len(live)]
            k += 1
            if not held.link.alive:
                continue
            try:
                held.link.write(
                    held.head + pack(MAGIC, held.index, held.sent, now, due) + self._tail
                )
            except LinkError:
                continue
            held.sent += 1

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(_PROGRESS_INTERVAL_S)
            self.channel.send(
                {
                    "event": "progress",
                    "open": sum(1 for h in self.held if h.link.alive),
                    "sent": sum(h.sent for h in self.held),
                    "received": sum(h.received for h in self.held),
                }
            )

    async def _drain(self) -> int:
        """Send every live connection's end marker and wait for them; return those not back."""
        self.draining = True
        now = time.monotonic_ns()
        for held in self.held:
            if not held.link.alive or held.marker_seen:
                continue
            marker = HEAD_STRUCT.pack(MARKER_MAGIC, held.index, 0, now, now)
            try:
                held.link.write(held.head + marker + self._tail)
            except LinkError:
                continue
            self._markers_wanted.add(held.index)
        if self._markers_wanted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._markers_back.wait(), self.marker_timeout_s)
        # Late duplicates can only be seen by waiting for them.
        await asyncio.sleep(self.drain_grace_s)
        return len(self._markers_wanted)

    async def run(self) -> None:
        """Open the connections, hold them with traffic between `start` and `stop`, report."""
        raise_open_files_limit()
        gate = asyncio.Semaphore(max(1, self.concurrency))
        started = time.monotonic()
        await asyncio.gather(
            *(self._open_one(i, gate) for i in range(self.first, self.first + self.count))
        )
        self.channel.send(
            {
                "event": "ready",
                "established": len(self.held),
                "failed": sum(self.connect_errors.values()),
                "connect_s": time.monotonic() - started,
            }
        )
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(self._progress())]
        while True:
            command = (await self.channel.receive()).get("cmd")
            if command == "start" and len(tasks) == 1:
                tasks.append(asyncio.create_task(self._traffic()))
            elif command == "stop":
                break
        for task in tasks:
            task.cancel()
        held_at_stop = sum(1 for h in self.held if h.link.alive)
        markers_missing = await self._drain()
        # The counts are final now; send them before disconnecting, which a broker may take long
        # over with thousands of connections.
        self.channel.send(self._result(held_at_stop, markers_missing))
        closing = time.monotonic()
        await self._close_all()
        self.channel.send({"event": "closed", "disconnect_s": time.monotonic() - closing})

    async def _close_all(self) -> None:
        gate = asyncio.Semaphore(max(1, self.concurrency))

        async def close(held: _Held) -> None:
            held.link.on_close = None
            async with gate:
                await held.link.disconnect(_DISCONNECT_TIMEOUT_S)

        await asyncio.gather(*(close(h) for h in self.held), return_exceptions=True)

    def _result(self, held_at_stop: int, markers_missing: int) -> dict[str, Any]:
        held = self.held
        return {
            "event": "result",
            "established": len(held),
            "failed": sum(self.connect_errors.values()),
            "connect_errors": dict(self.connect_errors),
            "held": held_at_stop,
            "lost": sum(self.lost.values()),
            "lost_reasons": dict(self.lost),
            "sent": sum(h.sent for h in held),
            "received": sum(h.received for h in held),
            "duplicates": sum(h.duplicates for h in held),
            "late_duplicates": self.late_duplicates,
            "reordered": sum(h.reordered for h in held),
            "unexpected": sum(h.unexpected for h in held),
            "markers_missing": markers_missing,
            "latency": self.latency.to_dict(),
        }
