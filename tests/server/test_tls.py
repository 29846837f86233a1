"""TLS listeners attacked over real sockets with stomp.py and our client: a plain and a TLS
listener side by side, the wrong CA on either side, an expired client certificate, none when one
is required, `optional` with and without one, a certificate's CN as the user (with the `[[acl]]`
rules applied), TLS 1.1 refused, and every failed handshake logged as one line and counted,
without a traceback."""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from conftest import RunningBroker, start_broker
from sluice.auth.handshake import LOG_BURST, FailureLog
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password, save_users
from sluice.client import BlockingClient, BrokerErrorFrame, Client
from sluice.errors import ClientError
from tlscerts import Authority, Issued
from waiting import wait_until

FAST = ScryptParams(ln=10, r=8, p=1)
PASSWORDS = {"alice": "alice-Pw-1", "bob": "bob-Pw-2"}
ACL: list[dict[str, Any]] = [
    {"destination": "/queue/orders.>", "read": ["*"], "write": ["alice"], "admin": ["*"]},
]


class Pki:
    """The test certificates: a CA, the broker's, clients', and a rogue CA's."""

    def __init__(self, directory: Path) -> None:
        self.ca = Authority.create(directory, "ca")
        self.rogue = Authority.create(directory, "rogue")
        self.server = self.ca.issue("localhost", server=True)
        self.rogue_server = self.rogue.issue("localhost", server=True)
        self.alice = self.ca.issue("alice")
        self.bob = self.ca.issue("bob")
        self.mallory = self.ca.issue("mallory")
        self.alice_expired = self.ca.issue("alice", expired=True)
        self.alice_rogue = self.rogue.issue("alice")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.toml"
    users = UsersFile(User(n, (), hash_password(pw, FAST)) for n, pw in PASSWORDS.items())
    save_users(path, users)
    return path


def _start(
    pki: Pki, client_cert: str, connect_timeout_s: float = 30.0, **overrides: Any
) -> RunningBroker:
    tls = {
        "cert": str(pki.server.cert),
        "key": str(pki.server.key),
        "ca": str(pki.ca.cert),
        "client_cert": client_cert,
    }
    return start_broker(
        listeners=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0, "tls": tls}],
        limits={"login_failure_delay_s": 0, "connect_timeout_s": connect_timeout_s},
        **overrides,
    )


@pytest.fixture
def broker(pki: Pki, caplog: pytest.LogCaptureFixture) -> Iterator[RunningBroker]:
    """Anonymous on loopback; a plain listener and a TLS one with client_cert = optional."""
    caplog.set_level(logging.DEBUG)
    running = _start(pki, "optional")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def secured(
    pki: Pki, users_file: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[RunningBroker]:
    """Users and ACLs; the TLS listener requires a client certificate."""
    caplog.set_level(logging.DEBUG)
    running = _start(pki, "required", auth={"users_file": str(users_file)}, acl=ACL)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def optional(
    pki: Pki, users_file: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[RunningBroker]:
    """Users and ACLs; the TLS listener asks for a client certificate but does not require one."""
    caplog.set_level(logging.DEBUG)
    running = _start(pki, "optional", auth={"users_file": str(users_file)}, acl=ACL)
    try:
        yield running
    finally:
        running.stop()


def _plain(broker: RunningBroker) -> int:
    return broker.server.listeners[0].port


def _tls(broker: RunningBroker) -> int:
    return broker.server.listeners[1].port


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def _stomppy(port: int, ca: Path | None, client: Issued | None = None, **ssl_args: Any) -> Any:
    conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1)
    if ca is not None:
        conn.set_ssl(
            for_hosts=[("127.0.0.1", port)],
            ca_certs=str(ca),
            cert_file=str(client.cert) if client else None,
            key_file=str(client.key) if client else None,
            **ssl_args,
        )
    return conn


class _Frames(stomp.ConnectionListener):  # type: ignore[misc]
    """stomp.py's RECEIPT and ERROR frames, handed to the test thread."""

    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[str, str]] = queue.Queue()

    def on_receipt(self, frame: Any) -> None:
        self.frames.put(("RECEIPT", frame.headers["receipt-id"]))

    def on_error(self, frame: Any) -> None:
        self.frames.put(("ERROR", frame.headers.get("message", "")))


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing the broker (or asyncio under it) logged carries a traceback."""
    broker_records = [
        r for r in caplog.records if r.name.startswith(("sluice.server", "sluice.auth", "asyncio"))
    ]
    assert broker_records
    assert all(record.exc_info is None for record in broker_records)
    assert all("Traceback" not in record.getMessage() for record in broker_records)


def _handshake_failures(broker: RunningBroker, count: int, caplog: pytest.LogCaptureFixture) -> str:
    """Wait for `count` failed handshakes; their log lines."""
    wait_until(
        lambda: broker.stats().get("tls_handshake_failures", 0) >= count, what="handshake failure"
    )
    lines = [r.getMessage() for r in caplog.records if "TLS handshake with" in r.getMessage()]
    assert len(lines) == count, lines
    _no_traceback(caplog)
    return "\n".join(lines)


async def _refused(port: int, **tls: Any) -> ClientError:
    with pytest.raises(ClientError) as info:
        await Client.connect(f"127.0.0.1:{port}", reconnect=False, **tls)
    return info.value


# -- plain and TLS side by side ------------------------------------------------------------------


def test_plain_and_tls_listeners_side_by_side(broker: RunningBroker, pki: Pki) -> None:
    """stomp.py sends over TLS and over plain TCP; our client reads both over TLS."""
    tls_conn = _stomppy(_tls(broker), pki.ca.cert)
    tls_conn.connect(wait=True)
    tls_conn.send("/queue/both", "over tls", receipt="r1")
    plain_conn = _stomppy(_plain(broker), None)
    plain_conn.connect(wait=True)
    plain_conn.send("/queue/both", "over tcp", receipt="r2")

    async def main() -> list[bytes]:
        async with await Client.connect(
            f"127.0.0.1:{_tls(broker)}", ca=pki.ca.cert, reconnect=False
        ) as client:
            sub = await client.subscribe("/queue/both")
            bodies = []
            for _ in range(2):
                message = await sub.get(10)
                assert message is not None
                bodies.append(message.body)
            return bodies

    try:
        assert sorted(run(main())) == [b"over tcp", b"over tls"]
    finally:
        tls_conn.disconnect()
        plain_conn.disconnect()
    assert broker.stats()["tls_handshakes"] == 2


def test_blocking_client_over_tls(broker: RunningBroker, pki: Pki) -> None:
    with BlockingClient(
        f"127.0.0.1:{_tls(broker)}",
        tls=True,
        ca=str(pki.ca.cert),
        server_hostname="localhost",
        reconnect=False,
    ) as client:
        client.send("/queue/blocking", b"hi")
        sub = client.subscribe("/queue/blocking")
        message = sub.receive(10)
    assert message is not None
    assert message.body == b"hi"


def test_a_plain_client_on_the_tls_port_fails_cleanly(
    broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(("127.0.0.1", _tls(broker)), 5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
        sock.settimeout(10)
        assert sock.recv(100) == b""  # closed, no STOMP answer
    # OpenSSL reads "CONNECT " as a proxy request: not TLS at all.
    assert "HTTPS_PROXY_REQUEST" in _handshake_failures(broker, 1, caplog)


def test_a_flood_of_failed_handshakes_is_counted_but_not_all_logged(
    broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """40 peers that do not speak TLS: each is counted, the log gets `LOG_BURST` lines."""
    for _ in range(40):
        with socket.create_connection(("127.0.0.1", _tls(broker)), 5) as sock:
            sock.sendall(b"not TLS\n")
            sock.settimeout(10)
            assert sock.recv(100) == b""
    wait_until(lambda: broker.stats().get("tls_handshake_failures", 0) >= 40, what="40 failures")
    lines = [r.getMessage() for r in caplog.records if "TLS handshake with" in r.getMessage()]
    assert len(lines) == LOG_BURST


def test_failure_log_sums_up_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    failures = FailureLog(window_s=10.0, burst=2, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="sluice.auth.handshake"):
        for i in range(5):
            failures.warn(f"127.0.0.1:{i}", "WRONG_VERSION_NUMBER")
        assert failures.held_back == 3
        now[0] += 10.0
        failures.warn("127.0.0.1:9", "WRONG_VERSION_NUMBER")
    assert [r.getMessage() for r in caplog.records] == [
        "TLS handshake with 127.0.0.1:0 failed: WRONG_VERSION_NUMBER",
        "TLS handshake with 127.0.0.1:1 failed: WRONG_VERSION_NUMBER",
        "3 more TLS handshake failures not logged in the last 10 s "
        "(counted in tls_handshake_failures)",
        "TLS handshake with 127.0.0.1:9 failed: WRONG_VERSION_NUMBER",
    ]


def test_a_tls_client_on_the_plain_port_fails(broker: RunningBroker, pki: Pki) -> None:
    error = run(_refused(_plain(broker), ca=pki.ca.cert, connect_timeout_s=5))
    assert "127.0.0.1" in str(error)


# -- certificates that do not hold ---------------------------------------------------------------


def test_client_rejects_a_server_of_another_ca(broker: RunningBroker, pki: Pki) -> None:
    error = run(_refused(_tls(broker), ca=pki.rogue.cert))
    assert "certificate verify failed" in str(error)
    conn = _stomppy(_tls(broker), pki.rogue.cert)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect(wait=True)
    wait_until(lambda: broker.stats().get("tls_handshake_failures", 0) >= 2)
    assert "tls_handshakes" not in broker.stats()


@pytest.mark.parametrize(
    ("certificate", "reason"),
    [
        ("alice_rogue", "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"),
        ("alice_expired", "CERTIFICATE_VERIFY_FAILED: certificate has expired"),
        (None, "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
    ],
)
def test_server_refuses_client_certificates_that_do_not_hold(
    secured: RunningBroker,
    pki: Pki,
    certificate: str | None,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A certificate of another CA, an expired one, none at all: the handshake fails, for our
    client and for stomp.py, and the broker logs one line each, with the reason."""
    issued: Issued | None = getattr(pki, certificate) if certificate else None
    tls: dict[str, Any] = {"ca": pki.ca.cert}
    if issued is not None:
        tls.update(cert=issued.cert, key=issued.key)
    error = run(_refused(_tls(secured), login="alice", passcode=PASSWORDS["alice"], **tls))
    assert "requires a client certificate, or refuses ours" in str(error)
    assert PASSWORDS["alice"] not in str(error)
    # stomp.py over TLS 1.2, where the broker refuses the certificate within the handshake (with
    # TLS 1.3 it refuses it after, and stomp.py then waits for CONNECTED until its timeout).
    conn = _stomppy(_tls(secured), pki.ca.cert, issued, ssl_version=ssl.PROTOCOL_TLSv1_2)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("alice", PASSWORDS["alice"], wait=True)
    lines = _handshake_failures(secured, 2, caplog)
    assert lines.count(reason) == 2, lines
    assert PASSWORDS["alice"] not in caplog.text
    assert "logins" not in secured.stats()


def test_a_revoked_client_certificate_is_refused(
    pki: Pki, users_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`tls.crl`: a certificate the CA revoked fails the handshake, for our client and for
    stomp.py; one it did not revoke logs in as its CN."""
    caplog.set_level(logging.DEBUG)
    crl = pki.ca.revocation_list([pki.mallory], file_name="ca-crl-mallory.pem")
    tls = {
        "cert": str(pki.server.cert),
        "key": str(pki.server.key),
        "ca": str(pki.ca.cert),
        "client_cert": "required",
        "crl": str(crl),
    }
    running = start_broker(
        listeners=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0, "tls": tls}],
        limits={"login_failure_delay_s": 0},
        auth={"users_file": str(users_file)},
        acl=ACL,
    )
    try:
        port = _tls(running)
        run(_refused(port, ca=pki.ca.cert, cert=pki.mallory.cert, key=pki.mallory.key))
        conn = _stomppy(port, pki.ca.cert, pki.mallory, ssl_version=ssl.PROTOCOL_TLSv1_2)
        with pytest.raises(stomp.exception.ConnectFailedException):
            conn.connect(wait=True)
        lines = _handshake_failures(running, 2, caplog)
        assert lines.count("CERTIFICATE_VERIFY_FAILED: certificate revoked") == 2, lines

        async def alice() -> None:
            async with await Client.connect(
                f"127.0.0.1:{port}",
                ca=pki.ca.cert,
                cert=pki.alice.cert,
                key=pki.alice.key,
                reconnect=False,
            ) as client:
                await client.send("/queue/orders.crl", b"still trusted", receipt=True)

        run(alice())
        assert running.stats()["tls_handshakes"] == 1
    finally:
        running.stop()


def test_tls_1_1_is_refused(
    broker: RunningBroker, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(pki.ca.cert)
    try:
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError) as exc:
        pytest.skip(f"this OpenSSL cannot offer TLS 1.1: {exc}")
    with socket.create_connection(("127.0.0.1", _tls(broker)), 5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"CONNECT\n\n\0")
        except ssl.SSLError as exc:
            if "NO_PROTOCOLS_AVAILABLE" in str(exc) or "no protocols available" in str(exc):
                pytest.skip("this OpenSSL refuses to offer TLS 1.1 at all")
            error: Exception = exc
        else:
            pytest.fail("a TLS 1.1 handshake succeeded")
    assert isinstance(error, ssl.SSLError)
    assert "UNSUPPORTED_PROTOCOL" in _handshake_failures(broker, 1, caplog)


# -- the certificate as the identity -------------------------------------------------------------


def test_the_certificate_cn_is_the_user_and_acls_apply(secured: RunningBroker, pki: Pki) -> None:
    """alice and bob log in by certificate alone; alice may write orders, bob may not."""

    async def main() -> None:
        async with await Client.connect(
            f"127.0.0.1:{_tls(secured)}",
            ca=pki.ca.cert,
            cert=pki.alice.cert,
            key=pki.alice.key,
            reconnect=False,
        ) as alice:
            await alice.send("/queue/orders.1", b"from alice")
        bob = await Client.connect(
            f"127.0.0.1:{_tls(secured)}",
            ca=pki.ca.cert,
            cert=pki.bob.cert,
            key=pki.bob.key,
            reconnect=False,
        )
        try:
            with pytest.raises(BrokerErrorFrame, match="write"):
                await bob.send("/queue/orders.1", b"from bob")
        finally:
            await bob.close()

    run(main())
    # stomp.py, no login: the CN is the login, and the same rules hold.
    alice = _stomppy(_tls(secured), pki.ca.cert, pki.alice)
    alice_frames = _Frames()
    alice.set_listener("frames", alice_frames)
    alice.connect(wait=True)
    alice.send("/queue/orders.1", "from alice by stomp.py", receipt="sent")
    assert alice_frames.frames.get(timeout=10) == ("RECEIPT", "sent")
    alice.disconnect()
    bob = _stomppy(_tls(secured), pki.ca.cert, pki.bob)
    bob_frames = _Frames()
    bob.set_listener("frames", bob_frames)
    bob.connect(wait=True)
    bob.send("/queue/orders.1", "from bob by stomp.py", receipt="refused")
    kind, message = bob_frames.frames.get(timeout=10)
    assert kind == "ERROR"
    assert "write" in message
    stats = secured.stats()
    assert stats["logins"] == 4
    assert stats["access_denied_write"] == 2


@pytest.mark.parametrize(
    ("certificate", "login", "passcode", "message"),
    [
        ("mallory", None, None, "names no user"),
        ("alice", "bob", None, "not the name in the client certificate"),
        ("alice", "bob", PASSWORDS["bob"], "not the name in the client certificate"),
        ("alice", "alice", "wrong-secret", "bad login or passcode"),
    ],
)
def test_certificate_logins_that_do_not_agree_are_refused(
    secured: RunningBroker,
    pki: Pki,
    certificate: str,
    login: str | None,
    passcode: str | None,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    issued: Issued = getattr(pki, certificate)

    async def main() -> None:
        with pytest.raises(BrokerErrorFrame) as info:
            await Client.connect(
                f"127.0.0.1:{_tls(secured)}",
                login=login,
                passcode=passcode,
                ca=pki.ca.cert,
                cert=issued.cert,
                key=issued.key,
                reconnect=False,
            )
        assert message in info.value.message
        assert "wrong-secret" not in info.value.message

    run(main())
    assert "wrong-secret" not in caplog.text
    assert "logins" not in secured.stats()


def test_optional_with_and_without_a_certificate(optional: RunningBroker, pki: Pki) -> None:
    """Without a certificate a password login works (and its ACLs apply); with one, the CN."""

    async def main() -> None:
        async with await Client.connect(
            f"127.0.0.1:{_tls(optional)}",
            login="bob",
            passcode=PASSWORDS["bob"],
            ca=pki.ca.cert,
            reconnect=False,
        ) as bob:
            with pytest.raises(BrokerErrorFrame, match="write"):
                await bob.send("/queue/orders.2", b"from bob")
        with pytest.raises(BrokerErrorFrame, match="needs a login"):
            await Client.connect(f"127.0.0.1:{_tls(optional)}", ca=pki.ca.cert, reconnect=False)
        async with await Client.connect(
            f"127.0.0.1:{_tls(optional)}",
            ca=pki.ca.cert,
            cert=pki.alice.cert,
            key=pki.alice.key,
            reconnect=False,
        ) as alice:
            await alice.send("/queue/orders.2", b"from alice")

    run(main())
    stats = optional.stats()
    assert stats["logins"] == 2
    assert stats["login_refused_no_credentials"] == 1


def test_a_login_header_never_stands_for_a_certificate(secured: RunningBroker) -> None:
    """On the plain listener a login with no passcode is refused, whatever headers say."""
    conn = _stomppy(_plain(secured), None)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("alice", "", wait=True, headers={"x-ssl-client-cn": "alice"})
    assert "logins" not in secured.stats()


def test_a_silent_peer_is_dropped_at_the_handshake_deadline(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = _start(pki, "none", connect_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", _tls(broker)), 5) as sock:
            sock.settimeout(20)
            assert sock.recv(100) == b""  # closed by the broker, not by us
        assert "taking longer than 0.5 seconds" in _handshake_failures(broker, 1, caplog)
    finally:
        broker.stop()
