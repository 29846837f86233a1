"""`sluice admin` against a running broker's management API, run as a user runs it (a
subprocess): tables and `--json`, show, purge, delete and close, logins from standard input,
and the exit codes of the other commands (0, 1 with one line on stderr, 2 for usage)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import stomp

from cli.conftest import refused_address, sluice, stderr_lines
from server.test_auth import PASSWORDS, _write_users
from server.test_interop_stomppy import Collector, _connect, _subscribe
from waiting import wait_until

from .conftest import Managed, start_managed
from .test_auth import ACL

__all__ = ["refused_address"]  # a fixture of the CLI tests, used here


def admin(managed: Managed, *args: str, stdin: bytes = b"") -> tuple[int, str, list[str]]:
    result = sluice("admin", "--url", managed.http.base, *args, stdin=stdin)
    return result.returncode, result.stdout.decode(), stderr_lines(result)


def test_list_show_purge_delete(managed: Managed) -> None:
    conn, col = _connect(managed.broker.port)
    for i in range(5):
        conn.send("/queue/jobs", f"j{i}", headers={"persistent": "true"})
    conn.send("/queue/jobs.eu/x", "odd name", receipt="sent")
    col.receipt("sent")
    code, out, err = admin(managed, "list", "destinations")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["NAME", "READY", "IN-FLIGHT", "CONSUMERS", "PRODUCERS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    # The connection that sent them is open: one producer.
    assert rows["/queue/jobs"][1:5] == ["5", "0", "0", "1"]
    assert rows["/queue/jobs.eu/x"][1] == "1"
    code, out, _ = admin(managed, "--json", "list", "destinations")
    assert code == 0
    assert {d["name"]: d["messages_ready"] for d in json.loads(out)} == {
        "/queue/jobs": 5,
        "/queue/jobs.eu/x": 1,
    }
    code, out, _ = admin(managed, "show", "/queue/jobs.eu/x")
    assert code == 0
    assert "messages_ready: 1" in out.splitlines()
    code, out, _ = admin(managed, "browse", "/queue/jobs", "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "SEQ",
        "MESSAGE-ID",
        "PRIORITY",
        "DELIVERIES",
        "IN-FLIGHT",
        "BYTES",
        "BODY",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["1", "2"]
    assert lines[1].split()[-1] == "j0"
    code, out, _ = admin(managed, "--json", "browse", "/queue/jobs", "--after", "4")
    assert [m["body_preview"] for m in json.loads(out)["items"]] == ["j4"]
    code, out, _ = admin(managed, "purge", "/queue/jobs")
    assert (code, out.strip()) == (0, "purged 5 messages from /queue/jobs")
    code, out, _ = admin(managed, "--json", "delete", "/queue/jobs")
    assert code == 0
    assert json.loads(out) == {"deleted": "/queue/jobs", "messages": 0}
    code, out, err = admin(managed, "delete", "/queue/jobs")
    assert code == 1
    assert out == ""
    assert len(err) == 1
    assert "no destination /queue/jobs (destination_not_found, HTTP 404)" in err[0]
    conn.disconnect()


def test_connections_subscriptions_and_close(managed: Managed) -> None:
    conn = stomp.Connection12([("127.0.0.1", managed.broker.port)])
    col = Collector()
    conn.set_listener("c", col)
    conn.connect(wait=True, headers={"client-id": "cli-test"})
    _subscribe(conn, col, "/topic/t", "d", "client", **{"activemq.subscriptionName": "s"})
    code, out, _ = admin(managed, "list", "subscriptions")
    assert code == 0
    assert out.splitlines()[1].split() == ["/topic/t", "cli-test", "s", "0", "0", "yes"]
    code, out, _ = admin(managed, "list", "consumers")
    assert code == 0
    heading, row = out.splitlines()
    assert heading.split()[:3] == ["DESTINATION", "CONNECTION", "SUB-ID"]
    assert row.split()[2:] == ["d", "client", "100", "0", "100", "-", "yes", "-"]
    code, out, _ = admin(managed, "list", "connections")
    assert code == 0
    heading, row = out.splitlines()
    assert heading.split()[3:] == [
        "PROTOCOL",
        "CLIENT-ID",
        "VERSION",
        "HEART-BEAT",
        "BYTES-IN",
        "BYTES-OUT",
        "SUBS",
        "IN-FLIGHT",
        "CREDIT",
        "CREDIT-BYTES",
        "AUTO-ACK",
    ]
    cells = row.split()
    assert cells[3:6] == ["stomp-tcp", "cli-test", "1.2"]
    assert cells[-5:] == ["1", "0", "100", "-", "0"]
    code, out, _ = admin(managed, "--json", "list", "connections")
    assert code == 0
    (view,) = json.loads(out)
    assert view["client_id"] == "cli-test"
    assert view["credit"] == {"messages": 100, "bytes": None, "auto_ack_subscriptions": 0}
    code, out, _ = admin(managed, "close", str(view["id"]))
    assert (code, out.strip()) == (0, f"closed connection {view['id']}")
    assert "closed by an operator" in col.errors.get(timeout=10).headers["message"]
    wait_until(lambda: admin(managed, "--json", "list", "connections")[1].strip() == "[]")


def test_usage_and_unreachable(managed: Managed, refused_address: str) -> None:
    code, _, err = admin(managed, "show", "jobs")
    assert code == 2
    assert "a destination is /queue/NAME or /topic/NAME" in err[-1]
    code, _, _ = admin(managed, "close", "abc")
    assert code == 2
    result = sluice("admin", "--url", f"http://{refused_address}", "list", "destinations")
    assert result.returncode == 1
    assert f"cannot reach http://{refused_address}" in stderr_lines(result)[0]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Managed]:
    users = tmp_path / "users.toml"
    _write_users(users)
    running = start_managed(
        auth={"users_file": str(users)}, acl=ACL, limits={"login_failure_delay_s": 0}
    )
    try:
        yield running
    finally:
        running.stop()


def test_login_from_stdin(secured: Managed) -> None:
    password = PASSWORDS["alice"].encode() + b"\n"
    code, out, err = admin(
        secured, "--user", "alice", "--password-stdin", "list", "destinations", stdin=password
    )
    assert code == 0, err
    assert out.splitlines()[0].startswith("NAME")
    code, _, err = admin(
        secured, "--user", "alice", "--password-stdin", "list", "destinations", stdin=b"wrong\n"
    )
    assert code == 1
    assert "bad login or passcode (unauthorized, HTTP 401)" in err[0]
    code, _, err = admin(secured, "list", "connections")
    assert code == 1
    assert "unauthorized" in err[0]
    password = PASSWORDS["bob"].encode() + b"\n"
    code, _, err = admin(
        secured, "--user", "bob", "--password-stdin", "purge", "/queue/orders.x", stdin=password
    )
    assert code == 1
    assert "admin permission on /queue/orders.x is not granted (forbidden, HTTP 403)" in err[0]
