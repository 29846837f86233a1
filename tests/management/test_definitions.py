"""Definitions over real HTTP: exported from a broker that STOMP traffic and the API shaped,
imported into another (on the journal) where a durable subscriber then gets what was published
after the import; an import that is checked first and applied all or nothing; a dry run; the
configuration's policies compared, not applied; a document larger than other requests; the
permission; and `sluice admin export|import`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import stomp

from server.test_auth import PASSWORDS, _write_users
from server.test_interop_stomppy import Collector, _connect, _subscribe

from .conftest import Managed, start_managed
from .test_cli_admin import admin


def _durable(port: int, client_id: str) -> tuple[Any, Collector]:
    conn = stomp.Connection12([("127.0.0.1", port)])
    col = Collector()
    conn.set_listener("c", col)
    conn.connect(wait=True, headers={"client-id": client_id})
    return conn, col


def _names(managed: Managed) -> list[str]:
    return [d["name"] for d in managed.http.get("/api/destinations?limit=1000").json["items"]]


def test_export_then_import_into_another_broker(managed: Managed, tmp_path: Path) -> None:
    conn, col = _durable(managed.broker.port, "c1")
    _subscribe(
        conn,
        col,
        "/topic/prices",
        "d",
        "client",
        **{"activemq.subscriptionName": "eu", "selector": "region = 'eu'"},
    )
    conn.send("/queue/orders", "o", receipt="sent")
    col.receipt("sent")
    conn.disconnect()
    assert managed.http.put("/api/destinations/queue/empty").status == 201
    exported = managed.http.get("/api/definitions")
    assert exported.status == 200
    doc = exported.json
    assert doc["format"] == 1
    assert [d["name"] for d in doc["destinations"]] == [
        "/queue/empty",
        "/queue/orders",
        "/topic/prices",
    ]
    assert doc["durable_subscriptions"] == [
        {
            "destination": "/topic/prices",
            "client_id": "c1",
            "name": "eu",
            "selector": "region = 'eu'",
        }
    ]
    assert doc["policies"]["default"]["max_redeliveries"] == 6

    other = start_managed(store={"kind": "journal", "data_dir": str(tmp_path / "data")})
    try:
        dry = other.http.post("/api/definitions?dry_run=true", doc)
        assert dry.status == 200, dry.text
        assert dry.json["dry_run"] is True
        assert dry.json["created"]["destinations"] == [
            "/queue/empty",
            "/queue/orders",
            "/topic/prices",
        ]
        assert _names(other) == []
        done = other.http.post("/api/definitions", doc).json
        assert len(done["created"]["durable_subscriptions"]) == 1
        assert done["policy_differences"] == []
        assert _names(other) == ["/queue/empty", "/queue/orders", "/topic/prices"]
        (sub,) = other.http.get("/api/subscriptions").json["items"]
        assert (sub["client_id"], sub["name"], sub["selector"], sub["active"]) == (
            "c1",
            "eu",
            "region = 'eu'",
            False,
        )
        # Imported again: nothing new.
        again = other.http.post("/api/definitions", doc).json
        assert again["created"] == {"destinations": [], "durable_subscriptions": []}
        assert again["existing"] == {"destinations": 3, "durable_subscriptions": 1}

        # The durable subscription keeps what is published from the import on.
        producer, pcol = _connect(other.broker.port)
        for region in ("us", "eu"):
            producer.send("/topic/prices", region, headers={"persistent": "true", "region": region})
        producer.send("/topic/prices", "x", receipt="p", headers={"persistent": "true"})
        pcol.receipt("p")
        producer.disconnect()
        reader, rcol = _durable(other.broker.port, "c1")
        _subscribe(
            reader,
            rcol,
            "/topic/prices",
            "d",
            "auto",
            **{"activemq.subscriptionName": "eu", "selector": "region = 'eu'"},
        )
        assert rcol.message().body == "eu"
        assert rcol.no_message()
        reader.disconnect()
    finally:
        other.stop()


def test_an_import_is_all_or_nothing(managed: Managed) -> None:
    conn, col = _durable(managed.broker.port, "c1")
    _subscribe(conn, col, "/topic/t", "d", "client", **{"activemq.subscriptionName": "s"})
    conn.disconnect()
    doc: dict[str, Any] = {
        "destinations": [{"name": "/queue/good"}, {"name": "/queue/bad.*"}, {"name": "orders"}],
        "durable_subscriptions": [
            {"destination": "/topic/u", "client_id": "c2", "name": "s2", "selector": "a ="},
            {"destination": "/queue/q", "client_id": "c3", "name": "s3"},
            {"destination": "/topic/other", "client_id": "c1", "name": "s"},
            {"destination": "/topic/fine", "client_id": "c4", "name": "s4"},
        ],
        "policies": {"default": {"max_redeliveries": 6}},
    }
    refused = managed.http.post("/api/definitions", doc)
    assert refused.status == 400
    error = refused.json["error"]
    assert error["code"] == "invalid_definitions"
    assert error["message"].startswith("nothing imported: 5 problems")
    problems = error["problems"]
    assert len(problems) == 5
    assert any("/queue/bad.*: a wildcard pattern" in p for p in problems)
    assert any("must start with /queue/ or /topic/" in p for p in problems)
    assert any("bad selector" in p for p in problems)
    assert any("/queue/q is not a topic" in p for p in problems)
    assert any("defined as on /topic/t" in p for p in problems)
    # Nothing of it was applied, not even what was right.
    assert _names(managed) == ["/topic/t"]
    assert managed.http.get("/api/subscriptions").json["total"] == 1

    fixed = {
        "destinations": [{"name": "/queue/good"}],
        "durable_subscriptions": [{"destination": "/topic/fine", "client_id": "c4", "name": "s4"}],
        "policies": {"default": {"max_redeliveries": 3}, "overrides": []},
    }
    done = managed.http.post("/api/definitions", fixed).json
    assert done["created"]["destinations"] == ["/queue/good", "/topic/fine"]
    assert done["policy_differences"] == ["[policy] max_redeliveries: 3 here 6"]

    for body, code in (
        ([], "invalid_definitions"),
        ({"format": 2}, "invalid_definitions"),
        ({"destinations": [{"name": 5}]}, "invalid_definitions"),
        ({"durable_subscriptions": [{"destination": "/topic/x"}]}, "invalid_definitions"),
    ):
        reply = managed.http.post("/api/definitions", body)
        assert (reply.status, reply.json["error"]["code"]) == (400, code), body
    assert managed.http.post("/api/definitions?dry_run=maybe", {}).status == 400


def test_a_large_document_and_the_room_for_it(managed: Managed) -> None:
    doc = {"destinations": [{"name": f"/queue/many.{i:05d}"} for i in range(3000)]}
    assert len(json.dumps(doc)) > 64 * 1024
    done = managed.http.post("/api/definitions", doc)
    assert done.status == 200, done.text
    assert len(done.json["created"]["destinations"]) == 3000
    small = start_managed(limits={"max_destinations": 10})
    try:
        refused = small.http.post("/api/definitions", doc)
        assert refused.json["error"]["problems"] == [
            "3000 new destinations, room for 10 (max_destinations=10)"
        ]
        assert _names(small) == []
    finally:
        small.stop()


def test_import_needs_admin_on_what_it_names(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _write_users(users)
    acl = [
        {"destination": "/queue/orders.>", "read": ["ops"], "write": ["shop"], "admin": ["ops"]},
        {"destination": "/queue/>", "read": ["ops", "shop"], "admin": ["ops"]},
        {"destination": "/topic/>", "read": ["ops", "shop"], "admin": ["ops"]},
    ]
    managed = start_managed(
        auth={"users_file": str(users)}, acl=acl, limits={"login_failure_delay_s": 0}
    )
    try:
        bob = managed.http.as_user("bob", PASSWORDS["bob"])
        alice = managed.http.as_user("alice", PASSWORDS["alice"])
        doc = {"destinations": [{"name": "/queue/orders.x"}]}
        refused = bob.post("/api/definitions", doc)
        assert (refused.status, refused.json["error"]["code"]) == (403, "forbidden")
        # Exporting concerns every destination: bob may not read /queue/orders.>.
        assert bob.get("/api/definitions").status == 403
        assert alice.post("/api/definitions", doc).status == 200
        assert alice.get("/api/definitions").json["destinations"] == [{"name": "/queue/orders.x"}]
    finally:
        managed.stop()


def test_cli_export_and_import(managed: Managed, tmp_path: Path) -> None:
    managed.http.put("/api/destinations/queue/a")
    managed.http.put("/api/destinations/topic/b")
    target = tmp_path / "defs.json"
    code, out, err = admin(managed, "export", str(target))
    assert code == 0, err
    assert out.strip() == f"exported 2 destinations and 0 durable subscriptions to {target}"
    code, out, _ = admin(managed, "export")
    assert json.loads(out)["destinations"] == json.loads(target.read_text())["destinations"]
    managed.http.delete("/api/destinations/queue/a")
    code, out, _ = admin(managed, "import", str(target), "--dry-run")
    assert out.strip() == (
        "would create 1 destinations and 0 durable subscriptions "
        "(1 destinations and 0 durable subscriptions were there)"
    )
    assert "/queue/a" not in _names(managed)
    code, out, _ = admin(managed, "import", str(target))
    assert out.startswith("created 1 destinations")
    assert "/queue/a" in _names(managed)
    broken = tmp_path / "broken.json"
    broken.write_text('{"destinations": [{"name": "/queue/x.*"}]}')
    code, _, err = admin(managed, "import", str(broken))
    assert code == 1
    assert "nothing imported" in err[0]
    assert "(invalid_definitions, HTTP 400)" in err[0]
