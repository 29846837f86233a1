"""What the core needs from around it: the event loop's scheduling (`Loop`, `Cancellable`), and
the connections it may stop reading (`Producer`, paused for a `FlowReason`).

An asyncio event loop and the server's sessions provide them; tests provide fakes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol


class Loop(Protocol):
    """The scheduling the broker needs (an asyncio event loop provides it)."""

    def call_soon(self, callback: Callable[[], object], /) -> object:
        """Run on the next turn of the loop."""
        ...

    def call_soon_threadsafe(self, callback: Callable[[], object], /) -> object:
        """Run on the loop, from any thread."""
        ...

    def call_later(self, delay: float, callback: Callable[[], object], /) -> Cancellable:
        """Run after `delay` seconds."""
        ...


class Cancellable(Protocol):
    """A timer that can be cancelled."""

    def cancel(self) -> None:
        """Do not run it."""
        ...


class FlowReason(enum.Enum):
    """Why a producer's connection stopped being read."""

    MEMORY = "memory"
    PENDING_WRITES = "pending_writes"
    DISK = "disk"


class Producer(Protocol):
    """A connection the broker may pause and resume as a producer."""

    def pause_producer(self, reason: FlowReason) -> None:
        """Stop reading the connection's socket."""
        ...

    def resume_producer(self, reason: FlowReason) -> None:
        """Read again."""
        ...
