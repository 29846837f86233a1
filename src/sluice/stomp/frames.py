"""STOMP frames and commands: the values the codec turns bytes into and back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Command(enum.StrEnum):
    """Every STOMP command, client and server."""

    CONNECT = "CONNECT"
    STOMP = "STOMP"
    SEND = "SEND"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    ACK = "ACK"
    NACK = "NACK"
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ABORT = "ABORT"
    DISCONNECT = "DISCONNECT"
    CONNECTED = "CONNECTED"
    MESSAGE = "MESSAGE"
    RECEIPT = "RECEIPT"
    ERROR = "ERROR"


CLIENT_COMMANDS = frozenset(
    {
        Command.CONNECT,
        Command.STOMP,
        Command.SEND,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.ACK,
        Command.NACK,
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.DISCONNECT,
    }
)
SERVER_COMMANDS = frozenset({Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR})
# Only these may carry a body (STOMP 1.2, "Frames and Headers").
BODY_COMMANDS = frozenset({Command.SEND, Command.MESSAGE, Command.ERROR})
# CONNECT and CONNECTED are never escaped (STOMP 1.2, "Value Encoding"); STOMP is CONNECT's synonym.
RAW_COMMANDS = frozenset({Command.CONNECT, Command.STOMP, Command.CONNECTED})
# Frames that carry content-length even with an empty body, so a reader never scans for NUL.
CONTENT_LENGTH_COMMANDS = frozenset({Command.SEND, Command.MESSAGE, Command.ERROR})
# A content-length with more significant digits than this exceeds any frame limit.
MAX_LENGTH_DIGITS = 18


def preview(text: str, limit: int = 40) -> str:
    """A short repr for error messages, so a peer cannot make us echo kilobytes back."""
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)


class Version(enum.Enum):
    """A STOMP protocol version. Values order oldest to newest."""

    V1_0 = "1.0"
    V1_1 = "1.1"
    V1_2 = "1.2"

    @property
    def escapes_headers(self) -> bool:
        """1.0 has no header escaping; 1.1 and 1.2 have."""
        return self is not Version.V1_0


@dataclass(frozen=True, slots=True)
class Frame:
    """One STOMP frame. `headers` keeps the first value of a repeated header."""

    command: Command
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartBeat:
    """A bare end-of-line between frames: the peer is alive."""
