"""Downloads over real HTTP against a broker carrying STOMP traffic: a message's whole body by
id (in memory, held by a consumer, or paged out to the journal), a whole stream whose chunks
interleave with another's, read from the store a bounded window at a time; streams that are not
whole (chunks consumed or missing, no end yet, aborted) refused with a 409 before any byte; a
stream the queue changes under, cut short of its length; the `read` permission; and `sluice
admin download`."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.conftest import sluice, stderr_lines
from server.test_auth import PASSWORDS, _write_users
from server.test_interop_stomppy import _connect, _subscribe
from sluice.core.picking import QueuePicking, Window
from sluice.http import downloads
from streams.conftest import RawProducer, payload, sha
from waiting import wait_until

from .conftest import Managed, start_managed
from .test_auth import ACL

Q = "/queue/files"
CHUNK = 64 * 1024


def _body_path(queue: str, message_id: str) -> str:
    short = urllib.parse.quote(queue.removeprefix("/queue/"), safe="")
    return (
        f"/api/destinations/queue/{short}/messages/{urllib.parse.quote(message_id, safe='')}/body"
    )


def _stream_path(queue: str, stream_id: str) -> str:
    short = urllib.parse.quote(queue.removeprefix("/queue/"), safe="")
    return f"/api/destinations/queue/{short}/streams/{urllib.parse.quote(stream_id, safe='')}/body"


def _depth(managed: Managed, queue: str) -> tuple[int, int]:
    short = urllib.parse.quote(queue.removeprefix("/queue/"), safe="")
    view = managed.http.get(f"/api/destinations/queue/{short}").json
    return view["messages_ready"], view["messages_in_flight"]


def _ids(managed: Managed, queue: str) -> list[dict[str, Any]]:
    short = urllib.parse.quote(queue.removeprefix("/queue/"), safe="")
    page = managed.http.get(f"/api/destinations/queue/{short}/messages?limit=100")
    assert page.status == 200, page.text
    return page.json["items"]  # type: ignore[no-any-return]


def _error(reply: tuple[int, dict[str, str], bytes]) -> tuple[int, str, str]:
    status, headers, body = reply
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    return status, error["code"], error["message"]


def _admin(managed: Managed, *args: str) -> tuple[int, bytes, list[str]]:
    result = sluice("admin", "--url", managed.http.base, *args)
    return result.returncode, result.stdout, stderr_lines(result)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Managed]:
    """A broker on the journal that keeps little of a queue in memory: the rest is paged."""
    running = start_managed(
        store={"kind": "journal", "data_dir": str(tmp_path / "data")},
        limits={"destination_memory_limit_bytes": 256 * 1024},
    )
    try:
        yield running
    finally:
        running.stop()


def test_a_message_body_downloaded_whole_without_consuming_it(managed: Managed) -> None:
    producer = RawProducer(managed.broker.port)
    big = payload(200_000, seed=7) + b"\0\r\n"  # binary, far over a browse's preview
    producer.send({"n": "0"}, b"first", destination="/queue/blobs")
    producer.send({"n": "1"}, big, destination="/queue/blobs")
    producer.send({"n": "2"}, b"", destination="/queue/blobs")
    consumer, ccol = _connect(managed.broker.port)
    _subscribe(
        consumer, ccol, "/queue/blobs", "c", "client-individual", **{"activemq.prefetchSize": "1"}
    )
    held = ccol.message()
    wait_until(lambda: _depth(managed, "/queue/blobs") == (2, 1), what="one in flight")
    items = _ids(managed, "/queue/blobs")
    assert [m["headers"]["n"] for m in items] == ["0", "1", "2"]
    assert items[1]["body_bytes"] == len(big)

    status, headers, body = managed.http.get_bytes(
        _body_path("/queue/blobs", items[1]["message_id"])
    )
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Length"] == str(len(big))
    assert headers["X-Message-Id"] == items[1]["message_id"]
    assert body == big
    # The one a consumer holds, and an empty one.
    assert managed.http.get_bytes(_body_path("/queue/blobs", held.headers["message-id"]))[2] == (
        b"first"
    )
    status, headers, body = managed.http.get_bytes(
        _body_path("/queue/blobs", items[2]["message_id"])
    )
    assert (status, headers["Content-Length"], body) == (200, "0", b"")
    # Nothing was consumed.
    assert _depth(managed, "/queue/blobs") == (2, 1)
    assert ccol.no_message()

    assert _error(managed.http.get_bytes(_body_path("/queue/blobs", "ID:none"))) == (
        404,
        "message_not_found",
        "no message ID:none in /queue/blobs",
    )
    assert _error(managed.http.get_bytes(_body_path("/queue/nothing", "ID:x")))[:2] == (
        404,
        "destination_not_found",
    )
    managed.http.put("/api/destinations/topic/t")
    topic = managed.http.get_bytes("/api/destinations/topic/t/messages/ID:x/body")
    assert _error(topic)[:2] == (409, "not_a_queue")

    # sluice admin, to standard output.
    code, out, err = _admin(managed, "download", "/queue/blobs", "--id", items[1]["message_id"])
    assert (code, err) == (0, [])
    assert out == big
    consumer.ack(held.headers["ack"])
    consumer.disconnect()


def test_a_paged_message_is_read_back_from_the_journal(journal: Managed, tmp_path: Path) -> None:
    producer = RawProducer(journal.broker.port)
    bodies = [payload(20_000, seed=i) for i in range(40)]
    for i, body in enumerate(bodies):
        producer.send({"n": str(i)}, body, destination="/queue/paged")
    view = journal.http.get("/api/destinations/queue/paged").json
    assert view["messages_paged"] > 20
    items = []
    after = 0
    while True:
        page = journal.http.get(f"/api/destinations/queue/paged/messages?after={after}&limit=100")
        items += page.json["items"]
        if page.json["next_after"] is None:
            break
        after = page.json["next_after"]
    assert len(items) == 40
    status, _, body = journal.http.get_bytes(_body_path("/queue/paged", items[-1]["message_id"]))
    assert (status, body) == (200, bodies[-1])
    out = tmp_path / "m.bin"
    code, stdout, err = _admin(
        journal, "download", "/queue/paged", "--id", items[30]["message_id"], "-o", str(out)
    )
    assert (code, err) == (0, [])
    assert out.read_bytes() == bodies[30]
    assert stdout.decode().strip() == (
        f"wrote message {items[30]['message_id']} of /queue/paged to {out} (20000 bytes)"
    )
    assert _depth(journal, "/queue/paged") == (40, 0)


def test_a_download_needs_read_on_the_queue(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    _write_users(users)
    running = start_managed(
        auth={"users_file": str(users)}, acl=ACL, limits={"login_failure_delay_s": 0}
    )
    try:
        alice = running.http.as_user("alice", PASSWORDS["alice"])  # ops: read on orders
        bob = running.http.as_user("bob", PASSWORDS["bob"])  # shop: write on orders
        assert alice.put("/api/destinations/queue/orders.eu").status == 201
        sent = bob.post("/api/destinations/queue/orders.eu/messages", {"body": "secret"})
        assert sent.status == 201, sent.text
        path = _body_path("/queue/orders.eu", sent.json["message_id"])
        status, code, message = _error(bob.get_bytes(path))
        assert (status, code) == (403, "forbidden")
        assert message == "access denied: read permission on /queue/orders.eu is not granted"
        assert bob.get_bytes(_stream_path("/queue/orders.eu", "s"))[0] == 403
        assert alice.get_bytes(path)[2] == b"secret"
        assert running.broker.stats()["access_denied_read"] == 2
    finally:
        running.stop()


class _Windows:
    """Records what each window of a queue held, and can hide a chunk from the second pass of a
    download (as if a consumer took it in between)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.passes = 0
        self.hide: tuple[str, str] | None = None
        self._last_after = -1
        real = QueuePicking.window
        windows = self

        def window(
            queue: QueuePicking, after_seq: int, max_count: int, max_bytes: int = 0
        ) -> Window:
            got = real(queue, after_seq, max_count, max_bytes)
            if queue.name != Q:
                return got
            if after_seq <= windows._last_after:
                windows.passes += 1
            windows._last_after = after_seq
            windows.sizes.append(sum(len(found.message.body) for found in got.found))
            if windows.hide is not None and windows.passes >= 1:
                stream_id, seq = windows.hide
                kept = [
                    f
                    for f in got.found
                    if (f.message.headers.get("x-stream-id"), f.message.headers.get("x-stream-seq"))
                    != (stream_id, seq)
                ]
                return Window(kept, got.next_after)
            return got

        monkeypatch.setattr(QueuePicking, "window", window)
        monkeypatch.setattr(downloads, "WINDOW_MESSAGES", 8)
        monkeypatch.setattr(downloads, "WINDOW_BYTES", 128 * 1024)


def test_a_stream_downloaded_in_order_a_window_at_a_time(
    journal: Managed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two streams sent at once, chunks interleaved with each other's and with plain messages,
    most of them paged out: the download is one stream's bytes in order, and the queue is read
    no more than a window (8 messages here) at a time."""
    producer = RawProducer(journal.broker.port)
    first, second = payload(40 * CHUNK + 123, seed=1), payload(30 * CHUNK, seed=2)
    pieces = {
        sid: [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        for sid, data in (("film-1", first), ("film-2", second))
    }
    for i in range(max(len(p) for p in pieces.values())):
        for sid, data in (("film-1", first), ("film-2", second)):
            if i < len(pieces[sid]):
                end = data if i == len(pieces[sid]) - 1 else None
                producer.chunk(sid, i, i * CHUNK, pieces[sid][i], end=end)
        producer.send({"kind": "plain"}, b"between")
    before = _depth(journal, Q)
    assert before[0] == 41 + 30 + 41
    assert journal.http.get("/api/destinations/queue/files").json["messages_paged"] > 60
    windows = _Windows(monkeypatch)

    status, headers, body = journal.http.get_bytes(_stream_path(Q, "film-1"))
    assert status == 200, body[:300]
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Length"] == str(len(first))
    assert (headers["X-Stream-Sha256"], headers["X-Stream-Chunks"]) == (sha(first), "41")
    assert body == first
    assert windows.passes == 1  # checked, then sent
    assert max(windows.sizes) <= 8 * CHUNK
    assert sum(windows.sizes) >= 2 * len(first)
    assert _depth(journal, Q) == before

    out = tmp_path / "film-2.bin"
    code, stdout, err = _admin(journal, "download", Q, "--stream", "film-2", "-o", str(out))
    assert (code, err) == (0, [])
    assert out.read_bytes() == second
    assert stdout.decode().strip() == (
        f"wrote stream film-2 of {Q} to {out} ({len(second)} bytes, SHA-256 checked)"
    )
    assert _depth(journal, Q) == before


def test_a_stream_the_queue_changes_under_is_cut_short(
    managed: Managed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = RawProducer(managed.broker.port)
    data = payload(10 * 1000, seed=3)
    producer.stream("s", data, 1000)
    windows = _Windows(monkeypatch)
    windows.hide = ("s", "5")  # gone between the check and the sending
    out = tmp_path / "s.bin"
    code, stdout, err = _admin(managed, "download", Q, "--stream", "s", "-o", str(out))
    assert (code, stdout) == (1, b"")
    assert len(err) == 1, err
    assert "was cut short after 5000 of 10000 bytes" in err[0], err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_stream_not_whole_is_refused_before_any_byte(managed: Managed, tmp_path: Path) -> None:
    port = managed.broker.port
    producer = RawProducer(port)
    data = payload(4000, seed=4)
    producer.chunk("open", 0, 0, data[:1000])
    producer.chunk("open", 1, 1000, data[1000:2000])
    producer.stream("gone", data, 1000)
    producer.stream("hole", data, 1000)
    quitter = RawProducer(port)
    quitter.chunk("cut", 0, 0, data[:1000])
    quitter.raw.close()  # the broker ends the stream with an abort marker
    wait_until(
        lambda: (
            managed.http.get(
                "/api/destinations/queue/files/messages/count?header=x-stream-abort:true"
            ).json["count"]
            == 1
        ),
        what="the abort marker",
    )
    for sid, seq in (("gone", "0"), ("hole", "2")):
        deleted = managed.http.post(
            "/api/destinations/queue/files/messages/delete",
            {"headers": {"x-stream-id": sid, "x-stream-seq": seq}},
        )
        assert deleted.json["deleted"] == 1, deleted.text
    depth = _depth(managed, Q)

    cases = {
        "open": "no end yet: chunks 0 to 1 are here, it is still sent",
        "gone": f"chunks 0 to 0 are not in {Q} (consumed, or moved)",
        "hole": "chunk 2 is missing (the next here is 3)",
        "cut": "no end: it was aborted after chunk 0 (",
    }
    for sid, why in cases.items():
        status, code, message = _error(managed.http.get_bytes(_stream_path(Q, sid)))
        assert (status, code) == (409, "stream_incomplete"), message
        assert message.startswith(f"stream {sid} of {Q} is not whole: {why}"), message
    assert _error(managed.http.get_bytes(_stream_path(Q, "never"))) == (
        404,
        "stream_not_found",
        f"no chunk of stream never in {Q}",
    )
    out = tmp_path / "hole.bin"
    code, stdout, err = _admin(managed, "download", Q, "--stream", "hole", "-o", str(out))
    assert (code, stdout) == (1, b"")
    assert err == [
        f"sluice admin: stream hole of {Q} is not whole: chunk 2 is missing (the next here is 3) "
        "(stream_incomplete, HTTP 409)"
    ]
    assert list(tmp_path.iterdir()) == []
    code, _, err = _admin(managed, "download", Q)
    assert code == 2
    assert _depth(managed, Q) == depth
