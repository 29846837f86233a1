"""Helpers shared by the STOMP tests (a unique module name, so it cannot shadow another)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sluice.stomp.codec import FrameParser
from sluice.stomp.frames import Frame, HeartBeat

Event = Frame | HeartBeat
Parse = Callable[..., list[Event]]

# The start of a next frame: it must stay buffered, untouched, after the events before it.
TRAILER = b"SEND\ndestination:/queue/next\ncontent-le"


def drain(parser: FrameParser, chunks: Iterable[bytes]) -> list[Event]:
    """Feed chunks one at a time, draining the parser after each; heart-beat runs collapsed."""
    events: list[Event] = []
    for chunk in chunks:
        parser.feed(chunk)
        while (event := parser.next_event()) is not None:
            if isinstance(event, HeartBeat) and events and isinstance(events[-1], HeartBeat):
                continue
            events.append(event)
    return events


def bytewise(data: bytes) -> list[bytes]:
    """The data as one-byte chunks."""
    return [data[i : i + 1] for i in range(len(data))]
