"""Where the time of a persistent SEND goes, hop by hop: from its first byte read to its
RECEIPT's last byte handed to the socket (`[latency] hops`, `sluice broker --latency-hops`).

A traced SEND is a persistent one outside a transaction that asks for a receipt (what a producer
waiting on each send measures). Every one is traced while the setting is on; its stamps
(`time.perf_counter_ns`, one clock for every thread) are taken where it passes:

    read_ns      the chunk holding its first byte is read        (the session)
    handled_ns   its handler starts: the frame is parsed         (the requests)
    added_ns     the store's `add` begins                        (the journal store)
    queued_ns    its record is in the writer's queue             (the journal store)
    taken_ns     the writer takes the batch it is in             (the writer thread)
    write_ns     the batch's records are framed, writing begins  (the writer thread)
    written_ns   the batch is written                            (the writer thread)
    synced_ns    the batch is synced                             (the writer thread)
    completed_ns its completion runs on the event loop           (the requests)
    sent_ns      its RECEIPT is handed to the transport          (the outbound)

Each hop is the difference of two successive stamps, so the hops of one send add up to its
total exactly, and their means add up to the total's mean. Stamps taken on two threads are
ordered by the lock and the hand-back between them, so no hop is negative (one that were would
be counted in `out_of_order`). A send whose completion came without a batch (a duplicate
dropped, a topic that keeps nothing, a write cancelled by an early ACK) is counted in `untimed`
and not recorded.

Off, none of this runs: the listener makes plain sessions, and the journal store pays one test
per add. Memory is bounded: one histogram per hop (at most about 3,600 counts each), the last
`RECENT_SENDS` stamp rows, and traces that wait for their receipt (within the receipt bound).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from sluice.histogram import LatencyHistogram
from sluice.server.flow import FlowControl
from sluice.server.outbound import Outbound
from sluice.server.receipts import PendingReceipt, ReceiptQueue
from sluice.store.api import TimedWriteHandle

log = logging.getLogger(__name__)

# Stamp rows of the latest sends kept whole (tests, and a look at single sends).
RECENT_SENDS = 1024
# The percentiles reported, by name.
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
)
_NS_PER_US = 1000
# `sluice.histogram`'s buckets: values below this have one each; above, 2**_SUB_BITS per power
# of two.
_EXACT_BELOW = 256
_SUB_BITS = 7
_NO_VALUE = 1 << 62


class Hop(enum.Enum):
    """One hop of a persistent SEND, between two of its stamps (see the module's docstring)."""

    READ = "read"
    ROUTE = "route"
    ENQUEUE = "enqueue"
    WAIT = "wait"
    BATCH = "batch"
    WRITE = "write"
    FSYNC = "fsync"
    HANDBACK = "handback"
    RECEIPT = "receipt"

    @property
    def description(self) -> str:
        """What the hop covers, in a few words."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Hop.READ: "first byte read to the SEND's handler: reading, parsing, frames before it",
    Hop.ROUTE: "handler to the store: permission, message, destination, flow checks",
    Hop.ENQUEUE: "the store's add: the record encoded and queued for the writer",
    Hop.WAIT: "queued to taken by the writer: the batch before it being written and synced",
    Hop.BATCH: "batch taken to its first write: records framed and checksummed",
    Hop.WRITE: "the batch's pwritev (and a rollover to the next file)",
    Hop.FSYNC: "fdatasync of the head file (0 unless the sync policy is always)",
    Hop.HANDBACK: "synced to the completion on the event loop: sink, wake-up, callbacks",
    Hop.RECEIPT: "completion to the RECEIPT handed to the socket: receipts before it, encoding, "
    "the loop turn's write",
}

# A completed send waiting for its RECEIPT to go out: the stamps of the loop (first byte read,
# handler, completion) and the handle with the store's and the writer's.
SendTrace = tuple[int, int, TimedWriteHandle, int]


class ReadStamps:
    """When a session read the chunk holding the first byte of the frame it handles next
    (`frame_ns`), and its latest chunk (`chunk_ns`)."""

    __slots__ = ("chunk_ns", "frame_ns")

    def __init__(self) -> None:
        self.chunk_ns = 0
        self.frame_ns = 0


class HopRecorder:
    """The histograms of every hop and of the total, in nanoseconds, for the whole broker.

    `record` runs for every traced send, so it counts into plain lists (`LatencyHistogram`'s
    buckets, computed inline) rather than calling a histogram ten times; `hops` and `total`
    make `LatencyHistogram`s of them when asked."""

    def __init__(self) -> None:
        # Per hop, then the total: bucket counts, sums, minimums and maximums (ns).
        slots = len(Hop) + 1
        self._counts: list[dict[int, int]] = [{} for _ in range(slots)]
        self._sums = [0] * slots
        self._mins = [_NO_VALUE] * slots
        self._maxes = [0] * slots
        self.sends = 0
        # The stamps of the latest sends (ten per send, in the order of the docstring).
        self.recent: deque[tuple[int, ...]] = deque(maxlen=RECENT_SENDS)
        self.untimed = 0
        self.out_of_order = 0

    @property
    def hops(self) -> dict[Hop, LatencyHistogram]:
        """The histogram of each hop."""
        return {hop: self._histogram(i) for i, hop in enumerate(Hop)}

    @property
    def total(self) -> LatencyHistogram:
        """The histogram of the whole: first byte read to RECEIPT written."""
        return self._histogram(len(Hop))

    def _histogram(self, slot: int) -> LatencyHistogram:
        histogram = LatencyHistogram()
        histogram.counts = dict(self._counts[slot])
        histogram.total = self.sends
        histogram.sum_values = self._sums[slot]
        histogram.min_value = self._mins[slot] if self.sends else 0
        histogram.max_value = self._maxes[slot]
        return histogram

    def record(self, trace: SendTrace, sent_ns: int) -> None:
        """A traced send's RECEIPT was handed to the transport at `sent_ns`."""
        read_ns, handled_ns, handle, completed_ns = trace
        batch = handle.batch
        assert batch is not None  # only written handles are traced
        stamps = (
            read_ns,
            handled_ns,
            handle.added_ns,
            handle.queued_ns,
            batch.taken_ns,
            batch.write_ns,
            batch.written_ns,
            batch.synced_ns,
            completed_ns,
            sent_ns,
        )
        self.recent.append(stamps)
        self.sends += 1
        values = [end - start for start, end in pairwise(stamps)]
        values.append(sent_ns - read_ns)
        if min(values) < 0:
            self.out_of_order += sum(value < 0 for value in values)
            values = [max(value, 0) for value in values]
        counts, sums, mins, maxes = self._counts, self._sums, self._mins, self._maxes
        for slot, value in enumerate(values):
            if value < _EXACT_BELOW:
                index = value
            else:
                # `sluice.histogram.bucket_index`, inlined (ten times per traced send).
                shift = value.bit_length() - _SUB_BITS - 1
                index = (shift << _SUB_BITS) + (value >> shift)
            bucket = counts[slot]
            bucket[index] = bucket.get(index, 0) + 1
            sums[slot] += value
            if value > maxes[slot]:
                maxes[slot] = value
            if value < mins[slot]:
                mins[slot] = value

    def snapshot(self) -> dict[str, int]:
        """Counts and percentiles (ns) for the broker's counters and gauges."""
        out = {
            "latency_sends": self.sends,
            "latency_untimed": self.untimed,
            "latency_out_of_order": self.out_of_order,
        }
        for name, histogram in self._named():
            out[f"latency_{name}_count"] = histogram.total
            for label, p in PERCENTILES:
                out[f"latency_{name}_{label.replace('.', '_')}_ns"] = histogram.percentile(p)
            out[f"latency_{name}_max_ns"] = histogram.max_value
        return out

    def report(self) -> dict[str, Any]:
        """Everything, JSON-safe: per hop its description, count, percentiles, maximum and mean
        (ns), and its histogram (`LatencyHistogram.to_dict`, to merge or recompute)."""
        hops = [
            {"hop": hop.value, "description": hop.description, **_summary(histogram)}
            for hop, histogram in self.hops.items()
        ]
        return {
            "unit": "ns",
            "sends": self.sends,
            "untimed": self.untimed,
            "out_of_order": self.out_of_order,
            "hops": hops,
            "total": _summary(self.total),
        }

    def table(self) -> list[str]:
        """The report as lines of text, in microseconds, with each hop's share of the mean."""
        total_mean = self.total.mean
        header = f"{'hop':<9}" + "".join(f"{label:>9}" for label, _ in PERCENTILES)
        lines = [header + f"{'max':>9}{'mean':>9}{'share':>7}"]
        for name, histogram in self._named():
            cells = [histogram.percentile(p) for _, p in PERCENTILES]
            cells += [histogram.max_value, round(histogram.mean)]
            share = histogram.mean / total_mean * 100 if total_mean else 0.0
            row = "".join(f"{cell / _NS_PER_US:9.1f}" for cell in cells)
            lines.append(f"{name:<9}{row}{share:6.1f}%")
        return lines

    def log_report(self) -> None:
        """Log the table (at stop, on SIGUSR1)."""
        log.info(
            "latency of %d persistent SENDs, first byte read to RECEIPT written, in us "
            "(%d answered without a journal write, not counted):\n%s",
            self.sends,
            self.untimed,
            "\n".join("  " + line for line in self.table()),
        )

    def write(self, path: Path) -> None:
        """Write `report()` as JSON to `path` (replaced whole); an error is logged."""
        temp = path.with_name(path.name + ".tmp")
        try:
            temp.write_text(json.dumps(self.report(), indent=1) + "\n", encoding="utf-8")
            os.replace(temp, path)
        except OSError as exc:
            log.error("cannot write the latency report to %s: %s", path, exc.strerror)
        else:
            log.info("latency report written to %s", path)

    def _named(self) -> list[tuple[str, LatencyHistogram]]:
        return [(hop.value, self.hops[hop]) for hop in Hop] + [("total", self.total)]


def _summary(histogram: LatencyHistogram) -> dict[str, Any]:
    summary: dict[str, Any] = {"count": histogram.total}
    for label, p in PERCENTILES:
        summary[label] = histogram.percentile(p)
    summary["max"] = histogram.max_value
    summary["mean"] = round(histogram.mean)
    summary["histogram"] = histogram.to_dict()
    return summary


class TracedOutbound(Outbound):
    """An `Outbound` that records the traced sends whose RECEIPT it hands to the transport."""

    __slots__ = ("_recorder", "traces")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        high_bytes: int,
        on_sent: Callable[[], None],
        recorder: HopRecorder,
    ) -> None:
        super().__init__(loop, high_bytes, on_sent)
        self._recorder = recorder
        # Sends whose RECEIPT is queued here (put before the RECEIPT's bytes are).
        self.traces: list[SendTrace] = []

    def flush(self) -> None:
        """Hand everything queued to the transport; record the sends it answers."""
        traces = self.traces
        if not traces:
            super().flush()
            return
        transport = self.transport
        handed = bool(self.chunks) and transport is not None and not transport.is_closing()
        super().flush()
        self.traces = []
        if handed:
            sent_ns = time.perf_counter_ns()
            record = self._recorder.record
            for trace in traces:
                record(trace, sent_ns)


class TracedReceiptQueue(ReceiptQueue):
    """A `ReceiptQueue` that passes the traces of the receipts going out to the outbound."""

    __slots__ = ("_outbound", "_waiting")

    def __init__(
        self,
        limit: int,
        flow: FlowControl,
        count: Callable[[str], None],
        outbound: TracedOutbound,
    ) -> None:
        super().__init__(limit, flow, count)
        self._outbound = outbound
        # Completed traced sends whose receipt waits its turn; within the queue's bound.
        self._waiting: dict[PendingReceipt, SendTrace] = {}

    def completed(self, entry: PendingReceipt, trace: SendTrace) -> None:
        """The traced send `entry` answers is written; its receipt goes out in its turn."""
        self._waiting[entry] = trace

    def pop_done(self) -> list[PendingReceipt]:
        """As `ReceiptQueue.pop_done`, handing the traces of the popped receipts on."""
        ready = super().pop_done()
        waiting = self._waiting
        if waiting:
            traces = self._outbound.traces
            for entry in ready:
                trace = waiting.pop(entry, None)
                if trace is not None:
                    traces.append(trace)
        return ready
