"""A FIFO counting semaphore for receipt slots.

Python 3.11's `asyncio.Semaphore` scans its whole waiter queue on every release, which turns
thousands of pipelined sends waiting for a slot into quadratic work. Here a release hands its slot
straight to the oldest live waiter, in constant time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

__all__ = ["Slots"]


class Slots:
    """At most `count` holders at once; the others wait in arrival order."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1 (got {count})")
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Waiters queued (cancelled ones included until they are skipped)."""
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting for one if none is free."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as we were cancelled: pass it on.
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back, to the oldest waiter still waiting if there is one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
