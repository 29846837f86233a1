"""Memory usage with a limit, and the producers waiting for it to drain.

A `Usage` counts bytes held by one destination; its parent counts the whole broker. It is over its
limit when either is. Producers that sent into a full destination register a resume callback and
are called back, once, when usage falls below the resume threshold of both. The waiters are keyed
by connection, so there is at most one per connection.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Usage:
    """Bytes in use against a limit, with a parent (the broker) that also counts them."""

    __slots__ = ("_resume_ratio", "_waiters", "children", "limit_bytes", "name", "parent", "used")

    def __init__(
        self,
        name: str,
        limit_bytes: int,
        resume_ratio: float,
        parent: Usage | None = None,
    ) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        self.parent = parent
        self.used = 0
        self._resume_ratio = resume_ratio
        self._waiters: dict[Hashable, Callable[[], None]] = {}
        # Only the broker-wide usage tracks children, to wake them when it drains.
        self.children: set[Usage] = set()
        if parent is not None:
            parent.children.add(self)

    def detach(self) -> None:
        """Forget this usage at its parent (the destination was deleted)."""
        if self.parent is not None:
            self.parent.children.discard(self)

    @property
    def full(self) -> bool:
        """True when this usage or one above it is at or above its limit."""
        usage: Usage | None = self
        while usage is not None:
            if usage.limit_bytes and usage.used >= usage.limit_bytes:
                return True
            usage = usage.parent
        return False

    @property
    def headroom_bytes(self) -> int | None:
        """Bytes that may still be added before this usage or its parent is full (None: no
        limit applies)."""
        room = self.limit_bytes - self.used if self.limit_bytes else None
        if self.parent is not None:
            above = self.parent.headroom_bytes
            if above is not None:
                room = above if room is None else min(room, above)
        return None if room is None else max(room, 0)

    def _below_resume(self) -> bool:
        if self.limit_bytes and self.used > self.limit_bytes * self._resume_ratio:
            return False
        return self.parent is None or self.parent._below_resume()

    def add(self, nbytes: int) -> None:
        """Count bytes now held."""
        self.used += nbytes
        if self.parent is not None:
            self.parent.used += nbytes

    def release(self, nbytes: int) -> None:
        """Count bytes no longer held, and wake the waiters once usage is low enough."""
        self.used -= nbytes
        parent = self.parent
        if parent is not None:
            parent.used -= nbytes
        if self._waiters and self._below_resume():
            self._wake()
        if parent is not None and parent._waiters and parent._below_resume():
            parent._wake_tree()

    def wait(self, key: Hashable, resume: Callable[[], None]) -> None:
        """Call `resume` once usage drains. A second wait by the same key replaces the first."""
        self._waiters[key] = resume

    def cancel_wait(self, key: Hashable) -> None:
        """Forget a waiter (its connection closed)."""
        self._waiters.pop(key, None)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for resume in waiters.values():
            resume()

    def _wake_tree(self) -> None:
        self._wake()
        for child in list(self.children):
            if child._waiters and child._below_resume():
                child._wake()

    @property
    def waiting(self) -> int:
        """How many producers wait on this usage."""
        return len(self._waiters)
