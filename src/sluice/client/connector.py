"""Dialling, failover and reconnection: the client's current `ClientLink` and its state.

`Connector` tries the brokers in order until one completes the STOMP handshake. When the link
drops and reconnecting is on, one task dials again: the first round at once, then rounds spaced by
exponential backoff with jitter, bounded by `max_reconnect_delay_s`. Each new link is handed to the
owner (`ConnectorOwner.restore`) before anyone else may use it, so that the owner's subscriptions
are back in place first. An ERROR in answer to CONNECT is final: retrying bad credentials would
only hammer the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from sluice.client.address import BrokerAddress, backoff_delay_s
from sluice.client.errors import ConnectionLost
from sluice.client.link import ClientLink
from sluice.client.options import ClientOptions
from sluice.client.state import ClientState
from sluice.errors import BrokerErrorFrame, ClientError
from sluice.stomp.frames import Frame

__all__ = ["CLOSE_TIMEOUT_S", "Connector", "ConnectorOwner"]

logger = logging.getLogger(__name__)

# DISCONNECT's receipt, a transport's close and an aborted handshake are waited for at most this.
CLOSE_TIMEOUT_S = 5.0


class ConnectorOwner(Protocol):
    """What the connector tells the client about its connections."""

    def route_message(self, link: ClientLink, frame: Frame) -> None:
        """A MESSAGE arrived on the current link."""

    def restore(self, link: ClientLink) -> None:
        """A new link is up (after a drop): put subscriptions back on it, without waiting."""

    def connection_ended(self, link: ClientLink) -> None:
        """The current link is gone: what belonged to it (transactions, unacked messages) too."""

    def failed(self, error: ClientError) -> None:
        """The client will not reconnect: end every subscription with `error`."""

    def deliveries_blocked(self) -> bool:
        """Whether a subscription buffer is full."""


class Connector:
    """The connection side of a `Client`: one current link, dialled and redialled."""

    def __init__(
        self, owner: ConnectorOwner, brokers: Sequence[BrokerAddress], options: ClientOptions
    ) -> None:
        self._owner = owner
        self.brokers = tuple(brokers)
        self.options = options
        self._versions = options.versions()
        self._state = ClientState.CONNECTING
        self._ready = asyncio.Event()
        self._link: ClientLink | None = None
        self._epoch = 0
        self._failure: ClientError | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    @property
    def state(self) -> ClientState:
        """Where the client stands."""
        return self._state

    @property
    def link(self) -> ClientLink | None:
        """The current link, if any (usable or not)."""
        return self._link

    @property
    def epoch(self) -> int:
        """Number of the newest connection; it grows by one at each (re)connection."""
        return self._epoch

    def _set_state(self, state: ClientState) -> None:
        self._state = state
        if state is ClientState.CONNECTING or state is ClientState.RECONNECTING:
            self._ready.clear()
        else:
            self._ready.set()

    # Dialling.

    async def _open(self, address: BrokerAddress) -> ClientLink:
        """Dial one broker and complete the STOMP handshake."""
        loop = asyncio.get_running_loop()
        options = self.options
        deadline = loop.time() + options.connect_timeout_s
        epoch = self._epoch + 1
        label = f"{address}#{epoch}"

        def make_link() -> ClientLink:
            return ClientLink(
                self,
                epoch=epoch,
                label=label,
                limits=options.limits,
                grace_factor=options.heartbeat_grace_factor,
            )

        try:
            _, link = await asyncio.wait_for(
                loop.create_connection(
                    make_link,
                    address.host,
                    address.port,
                    ssl=options.ssl_context,
                    server_hostname=(
                        (options.server_hostname or address.host) if options.ssl_context else None
                    ),
                ),
                options.connect_timeout_s,
            )
        except TimeoutError:
            raise ClientError(
                f"cannot connect to {address}: no answer within {options.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ClientError(f"cannot connect to {address}: {exc.strerror or exc}") from None
        try:
            headers = dict(options.connect_headers)
            if options.client_id is not None:
                headers["client-id"] = options.client_id
            link.start(
                host=address.host,
                login=options.login,
                passcode=options.passcode,
                heartbeat_ms=options.heartbeat_ms,
                versions=self._versions,
                extra_headers=headers,
            )
            negotiated = await link.wait_connected(deadline - loop.time())
        except BaseException:
            link.abort(ConnectionLost(f"handshake with {address} failed"))
            # Let the transport finish closing, so that no socket outlives the attempt.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(link.lost), CLOSE_TIMEOUT_S)
            raise
        self._epoch = epoch
        logger.info(
            "connected to %s (STOMP %s, heart-beats %d/%d ms)",
            address,
            negotiated.version.value,
            negotiated.send_heartbeat_ms,
            negotiated.receive_heartbeat_ms,
        )
        return link

    async def _open_any(self) -> ClientLink:
        """Try each broker in order; raise `BrokerErrorFrame` at once, else all the failures."""
        failures: list[str] = []
        for address in self.brokers:
            try:
                return await self._open(address)
            except BrokerErrorFrame:
                raise
            except ClientError as exc:
                logger.info("%s", exc)
                failures.append(str(exc))
        raise ClientError("no broker reachable: " + "; ".join(failures))

    async def connect(self) -> None:
        """The first connection: one pass over the brokers."""
        try:
            link = await self._open_any()
        except BaseException:
            self._set_state(ClientState.CLOSED)
            self._closed.set()
            raise
        self._link = link
        if not link.usable:
            self._link = None
            self._set_state(ClientState.CLOSED)
            self._closed.set()
            raise link.error or ConnectionLost("connection lost right after CONNECTED")
        self._set_state(ClientState.CONNECTED)

    def _reconnecting(self) -> bool:
        # A method, not an inline test, because the state changes across the loop's awaits.
        return self._state is ClientState.RECONNECTING

    async def _reconnect(self) -> None:
        options = self.options
        round_number = 0
        try:
            while self._reconnecting():
                delay_s = backoff_delay_s(
                    round_number, options.initial_reconnect_delay_s, options.max_reconnect_delay_s
                )
                round_number += 1
                if delay_s:
                    # A pause between rounds, not a wait for an event.
                    await asyncio.sleep(delay_s)
                try:
                    link = await self._open_any()
                except BrokerErrorFrame as exc:
                    self.fail(exc)
                    return
                except ClientError as exc:
                    logger.info("reconnect round %d failed: %s", round_number, exc)
                    continue
                if not self._reconnecting():
                    # Closed meanwhile (a cancellation can lose the race with the handshake).
                    link.abort(ConnectionLost("the client is closing"))
                    return
                self._link = link
                try:
                    self._owner.restore(link)
                except ClientError as exc:
                    logger.info("reconnect round %d failed: %s", round_number, exc)
                if not link.usable:
                    self._link = None
                    link.abort(ConnectionLost("connection lost while restoring subscriptions"))
                    continue
                self._set_state(ClientState.CONNECTED)
                logger.info("reconnected to %s", link.label)
                return
        except Exception:
            # The task's boundary: a bug here must not leave waiters hanging.
            logger.exception("reconnecting failed")
            self.fail(ConnectionLost("reconnecting failed on an internal error"))

    def fail(self, error: ClientError) -> None:
        """End the client for good (no reconnect): waiters and subscriptions get `error`."""
        if self._state in (ClientState.CLOSING, ClientState.CLOSED, ClientState.FAILED):
            return
        self._failure = error
        self._set_state(ClientState.FAILED)
        self._owner.failed(error)
        link = self._link
        if link is not None:
            link.abort(error)

    # LinkOwner.

    def link_message(self, link: ClientLink, frame: Frame) -> None:
        """A MESSAGE frame: the owner's, unless it comes from a link no longer current."""
        if link is self._link:
            self._owner.route_message(link, frame)

    def link_lost(self, link: ClientLink, error: ClientError) -> None:
        """A connection ended: reconnect, fail, or nothing while closing."""
        if link is not self._link:
            return
        self._link = None
        self._owner.connection_ended(link)
        if self._state is not ClientState.CONNECTED:
            # Closing, failed, or the reconnect task is already at work.
            return
        if not self.options.reconnect:
            self.fail(ConnectionLost(f"{error} (reconnect is off)"))
            return
        logger.warning("%s; reconnecting", error)
        self._set_state(ClientState.RECONNECTING)
        self._reconnect_task = asyncio.get_running_loop().create_task(
            self._reconnect(), name="sluice-reconnect"
        )

    def deliveries_blocked(self) -> bool:
        """Whether a subscription buffer is full (not while closing, so close cannot stall)."""
        return self._state is not ClientState.CLOSING and self._owner.deliveries_blocked()

    # Waiting for a connection.

    async def live_link(self, timeout_s: float) -> ClientLink:
        """The usable link, waiting at most `timeout_s` for a reconnect to finish."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            state = self._state
            link = self._link
            remaining = max(deadline - loop.time(), 0.0)
            try:
                if state is ClientState.CONNECTED and link is not None:
                    if link.usable:
                        return link
                    # Failing: its end (and the switch to RECONNECTING) is a moment away.
                    await asyncio.wait_for(asyncio.shield(link.lost), remaining)
                elif state is ClientState.FAILED:
                    assert self._failure is not None
                    raise self._failure
                elif state is ClientState.CLOSING or state is ClientState.CLOSED:
                    raise ClientError("the client is closed")
                else:
                    await asyncio.wait_for(self._ready.wait(), remaining)
            except TimeoutError:
                raise ConnectionLost(
                    f"not connected to a broker (still {self._state.value} after {timeout_s:g} s)"
                ) from None

    def current_link(self) -> ClientLink | None:
        """The link if connected now, else None (no waiting)."""
        link = self._link
        if self._state is ClientState.CONNECTED and link is not None:
            return link
        return None

    # Closing.

    async def close(self) -> None:
        """Stop reconnecting, DISCONNECT (bounded wait) and close the link. Then call `closed`."""
        was_connected = self._state is ClientState.CONNECTED
        self._set_state(ClientState.CLOSING)
        task = self._reconnect_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        link = self._link
        timeout_s = min(self.options.receipt_timeout_s, CLOSE_TIMEOUT_S)
        if link is not None:
            if was_connected and link.usable:
                try:
                    await link.disconnect(timeout_s)
                except ClientError as exc:
                    logger.debug("DISCONNECT: %s", exc)
            await link.close(timeout_s)

    async def wait_closed(self) -> None:
        """Wait until a close under way is complete."""
        await self._closed.wait()

    def closed(self) -> None:
        """Record that closing is complete."""
        self._link = None
        self._set_state(ClientState.CLOSED)
        self._closed.set()
