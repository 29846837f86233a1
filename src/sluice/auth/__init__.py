"""Who may connect and what they may do: the users file (`users`), the `[[acl]]` rules
(`acl`), failed-login throttling (`throttle`) and the authenticator that joins them (`login`);
TLS contexts (`tls`) and the listener that runs TLS handshakes and accounts for the failed ones
(`handshake`).

Below `server` and `http`: it knows nothing of STOMP or HTTP. `server` asks it for an `Identity`
at CONNECT and for a decision on every frame that touches a destination; both listen for TLS
through `handshake`, the one module here that touches sockets and asyncio.
"""

from __future__ import annotations

from sluice.auth.identity import ANONYMOUS, Identity, Permission, Refusal

__all__ = ["ANONYMOUS", "Identity", "Permission", "Refusal"]
