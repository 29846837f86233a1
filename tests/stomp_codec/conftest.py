"""Fixtures for the STOMP tests: every input is fed whole, byte by byte, and with a trailer.

`gathered` feeds byte by byte to a parser that gathers every body announced by content-length in
pieces (`large_body_bytes=1`), the path large bodies take.
"""

from __future__ import annotations

import pytest

from sluice.stomp.codec import LARGE_BODY_BYTES, FrameParser, StompLimits
from sluice.stomp.frames import Version

from .stomp_helpers import TRAILER, Event, Parse, bytewise, drain


@pytest.fixture(params=["whole", "bytewise", "trailing", "gathered"])
def feed_mode(request: pytest.FixtureRequest) -> str:
    """How a test's input is fed to the parser."""
    return str(request.param)


@pytest.fixture
def parse(feed_mode: str) -> Parse:
    """Parse bytes into events, feeding them as `feed_mode` says.

    In `trailing` mode the start of another frame follows the data; the events must be the same and
    the trailer must be all that is left in the buffer.
    """

    def run(
        data: bytes,
        version: Version = Version.V1_2,
        limits: StompLimits | None = None,
    ) -> list[Event]:
        large_body_bytes = 1 if feed_mode == "gathered" else LARGE_BODY_BYTES
        parser = FrameParser(limits or StompLimits(), version, large_body_bytes=large_body_bytes)
        if feed_mode == "whole":
            return drain(parser, [data])
        if feed_mode in ("bytewise", "gathered"):
            return drain(parser, bytewise(data))
        events = drain(parser, [data + TRAILER])
        assert parser.buffered_bytes == len(TRAILER)
        return events

    return run
