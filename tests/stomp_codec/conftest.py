"""Fixtures for the STOMP tests: every input is fed whole, byte by byte, and with a trailer."""

from __future__ import annotations

import pytest

from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.frames import Version

from .stomp_helpers import TRAILER, Event, Parse, bytewise, drain


@pytest.fixture(params=["whole", "bytewise", "trailing"])
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
        parser = FrameParser(limits or StompLimits(), version)
        if feed_mode == "whole":
            return drain(parser, [data])
        if feed_mode == "bytewise":
            return drain(parser, bytewise(data))
        events = drain(parser, [data + TRAILER])
        assert parser.buffered_bytes == len(TRAILER)
        return events

    return run
