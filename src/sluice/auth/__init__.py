"""Who may connect and what they may do: the users file (`users`), the `[[acl]]` rules
(`acl`), failed-login throttling (`throttle`) and the authenticator that joins them (`login`).

Below `server`: it knows nothing of STOMP, sockets or asyncio. `server` asks it for an
`Identity` at CONNECT and for a decision on every frame that touches a destination.
"""

from __future__ import annotations

from sluice.auth.identity import ANONYMOUS, Identity, Permission, Refusal

__all__ = ["ANONYMOUS", "Identity", "Permission", "Refusal"]
