"""`sluice.auth.tls` and the certificate rule of the authenticator, without sockets: the
contexts a listener gets (TLS 1.2 at least, the client certificate policy), clear errors for
files that cannot be used, and who a certificate's CN makes a client."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from sluice.auth.identity import Identity, Refusal
from sluice.auth.login import CERTIFICATE_MISMATCH, UNKNOWN_CERTIFICATE, Authenticator
from sluice.auth.tls import certificate_name, server_context
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password
from sluice.config import ClientCertPolicy, Limits, TlsSettings
from sluice.errors import ConfigError
from tlscerts import Authority

FAST = ScryptParams(ln=10, r=8, p=1)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority.create(tmp_path_factory.mktemp("pki"), "ca")


@pytest.mark.parametrize(
    ("policy", "mode"),
    [
        (ClientCertPolicy.NONE, ssl.CERT_NONE),
        (ClientCertPolicy.OPTIONAL, ssl.CERT_OPTIONAL),
        (ClientCertPolicy.REQUIRED, ssl.CERT_REQUIRED),
    ],
)
def test_server_context(ca: Authority, policy: ClientCertPolicy, mode: ssl.VerifyMode) -> None:
    server = ca.issue("localhost", server=True)
    context = server_context(TlsSettings(server.cert, server.key, ca.cert, policy))
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == mode


def test_a_key_that_is_not_the_certificates_is_a_config_error(ca: Authority) -> None:
    one = ca.issue("localhost", server=True, file_name="one")
    other = ca.issue("localhost", server=True, file_name="other")
    with pytest.raises(ConfigError, match=r"cannot use the certificate .*one\.pem with the key"):
        server_context(TlsSettings(one.cert, other.key), "[[listeners]] 2")


def test_a_garbled_key_or_ca_is_a_config_error(ca: Authority, tmp_path: Path) -> None:
    server = ca.issue("localhost", server=True)
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="listener 1: cannot use the certificate"):
        server_context(TlsSettings(server.cert, garbled), "listener 1")
    with pytest.raises(ConfigError, match="cannot load the CA certificates"):
        server_context(TlsSettings(server.cert, server.key, garbled, ClientCertPolicy.REQUIRED))


def test_certificate_name() -> None:
    assert certificate_name(None) is None
    assert certificate_name({}) is None
    subject = ((("countryName", "FR"),), (("commonName", "alice"),))
    assert certificate_name({"subject": subject}) == "alice"
    # No CN, or two: nobody.
    assert certificate_name({"subject": ((("organizationName", "x"),),)}) == ""
    two = ((("commonName", "alice"),), (("commonName", "bob"),))
    assert certificate_name({"subject": two}) == ""


def _authenticator() -> Authenticator:
    users = UsersFile(
        [
            User("alice", ("ops",), hash_password("alice-pw", FAST)),
            User("bob", (), hash_password("bob-pw", FAST)),
        ]
    )
    return Authenticator(users, allow_anonymous=True, limits=Limits(), clock=lambda: 0.0)


ALICE = Identity("alice", frozenset({"ops"}))


@pytest.mark.parametrize(
    ("login", "passcode", "certificate", "outcome"),
    [
        (None, None, "alice", ALICE),  # the CN is the login
        ("alice", None, "alice", ALICE),
        ("alice", "alice-pw", "alice", ALICE),  # both, and they agree
        (None, "alice-pw", "alice", ALICE),
        ("alice", "wrong", "alice", "bad login or passcode"),
        ("bob", None, "alice", CERTIFICATE_MISMATCH),
        ("bob", "bob-pw", "alice", CERTIFICATE_MISMATCH),
        (None, None, "mallory", UNKNOWN_CERTIFICATE),  # even with allow_anonymous
        (None, None, "", UNKNOWN_CERTIFICATE),
        (None, None, None, "anonymous"),
    ],
)
def test_the_certificate_rule(
    login: str | None, passcode: str | None, certificate: str | None, outcome: object
) -> None:
    got = _authenticator()(login, passcode, "10.0.0.1", certificate)
    if isinstance(outcome, Identity):
        assert got == outcome
    elif outcome == "anonymous":
        assert isinstance(got, Identity)
        assert got.anonymous
    else:
        assert isinstance(got, Refusal)
        assert str(outcome) in got.reason
