"""TLS on the broker's side: the `SSLContext` of a `[[listeners]]` table with `tls = {...}`, and
the name a verified client certificate gives its holder.

The context is the standard library's server default (`ssl.create_default_context` for client
authentication: its ciphers, no compression, no renegotiation) with TLS 1.2 as the oldest version
accepted. `client_cert` sets whether a client certificate is asked for (`optional`) or required
(`required`); one that is sent must chain to the listener's `ca`, or the handshake fails. With
`crl`, a client certificate its issuer's list revokes fails the handshake too, and so does one
whose issuer has no list in the file (OpenSSL cannot tell it is not revoked).

A client certificate is an identity only once OpenSSL has verified it: `certificate_name` reads
the subject's common name (CN) from the certificate as the handshake reported it, never from
anything the client writes in a frame.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from sluice.config import ClientCertPolicy, TlsSettings
from sluice.errors import ConfigError, reason_of

__all__ = ["MINIMUM_TLS_VERSION", "certificate_name", "server_context"]

MINIMUM_TLS_VERSION = ssl.TLSVersion.TLSv1_2

_VERIFY_MODES = {
    ClientCertPolicy.NONE: ssl.CERT_NONE,
    ClientCertPolicy.OPTIONAL: ssl.CERT_OPTIONAL,
    ClientCertPolicy.REQUIRED: ssl.CERT_REQUIRED,
}


def server_context(tls: TlsSettings, where: str = "tls") -> ssl.SSLContext:
    """The server context for `tls`; `ConfigError` naming `where` and the file at fault if the
    certificate, key or CA cannot be used."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_TLS_VERSION
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: cannot read {exc.filename}: {exc.strerror}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"{where}: cannot use the certificate {tls.cert} with the key {tls.key} (not PEM, "
            f"an encrypted key, or a key that does not match the certificate): {reason_of(exc)}"
        ) from None
    if tls.ca is not None:
        try:
            context.load_verify_locations(cafile=tls.ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{where}: cannot load the CA certificates {tls.ca}: {reason_of(exc)}"
            ) from None
    if tls.crl is not None:
        try:
            context.load_verify_locations(cafile=tls.crl)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{where}: cannot load the revocation list {tls.crl}: {reason_of(exc)}"
            ) from None
        # The client's own certificate is looked up in the lists (its issuer must have one).
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    context.verify_mode = _VERIFY_MODES[tls.client_cert]
    return context


def certificate_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The subject CN of a verified peer certificate (`transport.get_extra_info("peercert")`),
    or None without a certificate. A subject with no CN, or with more than one, names nobody:
    the empty string, which no user can have."""
    if not peercert:
        return None
    names = [
        value
        for rdn in peercert.get("subject", ())
        for key, value in rdn
        if key == "commonName" and isinstance(value, str)
    ]
    return names[0] if len(names) == 1 else ""
