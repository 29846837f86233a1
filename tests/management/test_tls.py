"""The management server over HTTPS (`[http] tls`), against a running broker: a client
certificate logs its holder in as on a STOMP listener and the `[[acl]]` rules apply to them, a
client without one falls back to basic auth, certificates the handshake must not accept (another
CA's, expired, revoked, none where one is required) are refused, and `sluice admin --url
https://...` with `--ca`, `--cert` and `--key`."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.conftest import sluice, stderr_lines
from server.test_auth import PASSWORDS, _write_users
from server.test_tls import Pki
from sluice.auth.handshake import LOG_BURST
from sluice.client import BlockingClient
from sluice.client.tls import client_context
from sluice.errors import ConfigError
from waiting import wait_until

from .conftest import Http, Managed, start_managed
from .test_auth import ACL


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, client_cert: str, **more: str) -> dict[str, str]:
    return {
        "cert": str(pki.server.cert),
        "key": str(pki.server.key),
        "ca": str(pki.ca.cert),
        "client_cert": client_cert,
        **more,
    }


def _secured(tmp_path: Path, tls: dict[str, str]) -> Managed:
    users = tmp_path / "users.toml"
    _write_users(users)
    return start_managed(
        auth={"users_file": str(users)},
        acl=ACL,
        limits={"login_failure_delay_s": 0},
        http={"tls": tls},
    )


@pytest.fixture
def optional(pki: Pki, tmp_path: Path) -> Iterator[Managed]:
    """Users and ACLs; HTTPS asks for a client certificate and does not require one."""
    running = _secured(tmp_path, _tls(pki, "optional"))
    try:
        yield running
    finally:
        running.stop()


def _https(managed: Managed, pki: Pki, holder: Any = None) -> Http:
    """The management server over HTTPS, trusting the test CA, presenting `holder`'s
    certificate (an `Issued`) if given."""
    context = client_context(
        ca=pki.ca.cert,
        cert=holder.cert if holder else None,
        key=holder.key if holder else None,
    )
    return managed.http.with_context(context)


def _handshake_refused(http: Http) -> BaseException:
    """The error a request meets when the server refuses the client's certificate (before
    TLS 1.3 in the handshake, with it on the first read)."""
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)) as refused:
        http.get("/api/overview")
    assert not isinstance(refused.value, urllib.error.HTTPError), "an HTTP answer came"
    return refused.value


def test_a_certificate_logs_its_user_in_and_the_rules_apply(optional: Managed, pki: Pki) -> None:
    alice = _https(optional, pki, pki.alice)  # ops
    bob = _https(optional, pki, pki.bob)  # shop
    assert alice.base.startswith("https://")
    assert optional.server.url.startswith("https://127.0.0.1:")
    assert alice.put("/api/destinations/queue/orders.eu").status == 201
    assert bob.put("/api/destinations/queue/open.x").status == 201
    refused = bob.put("/api/destinations/queue/orders.us")
    assert refused.status == 403
    assert refused.json["error"]["message"] == (
        "access denied: admin permission on /queue/orders.us is not granted"
    )
    names = [item["name"] for item in bob.get("/api/destinations").json["items"]]
    assert names == ["/queue/open.x"]
    assert bob.get("/api/destinations/queue/orders.eu").status == 403
    assert alice.get("/api/overview").status == 200
    assert bob.get("/api/overview").status == 403
    stats = optional.broker.stats()
    assert stats["access_denied_admin"] >= 1
    assert stats["access_denied_read"] >= 2
    assert stats.get("login_failures", 0) == 0


def test_without_a_certificate_basic_auth_decides(optional: Managed, pki: Pki) -> None:
    anonymous = _https(optional, pki)
    challenge = anonymous.get("/api/overview")
    assert challenge.status == 401
    assert challenge.headers["WWW-Authenticate"].startswith("Basic")
    alice = anonymous.as_user("alice", PASSWORDS["alice"])
    assert alice.get("/api/overview").status == 200
    bob = anonymous.as_user("bob", PASSWORDS["bob"])
    assert bob.get("/api/overview").status == 403
    wrong = anonymous.as_user("alice", "not her password")
    assert wrong.get("/api/overview").status == 401
    assert optional.broker.stats()["login_failures"] == 1
    # Plain HTTP is not served on the HTTPS port.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        optional.http.get("/healthz")


def test_a_certificate_with_another_login_is_refused(optional: Managed, pki: Pki) -> None:
    """As on a STOMP listener: basic auth sent along must name the certificate's user (and
    then be their password)."""
    alice_cert = _https(optional, pki, pki.alice)
    as_bob = alice_cert.as_user("bob", PASSWORDS["bob"])
    mismatch = as_bob.get("/api/overview")
    assert mismatch.status == 401
    assert mismatch.json["error"]["message"] == (
        "access refused: the login is not the name in the client certificate"
    )
    assert alice_cert.as_user("alice", PASSWORDS["alice"]).get("/api/overview").status == 200
    assert alice_cert.as_user("alice", "wrong").get("/api/overview").status == 401
    stats = optional.broker.stats()
    assert stats["login_refused_certificate_mismatch"] == 1
    assert stats["login_failures"] == 1


def test_a_certificate_of_no_user_is_refused(optional: Managed, pki: Pki) -> None:
    mallory = _https(optional, pki, pki.mallory)  # signed by the CA, not in the users file
    refused = mallory.get("/api/destinations")
    assert refused.status == 401
    assert refused.json["error"]["message"] == (
        "access refused: the client certificate names no user of this broker"
    )
    # Basic auth of a real user does not make the certificate someone else's.
    assert mallory.as_user("alice", PASSWORDS["alice"]).get("/api/destinations").status == 401
    assert optional.broker.stats()["login_refused_certificate_unknown"] == 2
    # The probes need no login, certificate or not.
    assert mallory.get("/healthz").status == 200


def test_bad_certificates_are_refused_in_the_handshake(optional: Managed, pki: Pki) -> None:
    for holder in (pki.alice_rogue, pki.alice_expired):
        _handshake_refused(_https(optional, pki, holder))
    # A client that does not trust the server's CA refuses it.
    untrusting = optional.http.with_context(client_context(ca=pki.rogue.cert))
    refused = _handshake_refused(untrusting)
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused)
    # The server still serves the others.
    assert _https(optional, pki, pki.alice).get("/api/overview").status == 200


def test_a_required_certificate_and_a_revoked_one(pki: Pki, tmp_path: Path) -> None:
    crl = pki.ca.revocation_list([pki.bob], file_name="http-crl.pem")
    running = _secured(tmp_path, _tls(pki, "required", crl=str(crl)))
    try:
        _handshake_refused(_https(running, pki))  # none
        _handshake_refused(_https(running, pki, pki.bob))  # revoked
        _handshake_refused(_https(running, pki, pki.alice_rogue))
        assert _https(running, pki, pki.alice).get("/api/overview").status == 200
    finally:
        running.stop()


def test_without_users_a_certificate_is_no_login(pki: Pki) -> None:
    """Without a users file everyone is anonymous on loopback, certificate or not (as on a
    STOMP listener)."""
    running = start_managed(http={"tls": _tls(pki, "optional")})
    try:
        for holder in (None, pki.alice, pki.mallory):
            assert _https(running, pki, holder).get("/api/overview").status == 200
    finally:
        running.stop()


def test_tls_files_that_cannot_be_used_stop_the_start(pki: Pki) -> None:
    mismatched = {"cert": str(pki.server.cert), "key": str(pki.alice.key)}
    with pytest.raises(ConfigError, match=r"\[http\]: cannot use the certificate"):
        start_managed(http={"tls": mismatched})


# -- sluice admin over HTTPS ----------------------------------------------------------------------


def _admin(managed: Managed, *args: str, stdin: bytes = b"") -> tuple[int, str, list[str]]:
    url = f"https://127.0.0.1:{managed.server.port}"
    result = sluice("admin", "--url", url, *args, stdin=stdin)
    return result.returncode, result.stdout.decode(), stderr_lines(result)


def test_sluice_admin_over_https(optional: Managed, pki: Pki) -> None:
    assert _https(optional, pki, pki.alice).put("/api/destinations/queue/orders.eu").status == 201
    ca = ("--ca", str(pki.ca.cert))
    alice = ("--cert", str(pki.alice.cert), "--key", str(pki.alice.key))
    code, out, err = _admin(optional, *ca, *alice, "--json", "list", "destinations")
    assert code == 0, err
    assert [d["name"] for d in json.loads(out)] == ["/queue/orders.eu"]
    # Basic auth without a certificate.
    code, out, err = _admin(
        optional,
        *ca,
        "--user",
        "alice",
        "--password-stdin",
        "show",
        "/queue/orders.eu",
        stdin=PASSWORDS["alice"].encode() + b"\n",
    )
    assert code == 0, err
    assert "name: /queue/orders.eu" in out.splitlines()
    # Bob's certificate: logged in as bob, whom the rules refuse.
    bob = ("--cert", str(pki.bob.cert), "--key", str(pki.bob.key))
    code, out, err = _admin(optional, *ca, *bob, "purge", "/queue/orders.eu")
    assert (code, out) == (1, "")
    assert err == [
        "sluice admin: access denied: admin permission on /queue/orders.eu is not granted "
        "(forbidden, HTTP 403)"
    ], err
    # Without the CA, the server's certificate is not trusted.
    code, _, err = _admin(optional, *alice, "list", "destinations")
    assert code == 1
    assert len(err) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in err[0], err
    # TLS flags need an https URL.
    result = sluice("admin", "--url", "http://127.0.0.1:1", *ca, "list", "destinations")
    assert result.returncode == 2
    assert "--ca, --cert and --key are for an https:// URL" in result.stderr.decode()


def test_sluice_admin_refused_certificate(pki: Pki, tmp_path: Path) -> None:
    running = _secured(tmp_path, _tls(pki, "required"))
    try:
        ca = ("--ca", str(pki.ca.cert))
        rogue = ("--cert", str(pki.alice_rogue.cert), "--key", str(pki.alice_rogue.key))
        code, out, err = _admin(running, *ca, *rogue, "list", "destinations")
        assert (code, out) == (1, "")
        assert len(err) == 1
        assert f"https://127.0.0.1:{running.server.port}" in err[0], err
        assert "closed the connection without an answer" in err[0], err
        assert "client certificate" in err[0], err
    finally:
        running.stop()


def test_plain_probe_of_the_https_port_gets_no_answer(optional: Managed) -> None:
    with socket.create_connection(("127.0.0.1", optional.server.port), 5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert b"200" not in sock.recv(100)


# -- failed handshakes, logged and counted as a STOMP listener's ---------------------------------


def _handshake_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]


def _tls_metrics(managed: Managed, pki: Pki) -> dict[tuple[str, str], float]:
    reply = _https(managed, pki, pki.alice).get("/metrics")
    assert reply.status == 200, reply.text
    return {
        (sample.name, sample.labels["server"]): sample.value
        for family in text_string_to_metric_families(reply.text)
        if family.name in ("sluice_tls_handshakes", "sluice_tls_handshake_failures")
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_failed_https_handshakes_are_logged_and_counted(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that speaks plain HTTP, a certificate of another CA and a client that does not
    trust the server: each failed handshake is one line naming the peer and OpenSSL's reason,
    with no traceback, and counted with the listeners' (`tls_handshake_failures`) and apart
    (`http_tls_handshake_failures`, the `http` series in /metrics)."""
    caplog.set_level(logging.INFO)
    running = _secured(tmp_path, _tls(pki, "required"))
    try:
        stats = running.broker.stats
        with socket.create_connection(("127.0.0.1", running.server.port), 5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(10)
            assert sock.recv(100) == b""  # closed, no HTTP answer
        wait_until(lambda: stats().get("http_tls_handshake_failures", 0) == 1, what="plain")
        _handshake_refused(_https(running, pki, pki.alice_rogue))
        _handshake_refused(running.http.with_context(client_context(ca=pki.rogue.cert)))
        wait_until(lambda: stats().get("http_tls_handshake_failures", 0) == 3, what="3 failures")
        assert _https(running, pki, pki.alice).get("/api/overview").status == 200
        counters = stats()
        assert counters["tls_handshake_failures"] == 3
        assert counters["http_tls_handshakes"] == counters["tls_handshakes"] >= 1
        lines = _handshake_lines(caplog)
        assert len(lines) == 3, lines
        assert all(" on the management server failed: " in line for line in lines), lines
        reasons = sorted(line.partition(" failed: ")[2].partition(":")[0] for line in lines)
        # Plain HTTP, the rogue certificate, a client that does not trust the server.
        assert reasons == ["CERTIFICATE_VERIFY_FAILED", "HTTP_REQUEST", "TLSV1_ALERT_UNKNOWN_CA"]
        assert all(line.startswith("TLS handshake with 127.0.0.1:") for line in lines), lines
        records = [r for r in caplog.records if r.name.startswith(("sluice", "asyncio", "aiohttp"))]
        assert all(record.exc_info is None for record in records)
        metrics = _tls_metrics(running, pki)
        assert metrics[("sluice_tls_handshake_failures_total", "http")] == 3
        assert metrics[("sluice_tls_handshake_failures_total", "stomp")] == 0
        assert metrics[("sluice_tls_handshakes_total", "http")] >= 2
    finally:
        running.stop()


def test_a_flood_of_failed_https_handshakes_is_counted_not_all_logged(
    optional: Managed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(LOG_BURST + 15):
        with socket.create_connection(("127.0.0.1", optional.server.port), 5) as sock:
            sock.sendall(b"not TLS\n")
            sock.settimeout(10)
            assert sock.recv(100) == b""
    stats = optional.broker.stats
    wait_until(
        lambda: stats().get("http_tls_handshake_failures", 0) == LOG_BURST + 15,
        what="every failure counted",
    )
    assert stats()["tls_handshake_failures"] == LOG_BURST + 15
    assert len(_handshake_lines(caplog)) == LOG_BURST


def test_connections_say_their_protocol(pki: Pki) -> None:
    """A STOMP client over a TLS listener is listed as `stomp-tls`, one over plain TCP as
    `stomp-tcp`."""
    tls = {"cert": str(pki.server.cert), "key": str(pki.server.key), "ca": str(pki.ca.cert)}
    running = start_managed(
        listeners=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0, "tls": tls}]
    )
    listeners = running.broker.server.listeners
    plain = BlockingClient(f"127.0.0.1:{listeners[0].port}", reconnect=False)
    secure = BlockingClient(
        f"127.0.0.1:{listeners[1].port}",
        tls=True,
        ca=str(pki.ca.cert),
        server_hostname="localhost",
        reconnect=False,
    )
    try:
        with plain, secure:
            plain.send("/queue/p", b"plain")
            secure.send("/queue/p", b"tls")
            items = running.http.get("/api/connections").json["items"]
            assert sorted((c["protocol"], c["tls"]) for c in items) == [
                ("stomp-tcp", False),
                ("stomp-tls", True),
            ]
            code, out, err = _list_connections(running)
            assert code == 0, err
            assert sorted(line.split()[3] for line in out.splitlines()[1:]) == [
                "stomp-tcp",
                "stomp-tls",
            ]
    finally:
        running.stop()


def _list_connections(managed: Managed) -> tuple[int, str, list[str]]:
    result = sluice("admin", "--url", managed.http.base, "list", "connections")
    return result.returncode, result.stdout.decode(), stderr_lines(result)
