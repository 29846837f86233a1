"""Sending again what a lost connection left unconfirmed (`Client.connect(..., resend=True)`).

A SEND written on a connection that drops before its RECEIPT may or may not be in the broker.
With `resend`, the client gives each such SEND an `x-dedup-id` (unless the caller gave one) and,
when the connection is lost before the RECEIPT, writes it again on the next connection (the same
broker back, or the next of its list after a failover) with the same headers. The broker drops a
second copy whose id it has seen (its dedup window is stored with the messages, so a new master
that took over the store knows the ids the old one stored): a message is stored once either way.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable

from sluice.client.errors import ConnectionLost
from sluice.client.state import ClientState

__all__ = ["DEDUP_ID", "DEFAULT_MAX_RESENDS", "Resender"]

logger = logging.getLogger(__name__)

DEDUP_ID = "x-dedup-id"
# How many connections one SEND is tried on before its `ConnectionLost` reaches the caller.
DEFAULT_MAX_RESENDS = 10


class Resender:
    """Dedup ids for one client's sends, and the loop that sends one until it is receipted."""

    def __init__(self, max_resends: int) -> None:
        self.max_resends = max_resends
        # Unique among clients: a random prefix per client, then a counter.
        self._prefix = f"s-{secrets.token_hex(8)}-"
        self._numbers = itertools.count(1)
        # Sends written again after a lost connection, over the client's life.
        self.resent = 0

    def stamp(self, headers: dict[str, str]) -> str:
        """Give `headers` an `x-dedup-id` unless they have one; return it."""
        dedup_id = headers.get(DEDUP_ID)
        if dedup_id is None:
            dedup_id = headers[DEDUP_ID] = f"{self._prefix}{next(self._numbers)}"
        return dedup_id

    async def send(
        self,
        attempt: Callable[[], Awaitable[None]],
        state: Callable[[], ClientState],
        what: str,
        dedup_id: str,
    ) -> None:
        """Run `attempt` (one SEND and the wait for its RECEIPT) until it succeeds; after a
        `ConnectionLost`, again while the client reconnects, at most `max_resends` times."""
        resends = 0
        while True:
            try:
                await attempt()
                return
            except ConnectionLost:
                if resends >= self.max_resends or state() not in (
                    ClientState.CONNECTED,
                    ClientState.RECONNECTING,
                ):
                    raise
            resends += 1
            self.resent += 1
            logger.warning(
                "%s was not receipted before the connection was lost; sending it again "
                "(x-dedup-id %s, attempt %d)",
                what,
                dedup_id,
                resends + 1,
            )
