"""TLS on the client's side: the `SSLContext` a client (ours, the CLI's, the Spark connector's,
the benchmark's) dials a TLS listener with.

`client_context` starts from the standard library's defaults for talking to a server
(`ssl.create_default_context`: the server's certificate is verified and must name the host
dialled) with TLS 1.2 as the oldest version offered. `ca` replaces the system's trusted CAs with
a bundle of one's own (a private CA); `cert` and `key` are the client certificate a listener with
`client_cert` asks for. A key password, when there is one, goes to OpenSSL and nowhere else: it is
not kept, logged, or put in an error.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from sluice.errors import ClientError, reason_of

__all__ = ["MINIMUM_TLS_VERSION", "client_context"]

MINIMUM_TLS_VERSION = ssl.TLSVersion.TLSv1_2


def client_context(
    *,
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    key_password: str | None = None,
) -> ssl.SSLContext:
    """A client context: trust `ca` (else the system's CAs), present `cert` with `key` (the key
    may be in `cert`'s file). Raises `ClientError` naming the file that cannot be used."""
    if key is not None and cert is None:
        raise ClientError("a TLS client key needs its certificate (cert)")
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    except (ssl.SSLError, OSError) as exc:
        raise ClientError(f"cannot load the CA certificates {ca}: {reason_of(exc)}") from None
    context.minimum_version = MINIMUM_TLS_VERSION
    if cert is not None:
        try:
            context.load_cert_chain(
                str(cert), str(key) if key is not None else None, password=key_password
            )
        except (ssl.SSLError, OSError) as exc:
            raise ClientError(
                f"cannot use the client certificate {cert}"
                + (f" with the key {key}" if key is not None else "")
                + f": {reason_of(exc)}"
            ) from None
    return context
