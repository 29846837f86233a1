"""`PipelinedReceipt`: the RECEIPT of a frame already written, awaited later.

`Client.send_pipelined` writes a SEND and returns at once with one of these, so that a caller can
keep a bounded window of frames on the wire (streams do) without a task per frame. Each one holds
a slot of the client's receipt bound until its RECEIPT (or its failure) comes. Call `wait` or
`cancel` on each, so that a failure is always seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.client.link import ClientLink
from sluice.client.slots import Slots

__all__ = ["PipelinedReceipt"]


class PipelinedReceipt:
    """A frame written on `link` whose RECEIPT has not been waited for yet."""

    __slots__ = ("_future", "_link", "_receipt_id", "_released", "_slots", "_timeout_s", "what")

    def __init__(
        self,
        link: ClientLink,
        receipt_id: str,
        future: asyncio.Future[None],
        slots: Slots,
        timeout_s: float,
        what: str,
    ) -> None:
        self._link = link
        self._receipt_id = receipt_id
        self._future = future
        self._slots = slots
        self._timeout_s = timeout_s
        self._released = False
        self.what = what
        future.add_done_callback(self._done)

    @property
    def epoch(self) -> int:
        """The connection the frame went out on."""
        return self._link.epoch

    @property
    def done(self) -> bool:
        """Whether the RECEIPT (or the failure) has come."""
        return self._future.done()

    @property
    def succeeded(self) -> bool:
        """Whether the RECEIPT has come."""
        future = self._future
        return future.done() and not future.cancelled() and future.exception() is None

    def add_done_callback(self, callback: Callable[[PipelinedReceipt], None]) -> None:
        """Call `callback(self)` once the RECEIPT (or the failure) has come."""
        self._future.add_done_callback(lambda _: callback(self))

    async def wait(self) -> None:
        """Wait for the RECEIPT, at most the client's receipt timeout from now.

        Raises `ReceiptTimeout`, `BrokerErrorFrame` or `ConnectionLost` as `Client.send` does.
        """
        await self._link.wait_receipt(self._receipt_id, self._future, self._timeout_s, self.what)

    def cancel(self) -> None:
        """Stop waiting: the outcome stays unknown and the slot is given back."""
        future = self._future
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # seen: the caller chose not to know

    def _done(self, future: asyncio.Future[None]) -> None:
        if not self._released:
            self._released = True
            self._slots.release()
