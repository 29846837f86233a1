"""CONNECT and the login: the half of `session.StompSession` that turns a CONNECT frame into a
connected session.

Reading stops until the credentials are checked (on the guard's executor when the check is a
password hash, so the loop never waits for scrypt). A refusal is answered late
(`login_failure_delay_s`); a user at `max_connections_per_user` is refused with the limit named;
otherwise the session answers CONNECTED, gets its core `BrokerConnection` and its `Requests`, and
reads on.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from sluice.auth.identity import Identity, Refusal
from sluice.auth.tls import certificate_name
from sluice.config import Config
from sluice.core.broker import Broker
from sluice.core.connection import BrokerConnection
from sluice.errors import RemoteProtocolError
from sluice.server.access import SessionAccess
from sluice.server.context import CloseReason, SessionContext
from sluice.server.flow import FlowControl, ReadPause
from sluice.server.heartbeat import Heartbeat
from sluice.server.outbound import Outbound
from sluice.server.requests import Requests
from sluice.stomp.connection import StompConnection
from sluice.stomp.frames import Frame, Version
from sluice.stomp.negotiation import UnsupportedVersionError


class SessionConnect:
    """CONNECT for `StompSession`, which sets the attributes below and provides `_fail` and
    `_new_requests`."""

    # Set by `StompSession.__init__`.
    context: SessionContext
    broker: Broker
    config: Config
    loop: asyncio.AbstractEventLoop
    stomp: StompConnection
    transport: asyncio.Transport | None
    core: BrokerConnection | None
    flow: FlowControl
    outbound: Outbound
    heartbeat: Heartbeat
    requests: Requests | None
    access: SessionAccess
    identity: Identity | None
    log: logging.LoggerAdapter  # type: ignore[type-arg]
    connected_at_ms: int
    _timer: asyncio.TimerHandle | None
    _closing: bool
    _counted_user: str | None
    _version: Version

    def _fail(
        self,
        reason: CloseReason,
        message: str,
        *,
        receipt_id: str | None = None,
        frame: Frame | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send ERROR, then close (the session's)."""
        raise NotImplementedError

    def _new_core(self, client_id: str | None) -> BrokerConnection:
        """The core's side of the connection (the session's: it is the core's link)."""
        raise NotImplementedError

    def _new_requests(self, core: BrokerConnection) -> Requests:
        """The handlers of the frames after CONNECT (the session's)."""
        raise NotImplementedError

    def _on_connect(self, frame: Frame) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Nothing more is read until the credentials are checked (on a worker thread when the
        # check is a password hash); frames sent behind CONNECT wait in the parser.
        self.flow.pause(ReadPause.LOGIN)
        guard = self.context.guard
        args = (
            frame.headers.get("login"),
            frame.headers.get("passcode"),
            self._peer_host(),
            self._certificate_name(),
        )
        if guard.executor is None:
            self._logged_in(frame, guard.authenticate(*args))
            return
        future = self.loop.run_in_executor(guard.executor, guard.authenticate, *args)

        def done(future: asyncio.Future[Identity | Refusal]) -> None:
            if self._closing:
                return
            try:
                outcome = future.result()
            except Exception:
                self.log.exception("internal error while checking credentials")
                self._fail(CloseReason.INTERNAL_ERROR, "internal error")
                return
            self._logged_in(frame, outcome)

        future.add_done_callback(done)

    def _peer_host(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else "-"

    def _certificate_name(self) -> str | None:
        # From the TLS handshake (a verified certificate), never from a frame.
        transport = self.transport
        return certificate_name(transport.get_extra_info("peercert")) if transport else None

    def _logged_in(self, frame: Frame, outcome: Identity | Refusal) -> None:
        receipt = frame.headers.get("receipt")
        if isinstance(outcome, Refusal):
            self.broker.count(outcome.counter)
            if outcome.locks:
                self.broker.count("login_lockouts")
            # The login name as sent (repr: it may hold anything), never the passcode.
            self.log.warning("login refused for %r: %s", frame.headers.get("login"), outcome.reason)
            # A refused login is answered late, so guessing passwords is slow.
            self._timer = self.loop.call_later(
                self.config.limits.login_failure_delay_s,
                lambda: self._fail(CloseReason.AUTH_FAILED, outcome.reason, receipt_id=receipt),
            )
            return
        if self._over_user_limit(outcome):
            limit = self.config.limits.max_connections_per_user
            self._fail(
                CloseReason.LIMIT,
                f"limit max_connections_per_user={limit} reached for user {outcome.user}",
                receipt_id=receipt,
            )
            return
        try:
            self._accept(frame, outcome, receipt)
        except UnsupportedVersionError as exc:
            self.broker.count("protocol_errors")
            versions = ",".join(v.value for v in exc.supported)
            self._fail(
                CloseReason.PROTOCOL_ERROR,
                str(exc),
                receipt_id=receipt,
                headers={"version": versions},
            )
        except RemoteProtocolError as exc:  # a malformed heart-beat
            self.broker.count("protocol_errors")
            self._fail(CloseReason.PROTOCOL_ERROR, str(exc), receipt_id=receipt)

    def _over_user_limit(self, identity: Identity) -> bool:
        """Whether the user already has `max_connections_per_user` connections (counted)."""
        limit = self.config.limits.max_connections_per_user
        if identity.anonymous or not limit:
            return False
        if self.context.user_connections[identity.user] < limit:
            return False
        self.broker.count("limit_max_connections_per_user")
        self.log.warning(
            "refusing a login of %s: limit max_connections_per_user=%d", identity.user, limit
        )
        return True

    def _accept(self, frame: Frame, identity: Identity, receipt: str | None) -> None:
        hb = self.config.heartbeat
        data = self.stomp.accept(
            frame,
            server_heartbeat=(hb.send_ms, hb.receive_ms),
            server_name=self.context.server_name,
            session=f"{self.context.broker_name}-{secrets.token_hex(16)}",
        )
        self.identity = self.access.identity = identity
        if not identity.anonymous:
            self.context.user_connections[identity.user] += 1
            self._counted_user = identity.user
            self.broker.count("logins")
            self.log.info("logged in as %s", identity.user)
        self._version = self.stomp.version
        self.core = self._new_core(frame.headers.get("client-id"))
        self.log.extra = {**self.log.extra, "connection_id": self.core.id, "user": identity.user}  # type: ignore[dict-item]
        self.connected_at_ms = self.broker.now_ms()
        self.requests = self._new_requests(self.core)
        self.broker.count("connections_accepted")
        self.outbound.write(data)
        self.heartbeat.arm()
        if receipt is not None:
            self.requests.receipt(receipt)
        self.flow.resume(ReadPause.LOGIN)
