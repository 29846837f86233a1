"""`sluice send` and `sluice recv` over TLS (`--tls --ca --cert --key`): a client certificate
as the identity, a broker of an unknown CA refused with a one-line reason, and `sluice broker`
listening on the `[[listeners]]` of its configuration file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from conftest import RunningBroker, start_broker
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password, save_users
from tlscerts import Authority

from .conftest import sluice, stderr_lines


@pytest.fixture
def pki(tmp_path: Path) -> Authority:
    return Authority.create(tmp_path, "ca")


@pytest.fixture
def tls_broker(pki: Authority, tmp_path: Path) -> Iterator[RunningBroker]:
    server = pki.issue("localhost", server=True)
    users = tmp_path / "users.toml"
    save_users(users, UsersFile([User("cli", (), hash_password("pw", ScryptParams(10, 8, 1)))]))
    tls = {"cert": str(server.cert), "key": str(server.key), "ca": str(pki.cert)}
    running = start_broker(
        listeners=[{"host": "127.0.0.1", "port": 0, "tls": {**tls, "client_cert": "optional"}}],
        auth={"users_file": str(users)},
    )
    try:
        yield running
    finally:
        running.stop()


def test_send_and_recv_with_a_client_certificate(tls_broker: RunningBroker, pki: Authority) -> None:
    me = pki.issue("cli")
    tls = ["--ca", str(pki.cert), "--cert", str(me.cert), "--key", str(me.key)]
    sent = sluice("send", "/queue/tls", "over tls", "--broker", tls_broker.address, *tls)
    assert sent.returncode == 0, sent.stderr
    got = sluice("recv", "/queue/tls", "--broker", tls_broker.address, "--timeout", "10", *tls)
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"over tls\n"
    assert tls_broker.stats()["logins"] == 2


def test_a_broker_of_another_ca_is_refused(tls_broker: RunningBroker, tmp_path: Path) -> None:
    rogue = Authority.create(tmp_path, "rogue")
    sent = sluice(
        "send", "/queue/tls", "x", "--broker", tls_broker.address, "--ca", str(rogue.cert)
    )
    assert sent.returncode == 1
    lines = stderr_lines(sent)
    assert len(lines) == 1, lines
    assert "certificate verify failed" in lines[0]


def test_the_broker_listens_on_its_listeners(pki: Authority, tmp_path: Path) -> None:
    server = pki.issue("localhost", server=True)
    config = (
        '[store]\nkind = "memory"\n\n[[listeners]]\nhost = "127.0.0.1"\nport = 0\n\n'
        '[[listeners]]\nhost = "127.0.0.1"\nport = 0\n'
        f'tls = {{ cert = "{server.cert}", key = "{server.key}" }}\n'
    )
    broker = BrokerProcess(config, tmp_path)
    broker.args.remove("--stomp")
    broker.args.remove("127.0.0.1:0")
    broker.start()
    try:
        line = next(line for line in broker.stderr_lines if "listening on" in line)
        assert line.count("127.0.0.1:") == 2
        assert "(tls)" in line
        tls_port = line.split(", 127.0.0.1:")[1].split(" ")[0]
        sent = sluice(
            "send", "/queue/p", "x", "--broker", f"127.0.0.1:{tls_port}", "--ca", str(pki.cert)
        )
        assert sent.returncode == 0, sent.stderr
    finally:
        broker.stop()
