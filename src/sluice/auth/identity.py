"""Who a connection is (`Identity`), why a login was refused (`Refusal`), and what a frame asks
to do with a destination (`Permission`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ANONYMOUS", "ANONYMOUS_USER", "Identity", "Permission", "Refusal"]

# The user name of a client let in without credentials; no users file may define it.
ANONYMOUS_USER = "anonymous"


class Permission(enum.Enum):
    """What a frame does to a destination: `read` (SUBSCRIBE, ACK), `write` (SEND), `admin`
    (create it)."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated client: its user name and groups, from the users file (never from a
    header the client sets), or the anonymous identity."""

    user: str
    groups: frozenset[str] = frozenset()
    anonymous: bool = False


ANONYMOUS = Identity(ANONYMOUS_USER, frozenset(), anonymous=True)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A login refused. `reason` is fit for the client: it never repeats the passcode and never
    tells an unknown user from a wrong password."""

    reason: str
    # The broker counter this refusal adds to (`login_failures` for bad credentials).
    counter: str = "login_failures"
    # This failure locked the login name or the address out (counted as `login_lockouts`).
    locks: bool = False
