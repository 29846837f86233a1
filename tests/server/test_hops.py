"""The per-hop latency recorder and its two session parts, without a broker: what a send's
stamps become, and that a send is recorded when its RECEIPT is handed to the transport (not
before, and not at all when the connection is closing)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

from sluice.histogram import LatencyHistogram
from sluice.server.flow import FlowControl
from sluice.server.hops import (
    Hop,
    HopRecorder,
    SendTrace,
    TracedOutbound,
    TracedReceiptQueue,
)
from sluice.store.api import BatchTimes, TimedWriteHandle

# read, handled, added, queued, taken, write, written, synced, completed (ns); sent comes apart.
STAMPS = (1_000, 3_000, 3_500, 4_500, 10_000, 10_200, 12_000, 600_000, 650_000)
SENT_NS = 700_000


def _trace(stamps: tuple[int, ...] = STAMPS) -> SendTrace:
    read, handled, added, queued, taken, write, written, synced, completed = stamps
    handle = TimedWriteHandle(None)
    handle.added_ns, handle.queued_ns = added, queued
    batch = handle.batch = BatchTimes(taken)
    batch.write_ns, batch.written_ns, batch.synced_ns = write, written, synced
    return (read, handled, handle, completed)


def test_each_hop_is_the_difference_of_two_stamps() -> None:
    recorder = HopRecorder()
    recorder.record(_trace(), SENT_NS)
    stamps = (*STAMPS, SENT_NS)
    for hop, start, end in zip(Hop, stamps, stamps[1:], strict=False):
        histogram = recorder.hops[hop]
        assert histogram.total == 1
        assert histogram.max_value == end - start, hop
    assert recorder.total.max_value == SENT_NS - STAMPS[0]
    assert recorder.hops[Hop.FSYNC].max_value == 588_000
    assert list(recorder.recent) == [stamps]
    assert recorder.out_of_order == 0


def test_the_buckets_are_those_of_the_shared_histogram() -> None:
    # The recorder counts inline what `LatencyHistogram.record` would: the same buckets, sums,
    # minimums and maximums, over the whole range (and a stamp out of order counts as 0).
    rng = random.Random(5)
    recorder = HopRecorder()
    expected = [LatencyHistogram() for _ in range(len(Hop) + 1)]
    for _ in range(2000):
        stamps = [rng.randrange(10**6)]
        for _ in range(9):
            stamps.append(stamps[-1] + int(10 ** rng.uniform(0, 10)) - rng.randrange(3))
        recorder.record(_trace(tuple(stamps[:-1])), stamps[-1])
        for histogram, (start, end) in zip(expected, pairwise(stamps), strict=False):
            histogram.record(end - start)
        expected[-1].record(stamps[-1] - stamps[0])
    assert recorder.out_of_order > 0
    got = [*recorder.hops.values(), recorder.total]
    assert [h.to_dict() for h in got] == [h.to_dict() for h in expected]


def test_a_stamp_out_of_order_is_counted() -> None:
    recorder = HopRecorder()
    swapped = list(STAMPS)
    swapped[3], swapped[4] = swapped[4], swapped[3]  # queued after the writer took it
    recorder.record(_trace(tuple(swapped)), SENT_NS)
    assert recorder.out_of_order == 1
    assert recorder.snapshot()["latency_out_of_order"] == 1


def test_snapshot_report_and_table(tmp_path: Path) -> None:
    recorder = HopRecorder()
    for _ in range(3):
        recorder.record(_trace(), SENT_NS)
    recorder.untimed = 2
    snapshot = recorder.snapshot()
    assert snapshot["latency_sends"] == 3
    assert snapshot["latency_untimed"] == 2
    assert snapshot["latency_fsync_count"] == 3
    assert 588_000 <= snapshot["latency_fsync_p99_9_ns"] <= 588_000 * 1.008
    assert snapshot["latency_total_max_ns"] == SENT_NS - STAMPS[0]

    path = tmp_path / "hops.json"
    recorder.write(path)
    report = json.loads(path.read_text())
    assert report == json.loads(json.dumps(recorder.report()))
    assert report["sends"] == 3
    assert [hop["hop"] for hop in report["hops"]] == [hop.value for hop in Hop]
    assert report["hops"][0]["description"] == Hop.READ.description
    assert report["total"]["mean"] == SENT_NS - STAMPS[0]

    table = recorder.table()
    assert len(table) == 1 + len(Hop) + 1
    fsync = next(line for line in table if line.startswith("fsync"))
    # 588 us of the 699 us each send took.
    assert fsync.split()[1] == "588.0"
    assert fsync.endswith("84.1%")


class _Loop:
    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def writelines(self, chunks: list[bytes]) -> None:
        self.written.extend(chunks)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


def _parts(recorder: HopRecorder) -> tuple[TracedOutbound, TracedReceiptQueue, _Transport]:
    loop = cast(asyncio.AbstractEventLoop, _Loop())
    outbound = TracedOutbound(loop, 1 << 20, lambda: None, recorder)
    transport = _Transport()
    outbound.transport = cast(Any, transport)
    flow = FlowControl(lambda: None, lambda: None)
    receipts = TracedReceiptQueue(100, flow, lambda name: None, outbound)
    return outbound, receipts, transport


def _send_ready(outbound: TracedOutbound, receipts: TracedReceiptQueue) -> None:
    """What `Requests.flush_receipts` does with the receipts that may go out."""
    for entry in receipts.pop_done():
        assert entry.receipt_id is not None
        outbound.write(b"RECEIPT\nreceipt-id:" + entry.receipt_id.encode() + b"\n\n\0")


def test_a_send_is_recorded_when_its_receipt_is_handed_over() -> None:
    recorder = HopRecorder()
    outbound, receipts, transport = _parts(recorder)
    earlier = receipts.add("ack", done=False)  # a receipted ACK still being written
    entry = receipts.add("send", done=False)
    receipts.completed(entry, _trace())
    entry.done = True
    _send_ready(outbound, receipts)
    # Its receipt waits behind the ACK's.
    assert outbound.traces == []
    assert recorder.sends == 0

    earlier.done = True
    _send_ready(outbound, receipts)
    assert len(outbound.traces) == 1
    assert recorder.sends == 0  # queued, not handed to the transport yet
    outbound.flush()
    assert len(transport.written) == 2
    assert recorder.sends == 1
    assert outbound.traces == []


def test_nothing_is_recorded_for_a_closing_connection() -> None:
    recorder = HopRecorder()
    outbound, receipts, transport = _parts(recorder)
    entry = receipts.add("send", done=False)
    receipts.completed(entry, _trace())
    entry.done = True
    _send_ready(outbound, receipts)
    transport.closing = True
    outbound.flush()
    assert transport.written == []
    assert recorder.sends == 0
    assert outbound.traces == []
