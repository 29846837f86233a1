"""Version and heart-beat negotiation (STOMP 1.2, "Protocol Negotiation" and "Heart-beating")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice.errors import RemoteProtocolError
from sluice.stomp.frames import Frame, Version
from sluice.stomp.validation import InvalidFrameError

__all__ = [
    "ALL_VERSIONS",
    "VERSIONS_BY_NAME",
    "Negotiated",
    "UnsupportedVersionError",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_heartbeat",
]

ALL_VERSIONS = (Version.V1_0, Version.V1_1, Version.V1_2)
VERSIONS_BY_NAME = {v.value: v for v in Version}


class UnsupportedVersionError(InvalidFrameError):
    """CONNECT offered no version we support. `supported` lists ours, for the ERROR frame."""

    def __init__(self, message: str, frame: Frame, supported: Sequence[Version]) -> None:
        super().__init__(message, frame)
        self.supported = tuple(supported)


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What both ends agreed on at connection time.

    `send_heartbeat_ms`: how often we must send something; `receive_heartbeat_ms`: how often we
    expect something from the peer. 0 means off.
    """

    version: Version
    send_heartbeat_ms: int
    receive_heartbeat_ms: int


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """Parse a `heart-beat` header (`cx,cy` in ms); a missing header is `(0, 0)`."""
    if value is None:
        return (0, 0)
    first, sep, second = value.partition(",")
    first = first.strip(" ")
    second = second.strip(" ")
    if not (sep and first.isascii() and first.isdigit() and second.isascii() and second.isdigit()):
        raise RemoteProtocolError(f"malformed heart-beat header {value[:40]!r}")
    return (int(first), int(second))


def negotiate_heartbeat(client: tuple[int, int], server: tuple[int, int]) -> tuple[int, int]:
    """Return (client-to-server ms, server-to-client ms) from both ends' `heart-beat` values.

    Each direction runs at the larger of what the sender can do and what the receiver wants, and is
    off if either of them is 0.
    """
    client_send, client_receive = client
    server_send, server_receive = server
    upstream = 0 if not client_send or not server_receive else max(client_send, server_receive)
    downstream = 0 if not server_send or not client_receive else max(server_send, client_receive)
    return (upstream, downstream)


def negotiate_version(
    accept_version: str | None, supported: Sequence[Version], connect: Frame
) -> Version:
    """Pick the highest version both sides support; a missing `accept-version` means 1.0."""
    if accept_version is None:
        offered = {Version.V1_0}
    else:
        offered = {
            VERSIONS_BY_NAME[name]
            for name in (part.strip(" ") for part in accept_version.split(","))
            if name in VERSIONS_BY_NAME
        }
    for version in reversed(ALL_VERSIONS):
        if version in offered and version in supported:
            return version
    ours = ",".join(v.value for v in ALL_VERSIONS if v in supported)
    theirs = accept_version if accept_version is not None else "1.0"
    raise UnsupportedVersionError(
        f"no common STOMP version: client accepts {theirs[:40]!r}, supported versions are {ours}",
        connect,
        [v for v in ALL_VERSIONS if v in supported],
    )
