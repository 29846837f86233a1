"""`BenchProducer` and `BenchConsumer`: what one bench connection does on the hot path.

Producer flow control: a producer writes its messages in windows of `receipt_every` frames, the
last frame of each window carrying a `receipt` header, and keeps at most `max_receipts` windows
unanswered (`receipt_window` picks the default: 100, fewer for large messages so that a window
stays near 1 MiB; an explicit `--receipt-every` is used as given). A broker that accepts
slowly answers slowly, so the producer slows down with it instead of flooding socket buffers;
every broker answers receipts, so the rule is the same for all of them. With `receipt_every=1,
max_receipts=1` this is the classic synchronous send.

A producer given a rate follows a timetable: message i is due at start + offset + i / rate and
carries that due time in its body, so a stall in the broker (or the generator) shows up in the
latency of every message that should have been sent meanwhile (no coordinated omission). The
offset spreads several producers evenly over one interval. A send that goes out more than 1 ms
after its due time (because the receipts it waits for came back late) is counted as late.

Consumers acknowledge in batches: in `client` mode one cumulative ACK per `ack_every` messages
(and on a timer), in `client-individual` mode one ACK per message written together per batch.
`client` is the default: every broker supports it the same way (ActiveMQ and Sluice acknowledge up
to the named message on the subscription, RabbitMQ acks "multiple"), it costs one frame per batch,
and unlike `auto` it keeps the broker's per-consumer credit (`activemq.prefetchSize`,
`prefetch-count`) in force, so no broker is measured pushing into an unbounded socket buffer.
`ack_every` stays at or below the prefetch (half of it by default) so credit never runs out while
an ACK is on its way.

After its last message a producer can send an end marker (`BenchProducer.mark`, with a receipt); a
consumer records which producers' markers it received, so the run knows when nothing the broker
holds is ahead of them (see `payload`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.bench.payload import HEAD_STRUCT, MAGIC, MARKER_MAGIC, encode_marker, filler
from sluice.bench.stats import LatencyHistogram, SeenTracker
from sluice.bench.stomplink import LinkError, StompLink
from sluice.stomp import Command, Version, encode_headers, escape_value

__all__ = ["BenchConsumer", "BenchProducer", "ConsumerSpec", "ProducerSpec", "receipt_window"]

ACK_MODES = ("auto", "client", "client-individual")
DEFAULT_RECEIPT_EVERY = 100
# The default window of large messages is cut short so that one write stays around this size.
_MAX_WINDOW_BYTES = 1024 * 1024
_MARKER_RECEIPT = "end"
_NS_PER_US = 1000
_NS_PER_S = 1_000_000_000
# A send this far behind its due time counts as late.
_LATE_NS = 1_000_000


def receipt_window(size: int, receipt_every: int | None) -> int:
    """Messages per receipt: `receipt_every` as given, or by default 100 but at most 1 MiB."""
    if receipt_every is not None:
        return receipt_every
    return min(DEFAULT_RECEIPT_EVERY, max(1, _MAX_WINDOW_BYTES // size))


@dataclass(frozen=True)
class ProducerSpec:
    """What one producer sends. Sequences 0..warmup-1 are the warm-up, then `count` measured."""

    producer_id: int
    destination: str
    size: int
    count: int
    warmup: int = 0
    persistent: bool = False
    # Messages per receipt, used as given (see `receipt_window` for the default).
    receipt_every: int = DEFAULT_RECEIPT_EVERY
    max_receipts: int = 8
    # Messages per second on a timetable; 0 sends as fast as the broker accepts.
    rate_per_s: float = 0.0
    # The timetable starts this long after the producer is told to start.
    start_offset_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form."""
        return asdict(self)


@dataclass(frozen=True)
class ConsumerSpec:
    """What one consumer expects: `per_producer[i]` messages (warm-up included) from producer i."""

    consumer_id: int
    destination: str
    size: int
    per_producer: list[int]
    # Per producer: sequences below this are the warm-up, received and verified but not timed.
    warmup: list[int] = field(default_factory=list)
    ack: str = "client"
    prefetch: int = 1000
    ack_every: int = 500
    headers: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form."""
        return asdict(self)


class BenchProducer:
    """Sends one producer's messages on one link, flow-controlled by receipts."""

    def __init__(self, spec: ProducerSpec, link: StompLink) -> None:
        self.spec = spec
        self.link = link
        items = [("destination", spec.destination)]
        if spec.persistent:
            # Only ever `true`: RabbitMQ takes `persistent:false` as a clash with a durable queue.
            items.append(("persistent", "true"))
        items += [(k, v) for k, v in spec.headers.items() if k not in ("destination", "receipt")]
        items.append(("content-length", str(spec.size)))
        block = encode_headers(items, link.version)
        self._plain_head = b"SEND\n" + block + b"\n"
        self._receipt_head = b"SEND\n" + block + b"receipt:"
        self._tail = filler(spec.size) + b"\0"
        self.window = max(1, spec.receipt_every)
        self._outstanding: dict[str, tuple[int, bool]] = {}
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.sent = 0
        self.first_send_ns = 0
        self.last_send_ns = 0
        self.last_receipt_ns = 0
        self.unknown_receipts = 0
        self.late_sends = 0
        self.receipt_latency = LatencyHistogram()
        link.on_receipt = self._receipt
        link.on_close = self._link_closed

    def _receipt(self, receipt_id: str, now_ns: int) -> None:
        entry = self._outstanding.pop(receipt_id, None)
        if entry is None:
            self.unknown_receipts += 1
            return
        sent_ns, measured = entry
        if measured:
            self.receipt_latency.record((now_ns - sent_ns) // _NS_PER_US)
            self.last_receipt_ns = now_ns
        if len(self._outstanding) < self.spec.max_receipts:
            self._room.set()
        if not self._outstanding:
            self._idle.set()

    def _link_closed(self, reason: str | None) -> None:
        del reason
        self._room.set()
        self._idle.set()

    async def run(self, start: int, end: int, *, measured: bool) -> None:
        """Send sequences start..end-1 and wait for their receipts; raises `LinkError`."""
        if start >= end:
            return
        if self.spec.rate_per_s > 0:
            await self._run_timetable(start, end, measured)
        else:
            await self._run_flat_out(start, end, measured)
        await self._wait(self._idle)

    async def mark(self) -> None:
        """Send the end marker with a receipt and wait for it; raises `LinkError`."""
        now_ns = time.monotonic_ns()
        marker = encode_marker(self.spec.producer_id, 0, now_ns, self.spec.size)
        head = self._receipt_head + _MARKER_RECEIPT.encode() + b"\n\n"
        self.link.write(head + marker + b"\0")
        self._track(_MARKER_RECEIPT, now_ns, False)
        await self._wait(self._idle)

    async def _wait(self, event: asyncio.Event) -> None:
        link = self.link
        link.check()
        if not event.is_set():
            await event.wait()
        link.check()
        if link.write_paused:
            await link.drain()

    def _window(
        self, start: int, end: int, now_ns: int, intended: list[int] | None, tag: str
    ) -> bytes:
        """Frames for sequences start..end-1; the last carries the receipt `tag`."""
        pack = HEAD_STRUCT.pack
        pid = self.spec.producer_id
        plain = self._plain_head
        tail = self._tail
        last = end - 1
        if intended is None:
            frames = [
                plain + pack(MAGIC, pid, seq, now_ns, now_ns) + tail for seq in range(start, last)
            ]
            due = now_ns
        else:
            frames = [
                plain + pack(MAGIC, pid, seq, now_ns, intended[seq - start]) + tail
                for seq in range(start, last)
            ]
            due = intended[-1]
        head = self._receipt_head + tag.encode() + b"\n\n"
        frames.append(head + pack(MAGIC, pid, last, now_ns, due) + tail)
        return b"".join(frames)

    def _track(self, tag: str, now_ns: int, measured: bool) -> None:
        self._outstanding[tag] = (now_ns, measured)
        self._idle.clear()
        if len(self._outstanding) >= self.spec.max_receipts:
            self._room.clear()

    def _note_sent(self, count: int, now_ns: int, measured: bool) -> None:
        self.sent += count
        if measured:
            if not self.first_send_ns:
                self.first_send_ns = now_ns
            self.last_send_ns = now_ns

    async def _run_flat_out(self, start: int, end: int, measured: bool) -> None:
        window = self.window
        prefix = "m" if measured else "w"
        link = self.link
        seq = start
        while seq < end:
            await self._wait(self._room)
            stop = min(seq + window, end)
            now_ns = time.monotonic_ns()
            tag = f"{prefix}{stop - 1}"
            link.write(self._window(seq, stop, now_ns, None, tag))
            self._track(tag, now_ns, measured)
            self._note_sent(stop - seq, now_ns, measured)
            seq = stop

    async def _run_timetable(self, start: int, end: int, measured: bool) -> None:
        window = self.window
        interval_ns = _NS_PER_S / self.spec.rate_per_s
        prefix = "m" if measured else "w"
        link = self.link
        origin_ns = time.monotonic_ns() + int(self.spec.start_offset_s * _NS_PER_S)
        seq = start
        while seq < end:
            await self._wait(self._room)
            now_ns = time.monotonic_ns()
            due_ns = origin_ns + int((seq - start) * interval_ns)
            if due_ns > now_ns:
                await asyncio.sleep((due_ns - now_ns) / _NS_PER_S)
                continue
            if measured and now_ns - due_ns > _LATE_NS:
                self.late_sends += 1
            # Everything due by now, cut at the next receipt boundary so windows stay aligned.
            due_count = int((now_ns - origin_ns) / interval_ns) + 1 - (seq - start)
            boundary = seq + window - (seq - start) % window
            stop = min(seq + max(due_count, 1), boundary, end)
            intended = [origin_ns + int((s - start) * interval_ns) for s in range(seq, stop)]
            if stop in (boundary, end):
                tag = f"{prefix}{stop - 1}"
                link.write(self._window(seq, stop, now_ns, intended, tag))
                self._track(tag, now_ns, measured)
            else:
                pack = HEAD_STRUCT.pack
                pid = self.spec.producer_id
                link.write(
                    b"".join(
                        self._plain_head
                        + pack(MAGIC, pid, s, now_ns, intended[s - seq])
                        + self._tail
                        for s in range(seq, stop)
                    )
                )
            self._note_sent(stop - seq, now_ns, measured)
            seq = stop

    def result(self) -> dict[str, Any]:
        """What this producer did, JSON-safe."""
        return {
            "producer_id": self.spec.producer_id,
            "sent": self.sent,
            "first_send_ns": self.first_send_ns,
            "last_send_ns": self.last_send_ns,
            "last_receipt_ns": self.last_receipt_ns,
            "unknown_receipts": self.unknown_receipts,
            "late_sends": self.late_sends,
            "receipt_latency": self.receipt_latency.to_dict(),
            "error": self.link.error,
        }


class BenchConsumer:
    """Receives, verifies and times messages on one link."""

    def __init__(self, spec: ConsumerSpec, link: StompLink) -> None:
        if spec.ack not in ACK_MODES:
            raise ValueError(f"unknown ack mode {spec.ack!r}")
        self.spec = spec
        self.link = link
        self.subscription_id = f"bench-{spec.consumer_id}"
        self.tracker = SeenTracker(spec.per_producer)
        # From the time a message was due to be sent (equal to its send time unless on a timetable).
        self.latency = LatencyHistogram()
        # From the time a message was actually written, recorded only when that differs.
        self.send_latency = LatencyHistogram()
        self.received = 0
        self.measured = 0
        self.first_ns = 0
        self.last_ns = 0
        self.acks_sent = 0
        # Producers whose end marker this consumer received.
        self.markers: set[int] = set()
        # Messages that arrived after `finish`, left to the broker to deliver again.
        self.unacknowledged = 0
        self._tail = filler(spec.size)
        self._warmup = list(spec.warmup) or [0] * len(spec.per_producer)
        if len(self._warmup) != len(spec.per_producer):
            raise ValueError("warmup and per_producer must name the same producers")
        self._ack_key = link.ack_id_header()
        self._unacked: list[str] = []
        self._last_ack_id: str | None = None
        self._pending = 0
        link.on_message = self._message

    async def subscribe(self, timeout_s: float) -> None:
        """SUBSCRIBE and wait for the receipt, so that producers may start."""
        spec = self.spec
        prefetch = str(spec.prefetch)
        headers = {
            **spec.headers,
            "id": self.subscription_id,
            "destination": spec.destination,
            "ack": spec.ack,
            # ActiveMQ's and RabbitMQ's names for the same credit; each broker ignores the other's.
            "activemq.prefetchSize": prefetch,
            "prefetch-count": prefetch,
        }
        await self.link.request(Command.SUBSCRIBE, headers, f"sub-{spec.consumer_id}", timeout_s)

    def _message(self, frame: Any, now_ns: int) -> None:
        body: bytes = frame.body
        self.received += 1
        tracker = self.tracker
        if len(body) == self.spec.size and body.startswith(MAGIC) and body.endswith(self._tail):
            _, producer, seq, sent_ns, intended_ns = HEAD_STRUCT.unpack_from(body)
            if tracker.add(producer, seq) and seq >= self._warmup[producer]:
                self.measured += 1
                self.latency.record((now_ns - intended_ns) // _NS_PER_US)
                if sent_ns != intended_ns:
                    self.send_latency.record((now_ns - sent_ns) // _NS_PER_US)
                if not self.first_ns:
                    self.first_ns = now_ns
                self.last_ns = now_ns
        else:
            self._not_a_message(body)
        ack = self.spec.ack
        if ack == "auto":
            return
        ack_id = frame.headers.get(self._ack_key)
        if ack_id is None:
            return
        if ack == "client":
            self._last_ack_id = ack_id
        else:
            self._unacked.append(ack_id)
        self._pending += 1
        if self._pending >= self.spec.ack_every:
            self.flush_acks()

    def _not_a_message(self, body: bytes) -> None:
        """An end marker, or a body the load generator did not send."""
        tracker = self.tracker
        if not (
            len(body) == self.spec.size
            and body.startswith(MARKER_MAGIC)
            and body.endswith(self._tail)
        ):
            tracker.corrupt += 1
            return
        producer = HEAD_STRUCT.unpack_from(body)[1]
        if producer >= len(self.spec.per_producer):
            tracker.unexpected += 1
        elif producer in self.markers:
            # A marker delivered twice is a duplicate like any other message.
            tracker.duplicates += 1
            tracker.trailing_duplicates += 1
        else:
            self.markers.add(producer)

    def finish(self) -> None:
        """Acknowledge what was received, and count nothing that arrives from now on.

        A message that arrives after the last ACK (and before DISCONNECT takes effect) is not
        acknowledged, so the broker keeps it for the next consumer; counting it here too would
        make it a duplicate when the emptiness check drains it. With `ack:auto` there is nothing to
        acknowledge and the broker forgets what it delivered, so counting goes on.
        """
        self.flush_acks()
        if self.spec.ack != "auto":
            self.link.on_message = self._after_finish

    def _after_finish(self, frame: Any, now_ns: int) -> None:
        del frame, now_ns
        self.unacknowledged += 1

    def flush_acks(self) -> None:
        """Acknowledge everything received so far (no-op in auto mode or when nothing is due)."""
        if not self._pending or not self.link.alive:
            return
        version = self.link.version
        if self.spec.ack == "client":
            ids = [self._last_ack_id] if self._last_ack_id is not None else []
        else:
            ids = self._unacked
            self._unacked = []
        self._pending = 0
        self._last_ack_id = None
        if not ids:
            return
        if version is Version.V1_2:
            frames = [b"ACK\nid:" + escape_value(i, version).encode() + b"\n\n\0" for i in ids]
        else:
            sub = b"\nsubscription:" + escape_value(self.subscription_id, version).encode()
            frames = [
                b"ACK\nmessage-id:" + escape_value(i, version).encode() + sub + b"\n\n\0"
                for i in ids
            ]
        try:
            self.link.write(b"".join(frames))
        except LinkError:
            return
        self.acks_sent += len(frames)

    @property
    def unique(self) -> int:
        """Distinct expected messages received so far (warm-up included)."""
        return self.tracker.unique

    def result(self) -> dict[str, Any]:
        """What this consumer saw, JSON-safe."""
        return {
            "consumer_id": self.spec.consumer_id,
            "received": self.received,
            "measured": self.measured,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "acks_sent": self.acks_sent,
            "markers": sorted(self.markers),
            "unacknowledged": self.unacknowledged,
            "tracker": self.tracker.to_dict(),
            "latency": self.latency.to_dict(),
            "send_latency": self.send_latency.to_dict(),
            "error": self.link.error,
        }
