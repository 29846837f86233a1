"""The store's view and the streams in progress over real HTTP against a broker carrying STOMP
traffic: journal files with their live messages by destination (counted against what the test
sent), the oldest sequence that pins each file, collection and the archive; a memory store's
empty view; a stream being sent and read, with its reader's position and where the next reader
resumes; and `sluice admin list files|streams` and `store`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.test_interop_stomppy import _connect, _subscribe
from waiting import wait_until

from .conftest import Managed, start_managed
from .test_cli_admin import admin


def _files(managed: Managed) -> list[dict[str, Any]]:
    page = managed.http.get("/api/store/files?limit=1000")
    assert page.status == 200, page.text
    return page.json["items"]  # type: ignore[no-any-return]


def _live(managed: Managed) -> dict[str, int]:
    live: dict[str, int] = {}
    for item in _files(managed):
        for name, count in item["live_by_destination"].items():
            live[name] = live.get(name, 0) + count
    return live


def test_journal_files_and_what_pins_them(tmp_path: Path) -> None:
    managed = start_managed(
        store={
            "kind": "journal",
            "data_dir": str(tmp_path / "data"),
            "journal_file_bytes": 1024 * 1024,
            "checkpoint_interval_s": 0.05,
            "gc_interval_s": 0.1,
            "archive": True,
        }
    )
    try:
        conn, col = _connect(managed.broker.port)
        body = "x" * 2500
        for i in range(1200):
            conn.send("/queue/a" if i % 3 else "/queue/b", body, headers={"persistent": "true"})
        conn.send("/queue/b", "end", receipt="sent", headers={"persistent": "true"})
        col.receipt("sent")
        # The view is the index's last checkpoint: wait for one that has everything.
        wait_until(lambda: _live(managed) == {"/queue/a": 800, "/queue/b": 401}, what="checkpoint")
        files = _files(managed)
        assert len(files) >= 3
        assert files[0]["oldest_by_destination"] == {"/queue/a": 1, "/queue/b": 1}
        assert [f["head"] for f in files].count(True) == 1
        assert files[-1]["head"]
        assert all(f["size_bytes"] > 0 for f in files)
        assert sum(f["live_messages"] for f in files) == 1201
        store = managed.http.get("/api/store").json
        assert store["kind"] == "journal"
        assert store["files"] == len(files)
        assert store["live_messages"] == 1201
        assert store["checkpoint"]["file"] >= 1
        assert store["last_checkpoint_ms"] is not None
        assert store["complete"] is True

        # The first 300 of /queue/a acknowledged: what pins the first file is from #301 on.
        _subscribe(
            conn, col, "/queue/a", "first", "client-individual", **{"activemq.prefetchSize": "300"}
        )
        for _ in range(300):
            conn.ack(col.message().headers["ack"])
        conn.unsubscribe("first")
        wait_until(lambda: _live(managed).get("/queue/a") == 500, what="300 acknowledged")
        pinned = [f["oldest_by_destination"].get("/queue/a") for f in _files(managed)]
        assert min(seq for seq in pinned if seq is not None) == 301
        # Consumed, /queue/a pins nothing; collection archives the files nothing needs.
        _subscribe(conn, col, "/queue/a", "s", "auto")
        for _ in range(500):
            col.message()
        wait_until(lambda: "/queue/a" not in _live(managed), what="a's messages gone")
        _subscribe(conn, col, "/queue/b", "t", "auto")
        for _ in range(401):
            col.message()

        def archived() -> bool:
            view = managed.http.get("/api/store").json
            return bool(view["archive"]) and view["gc_archived_files"] > 0

        wait_until(archived, what="files archived")

        def archive_agrees() -> bool:
            # The archive's directory and the collection's count are read one after the other,
            # so they agree once no collection is moving files between the two reads.
            view = managed.http.get("/api/store").json
            return bool(view["archive"] and view["archive"]["files"] == view["gc_archived_files"])

        wait_until(archive_agrees, what="the archive's files as the collections counted them")
        store = managed.http.get("/api/store").json
        assert store["archive"]["oldest"] == "db-1.log"
        assert store["last_gc_ms"] is not None
        wait_until(lambda: _live(managed) == {}, what="nothing live")
        by_size = managed.http.get("/api/store/files?sort=size_bytes&order=desc&limit=1").json
        assert len(by_size["items"]) == 1

        code, out, err = admin(managed, "list", "files")
        assert code == 0, err
        assert out.splitlines()[0].split() == [
            "FILE",
            "SIZE",
            "LIVE",
            "LIVE-BYTES",
            "PINS",
            "HEAD",
            "PINNED-BY",
        ]
        code, out, _ = admin(managed, "store")
        assert "kind: journal" in out.splitlines()
        conn.disconnect()
    finally:
        managed.stop()


def test_a_memory_store_has_no_files(managed: Managed) -> None:
    store = managed.http.get("/api/store").json
    assert (store["kind"], store["files"], store["checkpoint"]) == ("memory", 0, None)
    assert managed.http.get("/api/store/files").json["items"] == []


def _streams(managed: Managed) -> list[dict[str, Any]]:
    return managed.http.get("/api/streams").json["items"]  # type: ignore[no-any-return]


def _chunk(conn: Any, seq: int, size: int = 100) -> None:
    headers = {
        "persistent": "true",
        "x-stream-id": "film",
        "x-stream-seq": str(seq),
        "x-stream-offset": str(seq * size),
    }
    conn.send("/queue/films", "c" * size, headers=headers, receipt=f"chunk-{seq}")


def test_streams_in_progress_with_their_readers(managed: Managed) -> None:
    producer, pcol = _connect(managed.broker.port)
    for seq in range(5):
        _chunk(producer, seq)
        pcol.receipt(f"chunk-{seq}")
    (stream,) = _streams(managed)
    assert stream["destination"] == "/queue/films"
    assert stream["stream_id"] == "film"
    assert (stream["sending"], stream["producer_connected"]) == (True, True)
    assert stream["reading"] == "none"
    assert (stream["resume_chunk"], stream["resume_offset"]) == (0, 0)
    # The furthest chunk held, and no end yet: a reader's progress is "of at least 5".
    assert (stream["last_chunk"], stream["ended"], stream["length_bytes"]) == (4, False, None)

    reader, rcol = _connect(managed.broker.port)
    _subscribe(
        reader,
        rcol,
        "/queue/films",
        "r",
        "client-individual",
        **{"activemq.prefetchSize": "2", "x-max-open-groups": "1"},
    )
    chunks = [rcol.message(), rcol.message()]
    wait_until(lambda: _streams(managed)[0]["chunks_in_flight"] == 2, what="2 chunks out")
    (stream,) = _streams(managed)
    connections = managed.http.get("/api/connections").json["items"]
    reader_ids = [c["id"] for c in connections if c["subscriptions"] == 1]
    assert stream["reading"] == "reading"
    assert [stream["reader_connection"]] == reader_ids
    assert stream["reader_subscription"] == "r"
    assert (stream["delivered_chunk"], stream["resume_chunk"]) == (1, 0)
    reader.ack(chunks[0].headers["ack"])
    wait_until(lambda: _streams(managed)[0]["resume_chunk"] == 1, what="chunk 0 acknowledged")
    assert _streams(managed)[0]["resume_offset"] == 100

    code, out, err = admin(managed, "list", "streams")
    assert code == 0, err
    row = out.splitlines()[1].split()
    assert row[:4] == ["/queue/films", "film", "yes", "reading"]
    assert row[-1] == "1@100"

    # The reader dies mid-stream: the next one resumes at chunk 1.
    reader.disconnect()
    wait_until(lambda: _streams(managed)[0]["reading"] == "resuming", what="resuming")
    (stream,) = _streams(managed)
    assert (stream["reader_connection"], stream["resume_chunk"]) == (None, 1)
    # The producer ends it: the stream is no longer being sent.
    producer.send(
        "/queue/films",
        "",
        headers={
            "persistent": "true",
            "x-stream-id": "film",
            "x-stream-seq": "5",
            "x-stream-offset": "500",
            "x-stream-end": "true",
            "x-stream-length": "500",
        },
        receipt="end",
    )
    pcol.receipt("end")
    (stream,) = _streams(managed)
    assert stream["sending"] is False
    assert (stream["last_chunk"], stream["ended"], stream["length_bytes"]) == (5, True, 500)
    assert managed.http.get("/api/streams?destination=/queue/other").json["total"] == 0
    producer.disconnect()
