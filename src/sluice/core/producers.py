"""Who produces to a destination: `ProducerMarks`, the destinations one connection counts as a
producer of, kept so that each destination's `producers` is a plain count.

STOMP has no producer to register (ActiveMQ's `ProducerCount` counts the JMS producers attached
to a destination now). Here a destination's producers are the connections open now that have
sent to it: a connection counts from its first SEND naming the destination (in a transaction
or not, taken or refused), until it closes. Memory is bounded per connection, not per
destination: a connection is a producer of at most `MAX_PRODUCED_DESTINATIONS` destinations,
the ones it sent to most recently; beyond that the one it sent to longest ago stops counting it.

A mark holds a weak reference: a destination the broker removed (idle, or deleted) is not kept
alive by the connections that sent to it, and one created again under the same name counts a
connection from its next SEND. The one exception is `last`, the destination of a connection's
latest SEND, held strongly for the one-comparison fast path: at most one removed destination per
connection stays in memory, until that connection sends elsewhere or closes.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluice.core.destination import Destination

__all__ = ["MAX_PRODUCED_DESTINATIONS", "ProducerMarks"]

# Destinations one connection counts as a producer of (the most recently sent to). Small on
# purpose: a connection that sends to thousands of destinations (which the broker then removes
# when idle) must not keep a large table of its own, allocated late and kept, that stops the
# allocator from giving their memory back (tests/server/test_destination_limits.py: with 1,000,
# more than 28 MiB stayed after the removal; with 16, about 24 MiB, against 21 without marks).
MAX_PRODUCED_DESTINATIONS = 16


class ProducerMarks:
    """The destinations one connection has sent to, most recent last. `last` is the one of the
    latest SEND: the caller skips `note` while it sends there again (the common case costs one
    comparison per SEND)."""

    __slots__ = ("_marks", "last", "limit")

    def __init__(self, limit: int = MAX_PRODUCED_DESTINATIONS) -> None:
        self.limit = limit
        self.last: Destination | None = None
        # id of the destination -> a weak reference to it (the id alone could be reused by a
        # destination created after this one was freed: the reference tells them apart).
        self._marks: dict[int, weakref.ref[Destination]] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def note(self, destination: Destination) -> None:
        """The connection sends to `destination`: count it there, if not yet counted."""
        self.last = destination
        marks = self._marks
        key = id(destination)
        ref = marks.pop(key, None)
        if ref is None or ref() is not destination:
            destination.producers += 1
            ref = weakref.ref(destination)
        marks[key] = ref  # most recent last
        if len(marks) > self.limit:
            _forget(marks.pop(next(iter(marks))))

    def clear(self) -> None:
        """The connection closed: it produces to nothing any more."""
        for ref in self._marks.values():
            _forget(ref)
        self._marks.clear()
        self.last = None


def _forget(ref: weakref.ref[Destination]) -> None:
    destination = ref()
    if destination is not None:
        destination.producers -= 1
