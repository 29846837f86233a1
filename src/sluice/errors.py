"""The exception hierarchy shared by every layer.

One base, `SluiceError`. Protocol errors split into the peer's fault (`RemoteProtocolError`) and our
own caller's (`LocalProtocolError`); store errors name the file and offset; a limit error names the
limit it hit. `reason_of` gives the short reason of an OS or TLS error, for messages and logs.
"""

from __future__ import annotations

import ssl


class SluiceError(Exception):
    """Base of every error Sluice raises on purpose."""


class ConfigError(SluiceError):
    """A configuration file, flag or environment variable is invalid."""


class ProtocolError(SluiceError):
    """A STOMP protocol violation."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes or frames that break the protocol; the connection cannot go on.

    `receipt_id` is the `receipt` header of the offending frame when it could be read, so the
    ERROR that answers it can carry `receipt-id`; None otherwise.
    """

    receipt_id: str | None = None


class LocalProtocolError(ProtocolError):
    """Our own caller misused the protocol API (a bug on this side, not the peer's)."""


class LimitExceeded(SluiceError):
    """A named bound was reached. `limit` is the setting's name, `value` the bound."""

    def __init__(self, limit: str, value: int, detail: str = "") -> None:
        self.limit = limit
        self.value = value
        message = f"limit {limit}={value} exceeded"
        super().__init__(f"{message}: {detail}" if detail else message)


class FrameLimitExceeded(RemoteProtocolError, LimitExceeded):
    """An inbound frame broke a size or count limit (frame bytes, header bytes, header count)."""

    def __init__(self, limit: str, value: int, detail: str = "") -> None:
        LimitExceeded.__init__(self, limit, value, detail)


class StoreError(SluiceError):
    """A store failed. Names the file and the offset when the failure is tied to a place."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None) -> None:
        self.path = path
        self.offset = offset
        where = ""
        if path is not None:
            where = f" ({path}" + (f" at offset {offset}" if offset is not None else "") + ")"
        super().__init__(message + where)


class CorruptionError(StoreError):
    """Damaged data found where it cannot be cut off safely (not at the tail of the newest file)."""


class StoreIOError(StoreError):
    """The operating system failed a journal operation (a write, a sync, preparing a file).

    `operation` and `strerror` make `reason`, a short account without paths that may be sent to
    a client; the data this operation carried must be taken as lost, never retried as safe."""

    def __init__(
        self,
        operation: str,
        strerror: str,
        path: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.operation = operation
        self.strerror = strerror
        super().__init__(f"{operation} failed: {strerror}", path, offset)

    @property
    def reason(self) -> str:
        """What failed and the system's word for it, fit for a client."""
        return f"{self.operation} failed: {self.strerror}"


class DiskFullError(StoreIOError):
    """The disk had no room for something the store had to write, and nothing of it was written
    (a data file prepared ahead, the next data file, a new store). Not a failure of the store: it
    goes on once space is back."""


class StoreFullError(StoreError, LimitExceeded):
    """The store or temp store reached its disk limit and the policy is to fail sends."""

    def __init__(self, limit: str, value: int, detail: str = "") -> None:
        LimitExceeded.__init__(self, limit, value, detail)
        self.path = None
        self.offset = None


class StoreOfflineError(StoreError):
    """The store cannot be reached for now (its database is restarting, or its connection was
    lost and is being made again): nothing was read or written by the call, which may be tried
    again later."""


class FencedError(StoreError):
    """This broker no longer holds the lease on its store (another broker took it over, or it
    could not renew it in time): it must write nothing more, and stops serving."""


class LeaseError(SluiceError):
    """The high-availability lease cannot be used: its files cannot be read or written, or hold
    something that is not a lease."""


class ClientError(SluiceError):
    """A client-side failure: connection lost, ERROR frame received, receipt timeout."""


class BrokerErrorFrame(ClientError):
    """The broker answered with an ERROR frame. `message` is its `message` header."""

    def __init__(self, message: str, body: bytes = b"", headers: dict[str, str] | None = None):
        self.message = message
        self.body = body
        self.headers = headers or {}
        super().__init__(message)


class RequestError(SluiceError):
    """A client's request cannot be honoured (unknown ack id, unknown transaction, bad header).

    Its message is written for the client and is safe to send back in an ERROR frame."""


class DestinationInUseError(RequestError):
    """An operator asked to remove a destination that consumers, durable subscriptions, open
    transactions, live streams or writes in progress still use; the message says which."""


class AccessDeniedError(RequestError):
    """The connection's user may not do this to this destination (`[[acl]]`). Its message names
    the destination and the permission and is safe to send to the client."""

    def __init__(self, destination: str, permission: str, user: str) -> None:
        self.destination = destination
        self.permission = permission
        self.user = user
        super().__init__(f"access denied: {permission} permission on {destination} is not granted")


class StoreUnavailableError(RequestError):
    """A persistent message cannot be taken: the message store failed and takes no more writes
    until the broker restarts. Its message is safe to send to the client."""


def reason_of(exc: BaseException) -> str:
    """One line on what went wrong, in the words of OpenSSL or the system (no path, no
    traceback): the verification failure of a certificate, OpenSSL's reason, `strerror`; else
    the exception's text, at most 200 characters."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"{exc.reason or 'certificate verify failed'}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]
