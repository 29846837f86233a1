"""Who calls, and what they may do: HTTP basic auth or a verified TLS client certificate,
checked by the broker's own authenticator (the users file, the failed-login throttle and lockout,
scrypt on the login threads), and the `[[acl]]` rules, as for STOMP.

- Without a users file every caller is anonymous (the configuration allows that on a loopback
  address only, or with `allow_anonymous`), whatever it sends. With one, a request without
  credentials is anonymous if `allow_anonymous` is set and refused otherwise.
- Over HTTPS with `[http] tls.client_cert`, a certificate the handshake verified logs its holder
  in as on a STOMP listener (`sluice.auth.login`): its subject CN must name a user of the file,
  who is then the caller without a password; basic auth sent along must name the same user.
  Without a certificate, basic auth decides.
- A refused login is answered `login_failure_delay_s` late, with 401, and counted as a STOMP
  login's refusal is.
- Reading a destination needs `read` on it; creating, deleting and purging need `admin`. What
  concerns the whole broker (its overview, its connections, `/metrics`) needs the permission
  on every destination: on `/queue/>` and `/topic/>`. Without rules, everyone may do
  everything.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging

from aiohttp import web

from sluice.auth.identity import Identity, Permission, Refusal
from sluice.auth.tls import certificate_name
from sluice.core.broker import Broker
from sluice.http.context import Gate
from sluice.http.errors import ApiError, ErrorCode

__all__ = ["CALLER", "EVERY_DESTINATION", "Caller", "authenticate", "caller_of"]

log = logging.getLogger(__name__)

# What "the whole broker" is, for the rules.
EVERY_DESTINATION = ("/queue/>", "/topic/>")
_CHALLENGE = {"WWW-Authenticate": 'Basic realm="sluice", charset="UTF-8"'}


class Caller:
    """The identity a request was made with, and the questions asked of the rules for it."""

    def __init__(self, identity: Identity, gate: Gate, broker: Broker, address: str) -> None:
        self.identity = identity
        self.address = address
        self._gate = gate
        self._broker = broker

    @property
    def user(self) -> str:
        """The user name (`anonymous` for an anonymous caller)."""
        return self.identity.user

    def allows(self, destination: str, permission: Permission) -> bool:
        """Whether the rules in force let this caller do `permission` on `destination`."""
        return self._gate.access.allows(self.identity, destination, permission)

    @property
    def log_extra(self) -> dict[str, str]:
        """The caller's fields for structured logs (`user`, `peer`)."""
        return {"user": self.user, "peer": self.address}

    def require(self, destination: str, permission: Permission) -> None:
        """Raise 403 (counted, logged) unless `allows`."""
        if not self.allows(destination, permission):
            self._denied(destination, permission)

    def require_broker(self, permission: Permission) -> None:
        """Raise 403 unless the caller has `permission` on every destination."""
        for pattern in EVERY_DESTINATION:
            self.require(pattern, permission)

    def _denied(self, destination: str, permission: Permission) -> None:
        self._broker.count("access_denied_" + permission.value)
        log.warning(
            "access denied over HTTP: user %s from %s has no %s permission on %s",
            self.user,
            self.address,
            permission.value,
            destination,
            extra=self.log_extra,
        )
        raise ApiError(
            ErrorCode.FORBIDDEN,
            f"access denied: {permission.value} permission on {destination} is not granted",
        )


# Where the server's checks leave the caller of a request.
CALLER = web.RequestKey("caller", Caller)


def caller_of(request: web.Request) -> Caller:
    """Who made the request (left by the server's checks)."""
    return request[CALLER]


def _credentials(request: web.Request) -> tuple[str | None, str | None]:
    header = request.headers.get("Authorization")
    if header is None:
        return None, None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise ApiError(ErrorCode.UNAUTHORIZED, "only basic authentication is accepted", _CHALLENGE)
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise ApiError(
            ErrorCode.UNAUTHORIZED, "malformed basic authorization header", _CHALLENGE
        ) from None
    login, sep, passcode = decoded.partition(":")
    if not sep:
        raise ApiError(ErrorCode.UNAUTHORIZED, "malformed basic authorization header", _CHALLENGE)
    return login, passcode


def _certificate(request: web.Request) -> str | None:
    """The subject CN of the client certificate the TLS handshake verified; None without one
    (plain HTTP, or none sent). Never from a header."""
    transport = request.transport
    return certificate_name(transport.get_extra_info("peercert")) if transport else None


async def authenticate(request: web.Request, gate: Gate, broker: Broker) -> Caller:
    """Who made this request; raises 401 (late, counted) if the login is refused."""
    login, passcode = _credentials(request)
    address = request.remote or "-"
    certificate = _certificate(request)
    if gate.executor is None:
        outcome = gate.authenticate(login, passcode, address, certificate)
    else:
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(
            gate.executor, gate.authenticate, login, passcode, address, certificate
        )
    if isinstance(outcome, Refusal):
        broker.count(outcome.counter)
        if login is None and passcode is None and certificate is None:
            # A client's first request, before it was asked for credentials: no guess to slow.
            raise ApiError(ErrorCode.UNAUTHORIZED, outcome.reason, _CHALLENGE)
        if outcome.locks:
            broker.count("login_lockouts")
        # The login name as sent (repr: it may hold anything), never the password.
        log.warning(
            "HTTP login refused for %r%s from %s: %s",
            login,
            "" if certificate is None else f" (client certificate for {certificate!r})",
            address,
            outcome.reason,
            extra={"peer": address},
        )
        await asyncio.sleep(broker.limits.login_failure_delay_s)
        raise ApiError(ErrorCode.UNAUTHORIZED, outcome.reason, _CHALLENGE)
    return Caller(outcome, gate, broker, address)
