"""STOMP over WebSocket over HTTPS (`wss://`, `[http] tls`): a verified client certificate logs
its holder in as on a STOMP listener, a password login works without one, and the connections
are shown as `stomp-wss`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from management.conftest import Managed, start_managed
from server.test_auth import PASSWORDS, _write_users
from server.test_tls import Pki
from sluice.client.tls import client_context
from wsstomp import WsStomp


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secured(pki: Pki, tmp_path: Path) -> Iterator[Managed]:
    users = tmp_path / "users.toml"
    _write_users(users)
    running = start_managed(
        auth={"users_file": str(users)},
        limits={"login_failure_delay_s": 0},
        http={
            "tls": {
                "cert": str(pki.server.cert),
                "key": str(pki.server.key),
                "ca": str(pki.ca.cert),
                "client_cert": "optional",
            }
        },
    )
    try:
        yield running
    finally:
        running.stop()


def test_wss_logs_in_by_certificate_or_password(secured: Managed, pki: Pki) -> None:
    url = f"wss://127.0.0.1:{secured.server.port}/stomp"

    async def connect(context: object, **login: str) -> tuple[str, set[tuple[str, str]]]:
        ws = await WsStomp.open(url, ssl_context=context, server_hostname="localhost")  # type: ignore[arg-type]
        try:
            connected = await ws.connect(**login)
            listing = await asyncio.to_thread(
                secured.http.with_context(client_context(ca=pki.ca.cert))
                .as_user("alice", PASSWORDS["alice"])
                .get,
                "/api/connections",
            )
            # (A connection closed just before may still be listed for a moment.)
            users = {(item["user"], item["protocol"]) for item in listing.json["items"]}
            return connected.command.value, users
        finally:
            await ws.close()

    async def go() -> None:
        with_cert = client_context(ca=pki.ca.cert, cert=pki.alice.cert, key=pki.alice.key)
        command, users = await connect(with_cert)
        assert command == "CONNECTED"
        assert ("alice", "stomp-wss") in users
        without = client_context(ca=pki.ca.cert)
        command, users = await connect(without, login="bob", passcode=PASSWORDS["bob"])
        assert command == "CONNECTED"
        assert ("bob", "stomp-wss") in users
        command, _ = await connect(without)
        assert command == "ERROR"  # neither a certificate nor a login

    asyncio.run(asyncio.wait_for(go(), 60))
