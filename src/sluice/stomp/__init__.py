"""Sans-IO STOMP 1.0/1.1/1.2: bytes in, events out; no sockets, no clock, no logging.

`codec` parses frames and `encoding` encodes them, `connection` is the state machine for either
end, `negotiation` agrees versions and heart-beats, `validation` holds the headers each frame
needs.
"""

from __future__ import annotations

from sluice.stomp.codec import FrameParser, StompLimits
from sluice.stomp.connection import ConnState, Role, StompConnection
from sluice.stomp.encoding import (
    HEARTBEAT_BYTES,
    assemble_frame,
    encode_frame,
    encode_headers,
    escape_value,
)
from sluice.stomp.frames import Command, Frame, HeartBeat, Version
from sluice.stomp.negotiation import Negotiated, UnsupportedVersionError
from sluice.stomp.validation import InvalidFrameError

__all__ = [
    "HEARTBEAT_BYTES",
    "Command",
    "ConnState",
    "Frame",
    "FrameParser",
    "HeartBeat",
    "InvalidFrameError",
    "Negotiated",
    "Role",
    "StompConnection",
    "StompLimits",
    "UnsupportedVersionError",
    "Version",
    "assemble_frame",
    "encode_frame",
    "encode_headers",
    "escape_value",
]
