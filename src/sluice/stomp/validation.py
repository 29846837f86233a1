"""What each STOMP frame must carry, per version, and the error for a frame that breaks it.

The connection checks every frame it receives against these tables (and every frame it sends, to
catch our own bugs). Lookups only: this runs once per inbound frame.
"""

from __future__ import annotations

from sluice.errors import RemoteProtocolError
from sluice.stomp.frames import Command, Frame, Version

__all__ = [
    "FROM_CLIENT",
    "FROM_SERVER",
    "NOT_IN_VERSION",
    "InvalidFrameError",
    "Required",
    "missing_header_message",
]


class InvalidFrameError(RemoteProtocolError):
    """A well-formed frame the peer may not send here, or that lacks a required header.

    `receipt_id` is the frame's `receipt` header, for the `receipt-id` of the ERROR answer.
    """

    def __init__(self, message: str, frame: Frame) -> None:
        super().__init__(message)
        self.frame = frame
        self.receipt_id = frame.headers.get("receipt")


# Required headers, per version and command. Each entry is a tuple of alternatives: the frame must
# carry at least one header of each. Client frames (checked by a server, and on our own sends).
Required = dict[Command, tuple[tuple[str, ...], ...]]
_TRANSACTION: Required = {
    Command.BEGIN: (("transaction",),),
    Command.COMMIT: (("transaction",),),
    Command.ABORT: (("transaction",),),
}
FROM_CLIENT: dict[Version, Required] = {
    Version.V1_0: {
        Command.SEND: (("destination",),),
        Command.SUBSCRIBE: (("destination",),),
        Command.UNSUBSCRIBE: (("id", "destination"),),
        Command.ACK: (("message-id",),),
        **_TRANSACTION,
    },
    Version.V1_1: {
        Command.SEND: (("destination",),),
        Command.SUBSCRIBE: (("destination",), ("id",)),
        Command.UNSUBSCRIBE: (("id",),),
        Command.ACK: (("message-id",), ("subscription",)),
        Command.NACK: (("message-id",), ("subscription",)),
        **_TRANSACTION,
    },
    Version.V1_2: {
        Command.SEND: (("destination",),),
        Command.SUBSCRIBE: (("destination",), ("id",)),
        Command.UNSUBSCRIBE: (("id",),),
        Command.ACK: (("id",),),
        Command.NACK: (("id",),),
        **_TRANSACTION,
    },
}
# Server frames (checked by a client, and on our own sends). A 1.0 MESSAGE has `subscription` only
# when the SUBSCRIBE had an `id`, so it is not required there.
FROM_SERVER: dict[Version, Required] = {
    Version.V1_0: {
        Command.MESSAGE: (("destination",), ("message-id",)),
        Command.RECEIPT: (("receipt-id",),),
    },
    Version.V1_1: {
        Command.MESSAGE: (("destination",), ("message-id",), ("subscription",)),
        Command.RECEIPT: (("receipt-id",),),
    },
    Version.V1_2: {
        Command.MESSAGE: (("destination",), ("message-id",), ("subscription",)),
        Command.RECEIPT: (("receipt-id",),),
    },
}
NOT_IN_VERSION: dict[Version, frozenset[Command]] = {
    Version.V1_0: frozenset({Command.NACK}),
    Version.V1_1: frozenset(),
    Version.V1_2: frozenset(),
}


def missing_header_message(command: Command, alternatives: tuple[str, ...]) -> str:
    """The error message for a frame without any of `alternatives`, naming frame and header."""
    if len(alternatives) == 1:
        return f"{command} frame lacks the required header {alternatives[0]!r}"
    names = " or ".join(repr(h) for h in alternatives)
    return f"{command} frame needs a {names} header"
