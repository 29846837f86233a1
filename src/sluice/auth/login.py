"""The authenticator: CONNECT's `login` and `passcode`, the client's address and the name of its
verified TLS client certificate in, an `Identity` or a `Refusal` out.

- Without a users file every client is anonymous (the configuration allows that only on a
  loopback listener, or with `allow_anonymous`), whatever it sends.
- With one, a client that sends no `login` is anonymous if `allow_anonymous` is set, and refused
  otherwise; an empty login or passcode is refused; a name or address locked out after repeated
  failures is refused without checking the password (`throttle`).
- With a users file and a verified client certificate (a TLS listener with `client_cert`), the
  certificate's subject CN is the login: it must name a user of the file, and that user is the
  identity without a passcode. If CONNECT also sends a `login`, it must be the same name; if it
  sends a `passcode`, it must be that user's password. A certificate never makes a client
  anonymous, whatever `allow_anonymous` says.

`authenticate` may take a while (scrypt): the server runs it on a worker thread. The users are
swapped whole by `replace_users` (a reload), never edited in place, so a check in progress sees
one consistent file. Nothing here logs or returns the passcode.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.auth.identity import ANONYMOUS, Identity, Refusal
from sluice.auth.throttle import LoginThrottle
from sluice.auth.users import UsersFile
from sluice.config import Limits

__all__ = ["BAD_CREDENTIALS", "LOCKED_OUT", "Authenticator"]

BAD_CREDENTIALS = "access refused: bad login or passcode"
LOCKED_OUT = "access refused: too many failed logins; try again later"
NO_CREDENTIALS = "access refused: this broker needs a login and passcode"
EMPTY_CREDENTIALS = "access refused: empty login or passcode"
UNKNOWN_CERTIFICATE = "access refused: the client certificate names no user of this broker"
CERTIFICATE_MISMATCH = "access refused: the login is not the name in the client certificate"


class Authenticator:
    """Checks credentials against the users file, with throttling of failed logins."""

    def __init__(
        self,
        users: UsersFile | None,
        *,
        allow_anonymous: bool,
        limits: Limits,
        clock: Callable[[], float],
    ) -> None:
        self.users = users
        self.allow_anonymous = allow_anonymous
        self.throttle = LoginThrottle(limits, clock)

    def replace_users(self, users: UsersFile | None, allow_anonymous: bool) -> None:
        """Use another users file from now on (a reload)."""
        self.users = users
        self.allow_anonymous = allow_anonymous

    def __call__(
        self,
        login: str | None,
        passcode: str | None,
        address: str,
        certificate: str | None = None,
    ) -> Identity | Refusal:
        return self.authenticate(login, passcode, address, certificate)

    def authenticate(
        self,
        login: str | None,
        passcode: str | None,
        address: str,
        certificate: str | None = None,
    ) -> Identity | Refusal:
        """Who this client is, or why it is refused. `certificate` is the subject CN of the
        client's verified TLS certificate (`sluice.auth.tls.certificate_name`), None without one.
        Thread-safe."""
        users = self.users
        if users is None:
            return ANONYMOUS
        if certificate is not None:
            user = users.get(certificate) if certificate else None
            if user is None:
                return Refusal(UNKNOWN_CERTIFICATE, "login_refused_certificate_unknown")
            if login is not None and login != certificate:
                return Refusal(CERTIFICATE_MISMATCH, "login_refused_certificate_mismatch")
            if passcode is None:
                return user.identity
            login = certificate
        if login is None and passcode is None:
            if self.allow_anonymous:
                return ANONYMOUS
            return Refusal(NO_CREDENTIALS, "login_refused_no_credentials")
        if not login or not passcode:
            return Refusal(EMPTY_CREDENTIALS, "login_refused_empty_credentials")
        throttle = self.throttle
        if throttle.locked_out(login, address):
            return Refusal(LOCKED_OUT, "login_refused_locked_out")
        identity = users.authenticate(login, passcode)
        if identity is None:
            return Refusal(BAD_CREDENTIALS, locks=throttle.failed(login, address))
        throttle.succeeded(login)
        return identity
