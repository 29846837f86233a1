"""Who may call the management API: HTTP basic auth against the users file (the broker's own
authenticator, its throttle and lockout), the `[[acl]]` rules (`read` to look, `admin` to
change, on every destination for what concerns the whole broker), and the loopback rule
without users."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from server.test_auth import PASSWORDS, Clock, _write_users
from sluice import config as config_mod
from sluice.errors import ConfigError

from .conftest import Managed, start_managed

ACL: list[dict[str, Any]] = [
    {"destination": "/queue/orders.>", "read": ["ops"], "write": ["shop"], "admin": ["ops"]},
    {"destination": "/queue/open.>", "read": ["*"], "write": ["*"], "admin": ["*"]},
    {"destination": "/queue/>", "read": ["ops"], "admin": ["ops"]},
    {"destination": "/topic/>", "read": ["ops"], "admin": ["ops"]},
]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Managed]:
    users = tmp_path / "users.toml"
    _write_users(users)
    clock = Clock()
    running = start_managed(
        auth={"users_file": str(users)},
        acl=ACL,
        limits={
            "login_failure_delay_s": 0,
            "login_lockout_failures": 3,
            "login_lockout_window_s": 60,
        },
        login_clock=clock,
    )
    try:
        yield running
    finally:
        running.stop()


def test_no_credentials_is_a_challenge(secured: Managed) -> None:
    reply = secured.http.get("/api/overview")
    assert reply.status == 401
    assert reply.json["error"]["code"] == "unauthorized"
    assert reply.headers["WWW-Authenticate"].startswith("Basic")
    # Probes and the API's description need no login.
    assert secured.http.get("/healthz").status == 200
    assert secured.http.get("/readyz").status == 200
    assert secured.http.get("/api/openapi.json").status == 200


def test_wrong_password_then_lockout(secured: Managed) -> None:
    wrong = secured.http.as_user("alice", "not her password")
    for _ in range(3):
        reply = wrong.get("/api/destinations")
        assert reply.status == 401
        assert reply.json["error"]["message"] == "access refused: bad login or passcode"
    # Locked out now, even with the right password, as a STOMP login would be.
    right = secured.http.as_user("alice", PASSWORDS["alice"])
    locked = right.get("/api/destinations")
    assert locked.status == 401
    assert "too many failed logins" in locked.json["error"]["message"]
    stats = secured.broker.stats()
    assert stats["login_failures"] == 3
    assert stats["login_lockouts"] >= 1
    assert stats["login_refused_locked_out"] == 1


def test_malformed_authorization_is_401(secured: Managed) -> None:
    req = urllib.request.Request(secured.http.base + "/api/destinations")
    req.add_header("Authorization", "Basic %%%")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401


def test_permissions_follow_the_rules(secured: Managed) -> None:
    alice = secured.http.as_user("alice", PASSWORDS["alice"])  # ops
    bob = secured.http.as_user("bob", PASSWORDS["bob"])  # shop
    assert alice.put("/api/destinations/queue/orders.eu").status == 201
    assert bob.put("/api/destinations/queue/open.x").status == 201
    refused = bob.put("/api/destinations/queue/orders.us")
    assert refused.status == 403
    assert refused.json["error"] == {
        "code": "forbidden",
        "message": "access denied: admin permission on /queue/orders.us is not granted",
    }
    # Bob sees only what he may read.
    names = [item["name"] for item in bob.get("/api/destinations").json["items"]]
    assert names == ["/queue/open.x"]
    assert bob.get("/api/destinations/queue/orders.eu").status == 403
    assert bob.delete("/api/destinations/queue/orders.eu/messages").status == 403
    assert alice.delete("/api/destinations/queue/orders.eu/messages").status == 200
    # The whole broker: alice has read and admin on every destination, bob does not.
    assert alice.get("/api/overview").status == 200
    assert alice.get("/api/connections").status == 200
    assert bob.get("/api/overview").status == 403
    assert bob.get("/api/connections").status == 403
    assert bob.delete("/api/connections/1").status == 403
    stats = secured.broker.stats()
    assert stats["access_denied_admin"] >= 3
    assert stats["access_denied_read"] >= 3


def test_connections_show_the_user(secured: Managed) -> None:
    stomp_conn = stomp.Connection12([("127.0.0.1", secured.broker.port)])
    stomp_conn.connect("bob", PASSWORDS["bob"], wait=True)
    alice = secured.http.as_user("alice", PASSWORDS["alice"])
    users = [item["user"] for item in alice.get("/api/connections").json["items"]]
    assert users == ["bob"]
    stomp_conn.disconnect()


def test_beyond_loopback_needs_users() -> None:
    with pytest.raises(ConfigError, match=r"http\.host = '0\.0\.0\.0' listens beyond loopback"):
        config_mod.load(env={}, overrides={"http": {"host": "0.0.0.0"}})
    # Off, or with anonymous access allowed on purpose, it starts.
    config_mod.load(env={}, overrides={"http": {"host": "0.0.0.0", "enabled": False}})
    config_mod.load(
        env={}, overrides={"http": {"host": "0.0.0.0"}, "auth": {"allow_anonymous": True}}
    )
