"""Waiting for a condition that nothing can be awaited on (a counter of a broker on another
thread, a file another process writes): poll it, always within a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.02
DEFAULT_TIMEOUT_S = 20.0


def wait_until(
    predicate: Callable[[], object], timeout: float = DEFAULT_TIMEOUT_S, what: str = ""
) -> None:
    """Return once `predicate()` is true; raise TimeoutError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or predicate}")
        time.sleep(POLL_S)


async def wait_until_async(
    predicate: Callable[[], object], timeout: float = DEFAULT_TIMEOUT_S, what: str = ""
) -> None:
    """`wait_until` for a coroutine: the predicate runs in a thread (it may block, as a call
    onto a broker's loop does), and the event loop stays free between polls."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(POLL_S)
