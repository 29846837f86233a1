"""A session that stamps the hops of its persistent SENDs (`hops.py`): the listener makes these
instead of plain `StompSession`s when `[latency] hops` is on, so a broker without it runs none
of this code."""

from __future__ import annotations

import time

from sluice.core.connection import BrokerConnection
from sluice.server.context import SessionContext
from sluice.server.hops import HopRecorder, ReadStamps, TracedOutbound, TracedReceiptQueue
from sluice.server.outbound import Outbound
from sluice.server.receipts import ReceiptQueue
from sluice.server.requests import Requests
from sluice.server.session import StompSession
from sluice.stomp.frames import Frame


class TracedStompSession(StompSession):
    """A `StompSession` whose persistent SENDs with a receipt are timed hop by hop."""

    def __init__(self, context: SessionContext, recorder: HopRecorder) -> None:
        # Before the session's own set-up, which makes the parts below.
        self._recorder = recorder
        self._reads = ReadStamps()
        super().__init__(context)

    def _new_outbound(self) -> Outbound:
        self._traced_outbound = TracedOutbound(
            self.loop, self.config.limits.write_buffer_high_bytes, self._sent, self._recorder
        )
        return self._traced_outbound

    def _new_receipt_queue(self) -> ReceiptQueue:
        limit = self.config.limits.max_pending_receipts_per_connection
        self._traced_receipts = TracedReceiptQueue(
            limit, self.flow, self.broker.count, self._traced_outbound
        )
        return self._traced_receipts

    def _new_requests(self, core: BrokerConnection) -> Requests:
        requests = super()._new_requests(core)
        requests.trace_sends(self._reads, self._traced_receipts, self._recorder)
        return requests

    def data_received(self, data: bytes) -> None:
        """Note when the chunk was read, and whether the next frame begins in it."""
        reads = self._reads
        reads.chunk_ns = time.perf_counter_ns()
        if not self.stomp.buffered_bytes:
            reads.frame_ns = reads.chunk_ns
        super().data_received(data)

    def _handle(self, frame: Frame) -> None:
        super()._handle(frame)
        # The next frame begins in the latest chunk, or in one still to come (which says so).
        # Frames held in the parser while reading is paused count from the latest chunk too:
        # their first byte may have come earlier.
        self._reads.frame_ns = self._reads.chunk_ns
