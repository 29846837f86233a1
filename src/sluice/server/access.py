"""The permission checks of one session: the frames that touch a destination ask here before
the core acts (`[[acl]]`, through the broker's shared `Guard`).

SEND needs `write` on its destination, SUBSCRIBE (durable or at an `x-offset` too) and ACK/NACK
`read`, and a frame that would create a destination (the first SEND or SUBSCRIBE to it) needs
`admin` as well, as ActiveMQ asks. Stream chunks are SENDs and stream readers SUBSCRIBE, and the
frames of a transaction are checked one by one as they arrive, before COMMIT.
"""

from __future__ import annotations

from sluice.auth.identity import ANONYMOUS, Identity, Permission
from sluice.core.broker import Broker
from sluice.core.wildcard import is_wildcard
from sluice.errors import AccessDeniedError
from sluice.server.context import Guard

__all__ = ["SessionAccess"]

_TOPIC = "/topic/"


class SessionAccess:
    """Checks one connection's frames against the rules in force."""

    __slots__ = ("_broker", "guard", "identity")

    def __init__(self, guard: Guard, broker: Broker) -> None:
        self.guard = guard
        self._broker = broker
        self.identity: Identity = ANONYMOUS

    def allows(self, destination: str, permission: Permission) -> bool:
        """Whether the identity has `permission` on `destination` under the rules in force."""
        return self.guard.access.allows(self.identity, destination, permission)

    def check(self, destination: str, permission: Permission) -> None:
        """Raise `AccessDeniedError` unless the identity has `permission` on `destination`."""
        if not self.allows(destination, permission):
            raise AccessDeniedError(destination, permission.value, self.identity.user)

    def _creates(self, destination: str) -> bool:
        if destination in self._broker.destinations:
            return False
        return not (destination.startswith(_TOPIC) and is_wildcard(destination[len(_TOPIC) :]))

    def check_use(self, destination: str, permission: Permission) -> None:
        """`permission` on `destination`, and `admin` too if the frame would create it."""
        access = self.guard.access
        if access.open:
            return
        self.check(destination, permission)
        if self._creates(destination):
            self.check(destination, Permission.ADMIN)
