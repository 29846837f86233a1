"""A queue's messages through the API, over real HTTP against a broker carrying STOMP traffic
from stomp.py: search by header, selector and id with counts; delete, move and copy by id, by
selector or all; dead letters retried to the destination each came from; a message sent; a move
on the journal that reads paged messages and survives a restart; a step the store fails to
write, which loses nothing; and the permissions STOMP would ask for."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from failing_store import FailingStore
from server.test_auth import PASSWORDS, _write_users
from server.test_interop_stomppy import Collector, _connect, _subscribe
from sluice.store.api import WriteHandle
from waiting import wait_until

from .conftest import Managed, start_managed


def _path(name: str) -> str:
    kind, _, short = name[1:].partition("/")
    return f"/api/destinations/{kind}/" + urllib.parse.quote(short, safe="")


def _depth(managed: Managed, name: str) -> tuple[int, int]:
    view = managed.http.get(_path(name)).json
    return view["messages_ready"], view["messages_in_flight"]


def _send_all(conn: Any, col: Collector, dest: str, headers: Sequence[dict[str, str]]) -> None:
    for i, extra in enumerate(headers):
        conn.send(dest, f"body {i}", headers=extra)
    conn.send(dest, "end", receipt="end-" + dest, headers={"kind": "end"})
    col.receipt("end-" + dest)


def _operate(managed: Managed, source: str, action: str, **body: Any) -> dict[str, Any]:
    reply = managed.http.post(_path(source) + "/messages/" + action, body)
    assert reply.status == 200, reply.text
    return reply.json  # type: ignore[no-any-return]


def _drain(col: Collector, count: int) -> list[Any]:
    frames = [col.message() for _ in range(count)]
    assert col.no_message()
    return frames


def _all_items(managed: Managed, name: str, query: str = "") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = managed.http.get(f"{_path(name)}/messages?after={after}&limit=100{query}")
        assert page.status == 200, page.text
        items.extend(page.json["items"])
        after = page.json["next_after"]
    return items


def test_search_and_count_by_header_selector_and_id(managed: Managed) -> None:
    conn, col = _connect(managed.broker.port)
    colours = ["red" if i % 3 == 0 else "blue" for i in range(30)]
    _send_all(
        conn,
        col,
        "/queue/s",
        [{"persistent": "true", "colour": c, "n": str(i)} for i, c in enumerate(colours)],
    )
    consumer, ccol = _connect(managed.broker.port)
    _subscribe(
        consumer, ccol, "/queue/s", "c", "client-individual", **{"activemq.prefetchSize": "2"}
    )
    held = [ccol.message(), ccol.message()]
    wait_until(lambda: _depth(managed, "/queue/s")[1] == 2, what="2 in flight")

    red = managed.http.get("/api/destinations/queue/s/messages?header=colour:red&limit=100").json
    assert [m["headers"]["n"] for m in red["items"]] == [str(i) for i in range(0, 30, 3)]
    assert red["items"][0]["in_flight"] is True
    assert red["next_after"] is None
    count = managed.http.get("/api/destinations/queue/s/messages/count?header=colour:red").json
    assert count == {"count": 10, "waiting": 9, "in_flight": 1, "busy": 0}
    assert managed.http.get("/api/destinations/queue/s/messages/count").json["count"] == 31

    selector = urllib.parse.quote("colour = 'blue' AND n LIKE '2%'")
    expected = [str(i) for i in range(30) if colours[i] == "blue" and str(i).startswith("2")]
    found = managed.http.get(f"/api/destinations/queue/s/messages?selector={selector}").json
    assert [m["headers"]["n"] for m in found["items"]] == expected
    counted = managed.http.get(f"/api/destinations/queue/s/messages/count?selector={selector}")
    assert counted.json["count"] == len(expected)

    # Paged search: five at a time, resumed from next_after.
    blues = _all_items(managed, "/queue/s", "&header=colour:blue")
    assert len(blues) == 20
    page = managed.http.get("/api/destinations/queue/s/messages?header=colour:blue&limit=5").json
    assert len(page["items"]) == 5
    assert page["next_after"] == page["items"][-1]["seq"]

    one = blues[7]["message_id"]
    by_id = managed.http.get("/api/destinations/queue/s/messages?id=" + urllib.parse.quote(one))
    assert [m["message_id"] for m in by_id.json["items"]] == [one]

    bad = managed.http.get("/api/destinations/queue/s/messages?selector=colour%20%3D")
    assert (bad.status, bad.json["error"]["code"]) == (400, "invalid_selector")
    bad = managed.http.get("/api/destinations/queue/s/messages/count?header=nocolon")
    assert (bad.status, bad.json["error"]["code"]) == (400, "bad_request")
    for frame in held:
        consumer.ack(frame.headers["ack"])
    consumer.disconnect()
    conn.disconnect()


def test_delete_move_and_copy(managed: Managed) -> None:
    conn, col = _connect(managed.broker.port)
    headers = []
    for i in range(20):
        extra = {"k": "a" if i % 2 == 0 else "b", "n": str(i)}
        if i < 10:
            extra["persistent"] = "true"
        headers.append(extra)
    _send_all(conn, col, "/queue/src", headers)
    # A consumer holds message 0 (k=a): operations leave it with the consumer.
    holder, hcol = _connect(managed.broker.port)
    _subscribe(
        holder, hcol, "/queue/src", "h", "client-individual", **{"activemq.prefetchSize": "1"}
    )
    held = hcol.message()
    assert held.headers["n"] == "0"
    wait_until(lambda: _depth(managed, "/queue/src") == (20, 1), what="1 in flight")
    ids = {m["headers"].get("n"): m["message_id"] for m in _all_items(managed, "/queue/src")}

    dry = _operate(managed, "/queue/src", "move", selector="k = 'a'", to="/queue/dst", dry_run=True)
    assert dry["matched"] == 10
    assert dry["moved"] == 9
    assert dry["skipped"] == {"in flight: a consumer holds it": 1}
    assert dry["targets"] == {"/queue/dst": 9}
    assert _depth(managed, "/queue/src") == (20, 1)
    assert (
        managed.http.get("/api/destinations/queue/dst").status == 404
    )  # a dry run creates nothing

    moved = _operate(managed, "/queue/src", "move", selector="k = 'a'", to="/queue/dst")
    assert (moved["matched"], moved["moved"]) == (10, 9)
    assert _depth(managed, "/queue/src") == (11, 1)
    assert _depth(managed, "/queue/dst") == (9, 0)

    copied = _operate(managed, "/queue/src", "copy", ids=[ids["1"], ids["3"]], to="/queue/copies")
    assert (copied["matched"], copied["copied"]) == (2, 2)
    assert _depth(managed, "/queue/src") == (11, 1)

    deleted = _operate(managed, "/queue/src", "delete", ids=[ids["5"]])
    assert deleted["deleted"] == 1
    assert _depth(managed, "/queue/src") == (10, 1)

    # What moved arrives once, as it was sent: id, headers, persistence.
    reader, rcol = _connect(managed.broker.port)
    _subscribe(reader, rcol, "/queue/dst", "d", "auto")
    frames = _drain(rcol, 9)
    assert sorted(int(f.headers["n"]) for f in frames) == list(range(2, 20, 2))
    for frame in frames:
        n = frame.headers["n"]
        assert frame.headers["message-id"] == ids[n]
        assert frame.body == f"body {n}"
        assert frame.headers.get("persistent") == ("true" if int(n) < 10 else None)
    _subscribe(reader, rcol, "/queue/copies", "c", "auto")
    assert sorted(f.body for f in _drain(rcol, 2)) == ["body 1", "body 3"]

    # A copy to a topic is published there.
    _subscribe(reader, rcol, "/topic/copies", "t", "auto")
    to_topic = _operate(managed, "/queue/src", "copy", ids=[ids["7"]], to="/topic/copies")
    assert to_topic["targets"] == {"/topic/copies": 1}
    assert rcol.message().body == "body 7"

    everything = _operate(managed, "/queue/src", "delete", all=True)
    assert everything["deleted"] == 10
    assert everything["skipped"] == {"in flight: a consumer holds it": 1}
    assert _depth(managed, "/queue/src") == (0, 1)
    holder.ack(held.headers["ack"])
    wait_until(lambda: _depth(managed, "/queue/src") == (0, 0), what="the held one acked")

    http = managed.http
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("delete", {}, "bad_request"),  # acting on everything is asked for, never a default
        ("delete", {"all": True, "selector": "k = 'a'"}, "bad_request"),
        ("move", {"all": True}, "bad_request"),
        ("move", {"all": True, "to": "/exchange/x"}, "invalid_destination"),
        ("delete", {"selector": "k ="}, "invalid_selector"),
        ("delete", {"ids": "one"}, "bad_request"),
        ("retry", {"all": True, "to": "/queue/x"}, "bad_request"),
    ]
    for action, body, code in cases:
        reply = http.post("/api/destinations/queue/src/messages/" + action, body)
        assert (reply.status, reply.json["error"]["code"]) == (400, code), (action, body)
    self_move = _operate(managed, "/queue/dst", "move", all=True, to="/queue/dst", dry_run=True)
    assert self_move["skipped"] == {}  # dst was drained by the reader: nothing to move
    http.put("/api/destinations/topic/t")
    topic = http.post("/api/destinations/topic/t/messages/delete", {"all": True})
    assert (topic.status, topic.json["error"]["code"]) == (409, "not_a_queue")
    absent = http.post("/api/destinations/queue/absent/messages/delete", {"all": True})
    assert absent.json["error"]["code"] == "destination_not_found"
    reader.disconnect()
    holder.disconnect()
    conn.disconnect()


@pytest.fixture
def dead_letters() -> Iterator[Managed]:
    running = start_managed(policy={"max_redeliveries": 0})
    try:
        yield running
    finally:
        running.stop()


def test_retry_sends_each_dead_letter_back_where_it_came_from(dead_letters: Managed) -> None:
    managed = dead_letters
    conn, col = _connect(managed.broker.port)
    for dest, count in (("/queue/orders", 5), ("/queue/invoices", 3)):
        for i in range(count):
            conn.send(dest, f"{dest} {i}", headers={"persistent": "true", "n": str(i)})
    conn.send("/queue/orders", "sent", receipt="sent")
    col.receipt("sent")
    # A consumer that fails every message: each goes to its destination's DLQ at once.
    failing, fcol = _connect(managed.broker.port)
    _subscribe(failing, fcol, "/queue/orders", "o", "client-individual")
    _subscribe(failing, fcol, "/queue/invoices", "i", "client-individual")
    for _ in range(9):
        failing.nack(fcol.message().headers["ack"])
    wait_until(
        lambda: (
            _depth(managed, "/queue/DLQ.orders")[0] == 6
            and _depth(managed, "/queue/DLQ.invoices")[0] == 3
        ),
        what="9 dead letters",
    )
    failing.disconnect()
    assert managed.http.get("/api/destinations/queue/orders").json["dead_lettered"] == 6

    # Park them all in one queue: the retry must still send each to its own origin.
    for dlq in ("/queue/DLQ.orders", "/queue/DLQ.invoices"):
        _operate(managed, dlq, "move", all=True, to="/queue/parking")
    stray = managed.http.post("/api/destinations/queue/parking/messages", {"body": "stray"})
    assert stray.status == 201, stray.text
    assert _depth(managed, "/queue/parking") == (10, 0)

    dry = _operate(managed, "/queue/parking", "retry", all=True, dry_run=True)
    assert dry["retried"] == 9
    assert dry["targets"] == {"/queue/orders": 6, "/queue/invoices": 3}
    assert dry["skipped"] == {"no x-original-destination header": 1}
    only_one = _operate(managed, "/queue/parking", "retry", selector="n = '4'")
    assert only_one["targets"] == {"/queue/orders": 1}
    rest = _operate(managed, "/queue/parking", "retry", all=True)
    assert rest["retried"] == 8
    assert _depth(managed, "/queue/parking") == (1, 0)
    assert _depth(managed, "/queue/orders") == (6, 0)
    assert _depth(managed, "/queue/invoices") == (3, 0)

    reader, rcol = _connect(managed.broker.port)
    _subscribe(reader, rcol, "/queue/orders", "o", "auto")
    _subscribe(reader, rcol, "/queue/invoices", "i", "auto")
    frames = _drain(rcol, 9)
    assert sorted(f.body for f in frames) == sorted(
        [f"/queue/orders {i}" for i in range(5)]
        + ["sent"]
        + [f"/queue/invoices {i}" for i in range(3)]
    )
    for frame in frames:
        assert "x-original-destination" not in frame.headers
        assert "x-dlq-reason" not in frame.headers
        assert frame.headers["destination"] in ("/queue/orders", "/queue/invoices")
        assert frame.headers.get("persistent") == ("true" if frame.body != "sent" else None)
    reader.disconnect()
    conn.disconnect()


def test_send_a_message(managed: Managed) -> None:
    conn, col = _connect(managed.broker.port)
    _subscribe(conn, col, "/queue/inbox", "q", "auto")
    _subscribe(conn, col, "/topic/news", "t", "auto")
    http = managed.http
    sent = http.post(
        "/api/destinations/queue/inbox/messages",
        {"body": "hello", "headers": {"k": "v"}, "persistent": True, "priority": 7},
    )
    assert sent.status == 201, sent.text
    frame = col.message()
    assert frame.body == "hello"
    assert frame.headers["message-id"] == sent.json["message_id"]
    assert (frame.headers["k"], frame.headers["priority"]) == ("v", "7")
    assert frame.headers["persistent"] == "true"

    raw = bytes(range(256)) * 4
    encoded = base64.b64encode(raw).decode()
    http.post("/api/destinations/topic/news/messages", {"body_base64": encoded})
    news = col.message()
    assert news.headers["destination"] == "/topic/news"
    assert news.headers["content-length"] == str(len(raw))

    twice = {"body": "once", "headers": {"x-dedup-id": "d-1"}}
    assert http.post("/api/destinations/queue/dedup/messages", twice).status == 201
    again = http.post("/api/destinations/queue/dedup/messages", twice)
    assert (again.status, again.json["duplicate"]) == (200, True)
    assert _depth(managed, "/queue/dedup") == (1, 0)

    for body in (
        {"body": "x", "headers": {"message-id": "mine"}},
        {"body": "x", "headers": {"x-stream-id": "s"}},
        {"body": "x", "body_base64": "eA=="},
        {"body_base64": "not base64!"},
        {"body": "x", "priority": 10},
        {"body": 5},
        {"body": "x", "persistent": "yes"},
    ):
        reply = http.post("/api/destinations/queue/inbox/messages", body)
        assert (reply.status, reply.json["error"]["code"]) == (400, "bad_request"), body
    assert http.request("POST", "/api/destinations/queue/inbox/messages", [1]).status == 400
    assert col.no_message()
    conn.disconnect()


def test_a_move_on_the_journal_reads_paged_messages_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    settings: dict[str, Any] = {
        "store": {"kind": "journal", "data_dir": str(tmp_path / "data")},
        "limits": {"destination_memory_limit_bytes": 16 * 1024},
    }
    managed = start_managed(**settings)
    try:
        conn, col = _connect(managed.broker.port)
        for i in range(400):
            parity = "even" if i % 2 == 0 else "odd"
            conn.send(
                "/queue/all", f"{i:03d} " + "x" * 500, headers={"persistent": "true", "p": parity}
            )
        conn.send("/queue/all", "end", receipt="sent", headers={"persistent": "true", "p": "end"})
        col.receipt("sent")
        view = managed.http.get("/api/destinations/queue/all").json
        assert view["messages_paged"] > 300
        moved = _operate(managed, "/queue/all", "move", headers={"p": "even"}, to="/queue/evens")
        assert moved["moved"] == 200
        assert _depth(managed, "/queue/all") == (201, 0)
        assert _depth(managed, "/queue/evens") == (200, 0)
        conn.disconnect()
    finally:
        managed.stop()
    managed = start_managed(**settings)
    try:
        assert _depth(managed, "/queue/all") == (201, 0)
        assert _depth(managed, "/queue/evens") == (200, 0)
        conn, col = _connect(managed.broker.port)
        _subscribe(conn, col, "/queue/evens", "e", "auto")
        evens = _drain(col, 200)
        assert sorted(f.body[:3] for f in evens) == [f"{i:03d}" for i in range(0, 400, 2)]
        assert all(f.headers["persistent"] == "true" for f in evens)
        _subscribe(conn, col, "/queue/all", "a", "auto")
        rest = _drain(col, 201)
        assert sorted(f.body[:3] for f in rest) == [f"{i:03d}" for i in range(1, 400, 2)] + ["end"]
        conn.disconnect()
    finally:
        managed.stop()


class CommitFailingStore(FailingStore):
    """The memory store, whose writes fail from its `fail_at`-th COMMIT on."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.commits = 0

    def commit(
        self, txid: str, seqs: Sequence[int], on_complete: Callable[[WriteHandle], None] | None
    ) -> WriteHandle:
        self.commits += 1
        if self.commits == self.fail_at:
            self.fail_writes()
        return super().commit(txid, seqs, on_complete)


def test_a_step_the_store_fails_loses_nothing() -> None:
    managed = start_managed(message_store=CommitFailingStore(fail_at=2))
    try:
        conn, col = _connect(managed.broker.port)
        for i in range(2499):
            conn.send("/queue/a", str(i), headers={"persistent": "true"})
        conn.send("/queue/a", "2499", receipt="sent", headers={"persistent": "true"})
        col.receipt("sent")
        reply = managed.http.post(
            "/api/destinations/queue/a/messages/move", {"all": True, "to": "/queue/b"}
        )
        assert reply.status == 503, reply.text
        assert reply.json["error"]["code"] == "unavailable"
        assert "1000 messages were moved before" in reply.json["error"]["message"]
        # The first step is done; the failed one took nothing away.
        assert _depth(managed, "/queue/a") == (1500, 0)
        assert _depth(managed, "/queue/b") == (1000, 0)
        in_a = {m["body_preview"] for m in _all_items(managed, "/queue/a")}
        in_b = {m["body_preview"] for m in _all_items(managed, "/queue/b")}
        assert not in_a & in_b
        assert in_a | in_b == {str(i) for i in range(2500)}
        refused = managed.http.post("/api/destinations/queue/a/messages/delete", {"all": True})
        assert (refused.status, refused.json["error"]["code"]) == (503, "unavailable")
        conn.disconnect()
    finally:
        managed.stop()


_ACL: list[dict[str, Any]] = [
    {"destination": "/queue/orders.>", "read": ["ops"], "write": ["shop"], "admin": ["ops"]},
    {"destination": "/queue/open.>", "read": ["*"], "write": ["*"], "admin": ["*"]},
    {"destination": "/queue/>", "read": ["ops"], "admin": ["ops"]},
    {"destination": "/topic/>", "read": ["ops"], "admin": ["ops"]},
]


def test_permissions_are_those_of_stomp(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _write_users(users)
    managed = start_managed(
        auth={"users_file": str(users)}, acl=_ACL, limits={"login_failure_delay_s": 0}
    )
    try:
        alice = managed.http.as_user("alice", PASSWORDS["alice"])  # ops
        bob = managed.http.as_user("bob", PASSWORDS["bob"])  # shop
        send = {"body": "o", "headers": {"x-original-destination": "/queue/orders.x"}}
        # Writing to a destination that does not exist creates it: admin, as over STOMP.
        refused = bob.post("/api/destinations/queue/orders.x/messages", send)
        assert (refused.status, refused.json["error"]["code"]) == (403, "forbidden")
        assert "admin permission on /queue/orders.x" in refused.json["error"]["message"]
        assert alice.put("/api/destinations/queue/orders.x").status == 201
        for _ in range(3):
            assert bob.post("/api/destinations/queue/orders.x/messages", send).status == 201
        assert bob.get("/api/destinations/queue/orders.x/messages/count").status == 403
        assert (
            bob.post("/api/destinations/queue/orders.x/messages/delete", {"all": True}).status
            == 403
        )
        # alice reads orders.x but may not write to orders.y.
        no_write = alice.post(
            "/api/destinations/queue/orders.x/messages/move", {"all": True, "to": "/queue/orders.y"}
        )
        assert no_write.status == 403
        assert "write permission on /queue/orders.y" in no_write.json["error"]["message"]
        moved = alice.post(
            "/api/destinations/queue/orders.x/messages/move", {"all": True, "to": "/queue/open.z"}
        )
        assert moved.json["moved"] == 3
        # A retry skips the targets its caller may not write to, and says so.
        before = managed.broker.stats().get("access_denied_write", 0)
        skipped = alice.post("/api/destinations/queue/open.z/messages/retry", {"all": True})
        assert skipped.json["retried"] == 0
        assert skipped.json["skipped"] == {"access denied: write permission on /queue/orders.x": 3}
        assert managed.broker.stats()["access_denied_write"] == before + 1
        retried = bob.post("/api/destinations/queue/open.z/messages/retry", {"all": True})
        assert retried.json["retried"] == 3
        assert alice.get("/api/destinations/queue/orders.x").json["messages_ready"] == 3
    finally:
        managed.stop()
