"""What the broker holds of frames still arriving, all connections together, and giving that
memory back once a connection closes.

Every connection's parser holds the bytes of the frame it is reading (and, while flow control
holds the connection, frames read but not yet handled). One connection is bounded by
`max_frame_bytes`; `InboundBudget` bounds them all together by `max_inbound_buffered_bytes`.
Past it, the connection whose partial frame is largest gets an ERROR naming the limit and is
closed (see `docs/security.md` for why this and not a pause): a frame not complete was never
receipted, so nothing the broker promised is lost.

Freed memory does not always leave the process: glibc keeps freed chunks of its heaps for reuse,
and bodies arriving in pieces of a few KiB fragment them, so RSS stays at its peak long after the
connections are gone. `MemoryTrim` calls `malloc_trim(0)` (through ctypes, where the C library
has it) a moment after connections that held a lot were closed, which hands the free pages of
every heap back to the kernel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

# Closed connections that held at least this much, together, lead to one trim.
TRIM_AFTER_FREED_BYTES = 8 * 1024 * 1024
# Delay before trimming: closes come in bursts, one trim serves them all.
TRIM_DELAY_S = 0.2


class Holder(Protocol):
    """A connection holding inbound bytes."""

    def refuse_inbound(self, limit_bytes: int, total_bytes: int, held_bytes: int) -> None:
        """Answer with an ERROR naming `max_inbound_buffered_bytes` and close."""
        ...


class InboundBudget:
    """Inbound bytes held per connection and in all, against `max_inbound_buffered_bytes`."""

    __slots__ = ("_count", "_over", "held", "limit_bytes", "total_bytes")

    def __init__(self, limit_bytes: int, count: Callable[[str], None]) -> None:
        self.limit_bytes = limit_bytes
        self._count = count
        # Connections holding any bytes, and how many.
        self.held: dict[Holder, int] = {}
        self.total_bytes = 0
        # Within an episode over the limit (logged once per episode).
        self._over = False

    def update(self, holder: Holder, held_bytes: int) -> None:
        """`holder` now holds `held_bytes`; refuse the largest holders while over the limit."""
        held = self.held
        old = held.get(holder, 0)
        if held_bytes == old:
            return
        if held_bytes:
            held[holder] = held_bytes
        else:
            del held[holder]
        self.total_bytes += held_bytes - old
        if self.total_bytes > self.limit_bytes:
            self._enforce()
        elif self._over and self.total_bytes <= self.limit_bytes // 2:
            self._over = False
            log.info("inbound bytes held back under half of max_inbound_buffered_bytes")

    def _enforce(self) -> None:
        if not self._over:
            self._over = True
            log.warning(
                "limit max_inbound_buffered_bytes=%d exceeded: %d bytes of frames still arriving "
                "on %d connections; closing the largest",
                self.limit_bytes,
                self.total_bytes,
                len(self.held),
            )
        while self.total_bytes > self.limit_bytes and self.held:
            victim = max(self.held, key=self.held.__getitem__)
            victim_bytes = self.held.pop(victim)
            total = self.total_bytes
            self.total_bytes -= victim_bytes
            self._count("limit_max_inbound_buffered_bytes")
            victim.refuse_inbound(self.limit_bytes, total, victim_bytes)


class MemoryTrim:
    """Give freed heap memory back to the kernel after large closes (glibc's `malloc_trim`)."""

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], object],
        count: Callable[[str], None],
    ) -> None:
        self._call_later = call_later
        self._count = count
        self._freed_bytes = 0
        self._scheduled = False
        self._trim = _malloc_trim()

    def freed(self, nbytes: int) -> None:
        """A connection that held `nbytes` closed."""
        if self._trim is None or nbytes <= 0:
            return
        self._freed_bytes += nbytes
        if self._freed_bytes >= TRIM_AFTER_FREED_BYTES and not self._scheduled:
            self._scheduled = True
            self._call_later(TRIM_DELAY_S, self.trim)

    def trim(self) -> None:
        """Trim now."""
        self._scheduled = False
        self._freed_bytes = 0
        if self._trim is not None:
            self._trim(0)
            self._count("memory_trims")


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim
