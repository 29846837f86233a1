"""The connector over TLS, without Spark: the `tls` options, their checks, credentials kept out
of the options' `repr`, and the blocking wire session to a TLS listener (with a client
certificate as the identity)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="needs the spark extra")

from conftest import RunningBroker, start_broker
from sluice.auth.users import ScryptParams, User, UsersFile, hash_password, save_users
from sluice.errors import ClientError
from sluice.spark.offsets import fetch_offsets
from sluice.spark.options import OptionError, TlsOptions, sink_options, source_options
from sluice.spark.produce import send_transaction
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command
from tlscerts import Authority, Issued

pytestmark = pytest.mark.spark


def test_tls_options() -> None:
    plain = source_options({"topic": "t", "passcode": "s3cret"}, streaming=False)
    assert plain.tls is None
    assert "s3cret" not in repr(plain)
    sink = sink_options(
        {
            "tls.ca": "/etc/ca.pem",
            "tls.cert": "/etc/me.pem",
            "tls.key": "/etc/me.key",
            "tls.keyPassword": "k3y-pw",
            "passcode": "s3cret",
        }
    )
    assert sink.tls == TlsOptions("/etc/ca.pem", "/etc/me.pem", "/etc/me.key", "k3y-pw")
    assert "k3y-pw" not in repr(sink)
    assert "s3cret" not in repr(sink)
    assert source_options({"topic": "t", "tls": "true"}, streaming=True).tls == TlsOptions()
    with pytest.raises(OptionError, match=r"tls\.key needs tls\.cert"):
        sink_options({"tls.key": "/etc/me.key"})
    with pytest.raises(OptionError, match="tls must be true or false"):
        sink_options({"tls": "maybe"})


class _Pki:
    def __init__(self, directory: Path) -> None:
        self.ca = Authority.create(directory, "ca")
        self.server: Issued = self.ca.issue("localhost", server=True)
        self.spark: Issued = self.ca.issue("spark")


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[RunningBroker, _Pki]]:
    pki = _Pki(tmp_path)
    users = tmp_path / "users.toml"
    save_users(users, UsersFile([User("spark", (), hash_password("pw", ScryptParams(10, 8, 1)))]))
    tls = {
        "cert": str(pki.server.cert),
        "key": str(pki.server.key),
        "ca": str(pki.ca.cert),
        "client_cert": "required",
    }
    running = start_broker(
        listeners=[{"host": "127.0.0.1", "port": 0, "tls": tls}],
        auth={"users_file": str(users)},
        acl=[
            {
                "destination": "/queue/spark.>",
                "read": ["spark"],
                "write": ["spark"],
                "admin": ["spark"],
            },
            {"destination": "/topic/spark.>", "read": ["spark"], "admin": ["spark"]},
        ],
    )
    try:
        yield running, pki
    finally:
        running.stop()


def test_the_wire_session_speaks_tls_with_a_client_certificate(
    tls_broker: tuple[RunningBroker, _Pki],
) -> None:
    broker, pki = tls_broker
    options = sink_options(
        {
            "broker": broker.address,
            "destination": "/queue/spark.out",
            "tls.ca": str(pki.ca.cert),
            "tls.cert": str(pki.spark.cert),
            "tls.key": str(pki.spark.key),
        }
    )
    result = send_transaction(options, iter([(None, {}, b"a"), (None, {}, b"b")]), "p-")
    assert result.per_destination == {"/queue/spark.out": 2}
    with WireSession.open(broker.address, tls=options.tls) as session:
        session.request(Command.SUBSCRIBE, {"destination": "/queue/spark.out", "id": "1"})
        assert [session.receive().body for _ in range(2)] == [b"a", b"b"]
    assert broker.stats()["logins"] == 2
    # The offsets of a topic, as the source asks for them, over the same TLS.
    assert fetch_offsets(broker.address, "/topic/spark.tls", tls=options.tls) == (1, 0)
    # Without a certificate, the broker refuses the handshake.
    with pytest.raises(ClientError, match="no broker answered"):
        WireSession.open(broker.address, tls=TlsOptions(ca=str(pki.ca.cert)), timeout_s=5)
