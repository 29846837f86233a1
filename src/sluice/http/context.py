"""What the management server asks of the running broker (`Managed`): the core's `Broker`, the
guard that checks logins and permissions (`Gate`), and the connections, which only the server
knows. `sluice.server.listener.BrokerServer` is one; the application hands it over, so that the
two packages never import each other."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

from sluice.auth.acl import AccessControl
from sluice.auth.identity import Identity, Refusal
from sluice.config import Config
from sluice.core.broker import Broker
from sluice.core.views import ConnectionView
from sluice.http.rates import RateSampler

__all__ = ["Gate", "Managed", "Serving", "StompSocket"]


class StompSocket(Protocol):
    """A WebSocket accepted at `/stomp`, as the broker serves STOMP over it (the shape of
    `sluice.server.websocket.MessageSocket`, which this package may not import)."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection the WebSocket runs on."""
        ...

    async def receive(self) -> bytes | str | None:
        """The next message (bytes: binary, str: text); None once closed. Raises
        `LimitExceeded` for a message over `ws_max_message_bytes`."""
        ...

    async def send(self, data: bytes | str) -> None:
        """Send one message."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close with `code` and `reason`."""
        ...


class Gate(Protocol):
    """Who may log in and what they may do: the same check STOMP's CONNECT goes through, and
    the rules in force (a reload replaces `access`)."""

    @property
    def authenticate(
        self,
    ) -> Callable[[str | None, str | None, str, str | None], Identity | Refusal]:
        """login, passcode, the client's address, the CN of a verified client certificate in;
        who it is, or why it is refused, out."""
        ...

    @property
    def access(self) -> AccessControl:
        """The `[[acl]]` rules in force."""
        ...

    @property
    def executor(self) -> Executor | None:
        """Where `authenticate` runs when it is slow (a password hash); None: inline."""
        ...


class Managed(Protocol):
    """The running broker, as the management server sees it."""

    @property
    def config(self) -> Config:
        """The configuration it runs with."""
        ...

    @property
    def broker(self) -> Broker:
        """The core."""
        ...

    @property
    def guard(self) -> Gate:
        """Logins and permissions."""
        ...

    def connection_views(self) -> list[ConnectionView]:
        """Every connection that has logged in."""
        ...

    def close_connection(self, connection_id: int, reason: str) -> bool:
        """Close a logged-in connection with an ERROR saying `reason`; False if there is
        none."""
        ...

    def current_identity(self, identity: Identity) -> Identity | None:
        """Who a user logged in earlier is now (a reload may change the groups); None once
        the user may no longer log in."""
        ...

    async def serve_websocket(self, socket: StompSocket) -> None:
        """Serve STOMP over an accepted WebSocket until it closes."""
        ...

    def close_websockets(self) -> None:
        """Close every STOMP-over-WebSocket connection (the management server stops)."""
        ...


class Serving(Protocol):
    """What the API's handlers ask of the management server that routes to them."""

    @property
    def managed(self) -> Managed:
        """The running broker."""
        ...

    @property
    def rates(self) -> RateSampler:
        """The rates of the last sampling interval."""
        ...

    def uptime_s(self) -> float:
        """Seconds since the server started with the broker."""
        ...
