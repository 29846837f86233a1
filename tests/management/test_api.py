"""The JSON API over real HTTP, against a broker carrying real STOMP traffic from stomp.py:
depths, in-flight counts, consumers, producers and totals checked against what the test sent;
destinations created, purged and deleted; connections listed and closed; durable subscriptions
listed and deleted; totals that never go back when a destination goes."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import stomp

from server.test_interop_stomppy import Collector, _connect, _subscribe
from waiting import wait_until

from .conftest import Managed, start_managed


def _send(conn: Any, col: Collector, dest: str, count: int, prefix: str = "m") -> None:
    for i in range(count):
        conn.send(dest, f"{prefix}{i}", headers={"persistent": "true"})
    conn.send(dest, "last", receipt=f"done-{dest}", headers={"persistent": "true"})
    col.receipt(f"done-{dest}")


def _queue(managed: Managed, name: str) -> dict[str, Any]:
    reply = managed.http.get("/api/destinations/queue/" + urllib.parse.quote(name, safe=""))
    assert reply.status == 200, reply.text
    return reply.json  # type: ignore[no-any-return]


def test_depths_and_counts_match_the_traffic(managed: Managed) -> None:
    producer, pcol = _connect(managed.broker.port)
    _send(producer, pcol, "/queue/work", 19)  # 20 messages
    _send(producer, pcol, "/queue/other", 4)  # 5
    consumer, ccol = _connect(managed.broker.port)
    _subscribe(
        consumer, ccol, "/queue/work", "s1", "client-individual", **{"activemq.prefetchSize": "7"}
    )
    frames = [ccol.message() for _ in range(7)]
    wait_until(lambda: _queue(managed, "work")["messages_in_flight"] == 7, what="7 in flight")
    work = _queue(managed, "work")
    assert work["kind"] == "queue"
    assert work["messages_ready"] == 13
    assert work["consumers"] == 1
    assert work["messages_in"] == 20
    assert work["delivered"] == 7
    assert work["acked"] == 0
    assert work["memory_bytes"] > 0
    for frame in frames[:3]:
        consumer.ack(frame.headers["ack"])
    wait_until(lambda: _queue(managed, "work")["acked"] == 3, what="3 acked")
    # Three acknowledged: three more delivered within the credit of 7.
    wait_until(lambda: _queue(managed, "work")["delivered"] == 10, what="10 delivered")
    work = _queue(managed, "work")
    assert (work["messages_ready"], work["messages_in_flight"]) == (10, 7)
    # NACK puts one back, counted as a redelivery.
    extra = ccol.message()
    consumer.nack(extra.headers["ack"])
    wait_until(lambda: _queue(managed, "work")["redelivered"] == 1, what="a redelivery")
    other = _queue(managed, "other")
    assert (other["messages_ready"], other["messages_in_flight"], other["consumers"]) == (5, 0, 0)

    listing = managed.http.get("/api/destinations?kind=queue&sort=messages_ready&order=desc")
    assert listing.status == 200
    page = listing.json
    assert page["total"] == 2
    assert [item["name"] for item in page["items"]] == ["/queue/work", "/queue/other"]
    paged = managed.http.get("/api/destinations?sort=name&limit=1&offset=1").json
    assert (paged["total"], paged["offset"], paged["limit"]) == (2, 1, 1)
    assert [item["name"] for item in paged["items"]] == ["/queue/work"]
    filtered = managed.http.get("/api/destinations?name=oth").json
    assert [item["name"] for item in filtered["items"]] == ["/queue/other"]
    consumer.disconnect()
    producer.disconnect()


def _destination(managed: Managed, kind: str, name: str) -> dict[str, Any]:
    reply = managed.http.get(f"/api/destinations/{kind}/" + urllib.parse.quote(name, safe=""))
    assert reply.status == 200, reply.text
    return reply.json  # type: ignore[no-any-return]


def _producers(managed: Managed) -> dict[str, int]:
    items = managed.http.get("/api/destinations").json["items"]
    return {item["name"]: item["producers"] for item in items}


def test_producers_are_the_open_connections_that_sent(managed: Managed) -> None:
    """A destination's producers: the connections open now that have sent to it, each once
    however many messages it sent, in a transaction or not; a consumer is not one."""
    port = managed.broker.port
    a, acol = _connect(port)
    b, bcol = _connect(port)
    consumer, ccol = _connect(port)
    _subscribe(consumer, ccol, "/queue/p1", "s1", "auto")
    _send(a, acol, "/queue/p1", 4)  # five SENDs, one producer
    _send(a, acol, "/queue/p2", 0)
    a.send("/topic/t1", "news", receipt="t1")
    acol.receipt("t1")
    txid = b.begin()
    b.send("/queue/p1", "in a transaction", transaction=txid)
    b.commit(txid, receipt="committed")
    bcol.receipt("committed")
    assert _producers(managed) == {"/queue/p1": 2, "/queue/p2": 1, "/topic/t1": 1}
    p1 = _queue(managed, "p1")
    assert (p1["producers"], p1["consumers"], p1["messages_in"]) == (2, 1, 6)
    assert _destination(managed, "topic", "t1")["producers"] == 1
    by_producers = managed.http.get("/api/destinations?sort=producers&order=desc").json
    assert by_producers["items"][0]["name"] == "/queue/p1"
    # A producer that leaves is no longer counted; what it sent stays counted.
    a.disconnect()
    wait_until(
        lambda: _producers(managed) == {"/queue/p1": 1, "/queue/p2": 0, "/topic/t1": 0},
        what="the first producer gone",
    )
    assert _queue(managed, "p1")["messages_in"] == 6
    b.disconnect()
    wait_until(lambda: _queue(managed, "p1")["producers"] == 0, what="the second producer gone")
    consumer.disconnect()


def test_overview_totals_and_rates(managed: Managed) -> None:
    producer, pcol = _connect(managed.broker.port)
    _send(producer, pcol, "/queue/a", 9)  # 10
    consumer, ccol = _connect(managed.broker.port)
    _subscribe(consumer, ccol, "/queue/a", "s1", "auto")
    for _ in range(10):
        ccol.message()
    managed.broker.call(managed.server.rates.sample)
    overview = managed.http.get("/api/overview").json
    assert overview["version"]
    assert overview["uptime_s"] >= 0
    assert overview["totals"]["messages_in"] == 10
    assert overview["totals"]["delivered"] == 10
    assert overview["totals"]["acked"] == 10
    assert overview["rates"]["messages_in"] > 0
    assert overview["destinations"]["queues"] == 1
    assert overview["connections"] == 2
    assert overview["memory"]["limit_bytes"] > 0
    assert overview["store"]["kind"] == "memory"
    assert overview["alarms"] == {
        "memory": False,
        "pending_writes": False,
        "store_full": False,
        "temp_full": False,
        "store_failed": False,
        "store_unavailable": False,
    }
    assert set(overview["flow_control"]) >= {"memory_pauses", "disk_pauses", "store_full_episodes"}
    consumer.disconnect()
    producer.disconnect()


def test_create_delete_and_totals_that_stay(managed: Managed) -> None:
    http = managed.http
    created = http.put("/api/destinations/queue/made")
    assert created.status == 201
    assert created.json["name"] == "/queue/made"
    assert http.put("/api/destinations/queue/made").status == 200
    conn, col = _connect(managed.broker.port)
    _send(conn, col, "/queue/made", 2)  # 3
    _subscribe(conn, col, "/queue/made", "s1", "client-individual")
    in_use = http.delete("/api/destinations/queue/made")
    assert in_use.status == 409
    assert in_use.json["error"]["code"] == "destination_in_use"
    assert "consumers" in in_use.json["error"]["message"]
    for _ in range(3):
        conn.ack(col.message().headers["ack"])
    conn.unsubscribe("s1", receipt="u1")
    col.receipt("u1")
    before = http.get("/api/overview").json["totals"]
    deleted = http.delete("/api/destinations/queue/made")
    assert deleted.status == 200, deleted.text
    assert http.get("/api/destinations/queue/made").status == 404
    after = http.get("/api/overview").json["totals"]
    assert after == before
    assert after["messages_in"] == 3
    assert after["acked"] == 3
    conn.disconnect()


def test_purge_in_memory_and_a_topic_is_refused(managed: Managed) -> None:
    conn, col = _connect(managed.broker.port)
    _send(conn, col, "/queue/full", 49)  # 50
    purged = managed.http.delete("/api/destinations/queue/full/messages")
    assert purged.status == 200
    assert purged.json == {"purged": 50}
    assert _queue(managed, "full")["messages_ready"] == 0
    # Nothing left to consume.
    _subscribe(conn, col, "/queue/full", "s1", "auto")
    assert col.no_message()
    managed.http.put("/api/destinations/topic/t")
    refused = managed.http.delete("/api/destinations/topic/t/messages")
    assert refused.status == 409
    assert refused.json["error"]["code"] == "not_a_queue"
    conn.disconnect()


def test_paged_queue_depth_and_purge_on_the_journal(tmp_path: Path) -> None:
    managed = start_managed(
        store={"kind": "journal", "data_dir": str(tmp_path / "data")},
        limits={"destination_memory_limit_bytes": 64 * 1024},
    )
    try:
        conn, col = _connect(managed.broker.port)
        body = "x" * 1000
        for _ in range(299):
            conn.send("/queue/deep", body, headers={"persistent": "true"})
        conn.send("/queue/deep", body, receipt="all", headers={"persistent": "true"})
        col.receipt("all")
        deep = _queue(managed, "deep")
        assert deep["messages_ready"] == 300
        assert deep["messages_paged"] > 200
        assert deep["paged_bytes"] >= deep["messages_paged"] * 1000
        assert deep["memory_bytes"] <= 64 * 1024 + 2000
        purged = managed.http.delete("/api/destinations/queue/deep/messages")
        assert purged.json == {"purged": 300}
        deep = _queue(managed, "deep")
        assert (deep["messages_ready"], deep["messages_paged"]) == (0, 0)
        _subscribe(conn, col, "/queue/deep", "s1", "auto")
        assert col.no_message()
        conn.send("/queue/deep", "after", receipt="after", headers={"persistent": "true"})
        col.receipt("after")
        assert col.message().body == "after"
        conn.disconnect()
    finally:
        managed.stop()


def test_connections_listed_and_closed(managed: Managed) -> None:
    conn = stomp.Connection12([("127.0.0.1", managed.broker.port)], heartbeats=(0, 0))
    col = Collector()
    conn.set_listener("c", col)
    conn.connect(wait=True, headers={"client-id": "shop-1"})
    _send(conn, col, "/queue/c", 0)
    listing = managed.http.get("/api/connections").json
    assert listing["total"] == 1
    view = listing["items"][0]
    assert view["user"] == "anonymous"
    assert view["client_id"] == "shop-1"
    assert view["version"] == "1.2"
    assert view["address"].startswith("127.0.0.1:")
    assert view["heartbeat_ms"] == {"send": 0, "receive": 0}
    assert view["bytes_in"] > 0
    assert view["bytes_out"] > 0
    assert view["tls"] is False
    closed = managed.http.delete(f"/api/connections/{view['id']}")
    assert closed.status == 200
    error = col.errors.get(timeout=10)
    assert "closed by an operator" in error.headers["message"]
    wait_until(lambda: managed.http.get("/api/connections").json["total"] == 0, what="closed")
    assert managed.broker.stats()["closed_operator"] == 1
    assert managed.http.delete(f"/api/connections/{view['id']}").status == 404


def test_consumers_listed_with_their_credit(managed: Managed) -> None:
    """Which consumer holds what: each subscription with what it holds unacknowledged and the
    credit it has left, checked against what stomp.py consumers took."""
    port = managed.broker.port
    producer, pcol = _connect(port)
    _send(producer, pcol, "/queue/jobs", 4)  # 5
    slow, scol = _connect(port)
    _subscribe(
        slow, scol, "/queue/jobs", "slow", "client-individual", **{"activemq.prefetchSize": "3"}
    )
    held = [scol.message() for _ in range(3)]
    watcher, wcol = _connect(port)
    _subscribe(watcher, wcol, "/topic/news", "w", "auto", selector="region = 'eu'")
    wait_until(lambda: managed.http.get("/api/consumers").json["total"] == 2, what="two consumers")
    page = managed.http.get("/api/consumers?sort=messages_in_flight&order=desc").json
    jobs, news = page["items"]
    assert jobs["destination"] == "/queue/jobs"
    assert (jobs["subscription_id"], jobs["ack_mode"], jobs["prefetch"]) == (
        "slow",
        "client-individual",
        3,
    )
    assert (jobs["messages_in_flight"], jobs["credit"], jobs["writable"]) == (3, 0, True)
    assert jobs["bytes_in_flight"] > 0
    assert news["destination"] == "/topic/news"
    assert (news["ack_mode"], news["selector"], news["credit"]) == ("auto", "region = 'eu'", None)
    assert jobs["connection_id"] != news["connection_id"]
    # Two acknowledged: two more delivered, and the credit is spent again.
    for frame in held[:2]:
        slow.ack(frame.headers["ack"])
    for _ in range(2):
        scol.message()
    only = managed.http.get("/api/consumers?destination=/queue/jobs").json["items"]
    assert [(c["messages_in_flight"], c["credit"]) for c in only] == [(3, 0)]
    by_connection = managed.http.get(f"/api/consumers?connection={news['connection_id']}").json
    assert [c["subscription_id"] for c in by_connection["items"]] == ["w"]
    assert managed.http.get("/api/consumers?connection=x").status == 400
    slow.disconnect()
    wait_until(
        lambda: managed.http.get("/api/consumers").json["total"] == 1, what="a consumer gone"
    )
    watcher.disconnect()
    producer.disconnect()


def test_connections_listed_with_protocol_and_credit(managed: Managed) -> None:
    """A connection's credit is its consumers' summed: messages and bytes left, what it holds
    unacknowledged, and its subscriptions without credit (ack auto); checked against what a
    stomp.py consumer took and acknowledged, and against /api/consumers."""
    port = managed.broker.port
    producer, pcol = _connect(port)
    _send(producer, pcol, "/queue/work", 5)  # 6
    consumer, ccol = _connect(port)
    work = {"activemq.prefetchSize": "4", "x-prefetch-bytes": "100000"}
    _subscribe(consumer, ccol, "/queue/work", "w", "client-individual", **work)
    held = [ccol.message() for _ in range(4)]
    _subscribe(consumer, ccol, "/queue/idle", "i", "client", **{"activemq.prefetchSize": "10"})
    _subscribe(consumer, ccol, "/topic/news", "n", "auto")
    wait_until(lambda: managed.http.get("/api/consumers").json["total"] == 3, what="consumers")

    def listing() -> dict[int, dict[str, Any]]:
        page = managed.http.get("/api/connections?sort=credit").json
        return {view["id"]: view for view in page["items"]}

    (work_view,) = managed.http.get("/api/consumers?destination=/queue/work").json["items"]
    cid = work_view["connection_id"]
    assert work_view["bytes_in_flight"] > 0
    assert work_view["credit_bytes"] == 100_000 - work_view["bytes_in_flight"]
    views = listing()
    assert list(views)[-1] == cid  # sorted by credit: the producer's is 0
    view = views[cid]
    assert (view["protocol"], view["tls"], view["subscriptions"]) == ("stomp-tcp", False, 3)
    assert view["credit"] == {
        "messages": 0 + 10,  # /queue/work's spent, /queue/idle's untouched
        "bytes": 100_000 - work_view["bytes_in_flight"],  # only /queue/work has a byte credit
        "auto_ack_subscriptions": 1,
    }
    assert (view["messages_in_flight"], view["bytes_in_flight"]) == (
        4,
        work_view["bytes_in_flight"],
    )
    (other,) = [v for v in views.values() if v["id"] != cid]
    assert other["protocol"] == "stomp-tcp"
    assert other["credit"] == {"messages": 0, "bytes": None, "auto_ack_subscriptions": 0}
    assert other["messages_in_flight"] == 0
    # Four acknowledged: the last two are delivered, and two of the four credits come back.
    for frame in held:
        consumer.ack(frame.headers["ack"])
    rest = [ccol.message() for _ in range(2)]
    wait_until(lambda: listing()[cid]["credit"]["messages"] == 12, what="credit back")
    view = listing()[cid]
    assert view["messages_in_flight"] == 2
    (work_view,) = managed.http.get("/api/consumers?destination=/queue/work").json["items"]
    assert work_view["messages_in_flight"] == len(rest)
    assert view["credit"]["bytes"] == work_view["credit_bytes"]
    assert work_view["credit_bytes"] == 100_000 - work_view["bytes_in_flight"]
    bad = managed.http.get("/api/connections?sort=nothing")
    assert bad.status == 400
    consumer.disconnect()
    producer.disconnect()


def test_durable_subscriptions_listed_and_deleted(managed: Managed) -> None:
    port = managed.broker.port
    reader = stomp.Connection12([("127.0.0.1", port)])
    rcol = Collector()
    reader.set_listener("c", rcol)
    reader.connect(wait=True, headers={"client-id": "audit"})
    _subscribe(
        reader, rcol, "/topic/events", "d1", "client", **{"activemq.subscriptionName": "log"}
    )
    producer, pcol = _connect(port)
    _send(producer, pcol, "/topic/events", 3)  # 4
    for _ in range(4):
        rcol.message()
    listing = managed.http.get("/api/subscriptions").json
    assert listing["total"] == 1
    sub = listing["items"][0]
    assert sub == {
        "destination": "/topic/events",
        "client_id": "audit",
        "name": "log",
        "selector": None,
        "cursor": 0,
        "lag": 4,
        "active": True,
    }
    in_use = managed.http.delete("/api/subscriptions/events/audit/log")
    assert in_use.status == 409
    assert in_use.json["error"]["code"] == "subscription_in_use"
    reader.disconnect()
    wait_until(
        lambda: not managed.http.get("/api/subscriptions").json["items"][0]["active"],
        what="the consumer gone",
    )
    topic = managed.http.get("/api/destinations/topic/events").json
    assert topic["durable_subscriptions"] == 1
    assert topic["messages_in"] == 4
    assert managed.http.delete("/api/destinations/topic/events").status == 409
    deleted = managed.http.delete("/api/subscriptions/events/audit/log")
    assert deleted.status == 200, deleted.text
    assert managed.http.get("/api/subscriptions").json["total"] == 0
    producer.disconnect()


def test_depth_after_a_restart_counts_what_the_store_holds(tmp_path: Path) -> None:
    settings: dict[str, Any] = {"store": {"kind": "journal", "data_dir": str(tmp_path / "d")}}
    first = start_managed(**settings)
    try:
        conn, col = _connect(first.broker.port)
        _send(conn, col, "/queue/kept", 39)  # 40
        _subscribe(conn, col, "/queue/kept", "s1", "client-individual")
        for _ in range(10):
            conn.ack(col.message().headers["ack"])
        wait_until(lambda: _queue(first, "kept")["acked"] == 10, what="10 acked")
        conn.disconnect()
    finally:
        first.stop()
    second = start_managed(**settings)
    try:
        kept = _queue(second, "kept")
        assert kept["messages_ready"] == 30
        assert kept["messages_in_flight"] == 0
        # What came in before the start is not counted as coming in now.
        assert kept["messages_in"] == 0
        assert second.http.get("/api/overview").json["totals"]["messages_in"] == 0
    finally:
        second.stop()


def test_browse_without_consuming(tmp_path: Path) -> None:
    managed = start_managed(
        store={"kind": "journal", "data_dir": str(tmp_path / "data")},
        limits={"destination_memory_limit_bytes": 16 * 1024},
    )
    try:
        conn, col = _connect(managed.broker.port)
        for i in range(60):
            headers = {"persistent": "true", "colour": "red" if i % 2 else "blue"}
            conn.send("/queue/b", f"message {i:02d} " + "x" * 500, headers=headers)
        conn.send("/queue/b", "last", receipt="sent", headers={"persistent": "true"})
        col.receipt("sent")
        _subscribe(
            conn, col, "/queue/b", "s1", "client-individual", **{"activemq.prefetchSize": "2"}
        )
        held = [col.message(), col.message()]
        wait_until(lambda: _queue(managed, "b")["messages_in_flight"] == 2, what="2 in flight")
        assert _queue(managed, "b")["messages_paged"] > 0
        seen: list[dict[str, Any]] = []
        after = 0
        while True:
            page = managed.http.get(f"/api/destinations/queue/b/messages?after={after}&limit=25")
            assert page.status == 200, page.text
            seen.extend(page.json["items"])
            after = page.json["next_after"]
            if after is None:
                break
        assert [m["seq"] for m in seen] == list(range(1, 62))
        assert [m["in_flight"] for m in seen[:3]] == [True, True, False]
        assert seen[0]["body_preview"].startswith("message 00 ")
        assert seen[0]["body_bytes"] == len("message 00 ") + 500
        assert seen[1]["headers"]["colour"] == "red"
        assert seen[-1]["body_preview"] == "last"
        short = managed.http.get("/api/destinations/queue/b/messages?limit=1&preview=7").json
        assert short["items"][0]["body_preview"] == "message"
        # Nothing was consumed: the depth is what it was.
        b = _queue(managed, "b")
        assert (b["messages_ready"], b["messages_in_flight"]) == (59, 2)
        for frame in held:
            conn.ack(frame.headers["ack"])
        managed.http.put("/api/destinations/topic/t")
        refused = managed.http.get("/api/destinations/topic/t/messages")
        assert refused.json["error"]["code"] == "not_a_queue"
        conn.disconnect()
    finally:
        managed.stop()
