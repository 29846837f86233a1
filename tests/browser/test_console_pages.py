"""The console's other pages in Chromium, on a broker with a journal: a stream being read with
its reader's progress, durable subscriptions (one deleted from the page), and the journal's
files with what pins each. Their screenshots go to docs/console/."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import stomp
from selenium import webdriver
from selenium.webdriver.common.by import By

from management.conftest import Http, Managed, start_managed
from server.test_auth import PASSWORDS

from .consolekit import element, go, login, screenshot, start_console, wait_for, wait_text

CHUNK = 64 * 1024
CHUNKS = 5


@pytest.fixture
def journaled(tmp_path: Path) -> Iterator[Managed]:
    running = start_console(
        tmp_path,
        store={
            "kind": "journal",
            "data_dir": str(tmp_path / "data"),
            "journal_file_bytes": 1 << 20,
            "checkpoint_interval_s": 0.2,  # the journal's view is as of the last checkpoint
            "gc_interval_s": 0.2,
        },
    )
    try:
        yield running
    finally:
        running.stop()


def _ready(http: Http, queue: str) -> int:
    return int(http.get(f"/api/destinations/queue/{queue}").json["messages_ready"])


def _stomp(managed: Managed, user: str, **headers: str) -> stomp.Connection12:
    conn = stomp.Connection12([("127.0.0.1", managed.broker.port)])
    conn.connect(user, PASSWORDS[user], wait=True, headers=headers)
    return conn


def test_a_stream_being_read_shows_its_progress(
    journaled: Managed, chromium: webdriver.Chrome
) -> None:
    data = bytes(range(256)) * (CHUNK * CHUNKS // 256)
    producer = _stomp(journaled, "alice")
    # A first journal file filled and emptied: collected, and seen in the journal's history.
    admin = journaled.http.as_user("alice", PASSWORDS["alice"])
    receipts: list[str] = []

    class Receipts(stomp.ConnectionListener):
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            receipts.append(frame.headers["receipt-id"])

    producer.set_listener("receipts", Receipts())
    for i in range(24):
        # Receipted, so written: a purge before the write would cancel it instead.
        producer.send(
            "/queue/scratch", b"x" * CHUNK, headers={"persistent": "true"}, receipt=f"s{i}"
        )
    wait_for(chromium, lambda d: len(receipts) == 24, "the scratch messages written")
    assert _ready(admin, "scratch") == 24
    assert admin.delete("/api/destinations/queue/scratch/messages").json == {"purged": 24}
    for seq in range(CHUNKS):
        headers = {
            "persistent": "true",
            "x-stream-id": "report-2026.csv",
            "x-stream-seq": str(seq),
            "x-stream-offset": str(seq * CHUNK),
        }
        if seq == CHUNKS - 1:
            headers.update(
                {
                    "x-stream-end": "true",
                    "x-stream-length": str(len(data)),
                    "x-stream-sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        producer.send("/queue/files", data[seq * CHUNK : (seq + 1) * CHUNK], headers=headers)
    received: list[stomp.utils.Frame] = []

    class Reader(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            received.append(frame)

    reader = _stomp(journaled, "alice")
    reader.set_listener("", Reader())
    reader.subscribe(
        "/queue/files",
        id="files",
        ack="client-individual",
        headers={"x-max-open-groups": "1", "activemq.prefetchSize": "3"},
    )
    try:
        wait_for(chromium, lambda d: len(received) == 3, "three chunks")
        reader.ack(received[0].headers["ack"])
        login(chromium, journaled, "alice")
        go(chromium, "#/streams")
        row = element(chromium, '#streams-table tr.stream[data-id="report-2026.csv"]')
        wait_for(chromium, lambda d: "1 of 5 chunks" in row.text, "the reader's progress")
        bar = row.find_element(By.CSS_SELECTOR, "progress")
        assert (bar.get_attribute("value"), bar.get_attribute("max")) == ("1", "5")
        assert "reading" in row.text
        assert "320.0 KiB" in row.text  # the whole stream's length, from its end chunk
        screenshot(chromium, "streams")
        # The journal: its files, and what keeps each (the stream's chunks in /queue/files).
        wait_for(
            chromium,
            lambda d: admin.get("/api/store").json["gc_deleted_files"] >= 1,
            "the first file collected",
        )
        server = journaled.server
        journaled.broker.call(server.rates.sample)
        go(chromium, "#/journal")
        history = wait_text(chromium, "#journal-history tbody", bool, "the collection seen")
        # Each row: when (two words), files deleted, archived, compacted, checkpoints.
        rows = [line.split()[2:5] for line in history.split("\n")]
        assert ["1", "0", "0"] in rows, rows
        assert sum(int(deleted) for deleted, _, _ in rows) == 1
        wait_text(chromium, "#journal-summary", lambda t: "journal" in t, "the store")
        # Chunk 0 was acknowledged: four are live, the oldest is the second message.
        pinned = wait_text(
            chromium,
            "#journal-files tbody",
            lambda t: "/queue/files: 4 live" in t,
            "the chunks pinning a file",
        )
        assert "/queue/files: 4 live (oldest seq 2)" in pinned
        screenshot(chromium, "journal")
    finally:
        reader.disconnect()
        producer.disconnect()


def test_a_durable_subscription_is_deleted_from_the_page(
    journaled: Managed, chromium: webdriver.Chrome
) -> None:
    for name in ("dashboard", "audit"):
        subscriber = _stomp(journaled, "alice", **{"client-id": f"{name}-app"})
        subscriber.subscribe("/topic/prices", id="1", headers={"activemq.subscriptionName": name})
        subscriber.disconnect()
    admin = journaled.http.as_user("alice", PASSWORDS["alice"])
    assert admin.get("/api/subscriptions").json["total"] == 2
    login(chromium, journaled, "alice")
    go(chromium, "#/subscriptions")
    wait_text(chromium, "#durables-table", lambda t: "audit-app" in t, "the subscriptions")
    screenshot(chromium, "subscriptions")
    rows = chromium.find_elements(By.CSS_SELECTOR, "#durables-table tbody tr")
    audit = next(r for r in rows if "audit-app" in r.text)
    button = audit.find_element(By.CSS_SELECTOR, '[data-action="delete-subscription"]')
    assert button.text == "Delete"
    button.click()
    wait_for(chromium, lambda d: "armed" in (button.get_attribute("class") or ""), "armed")
    button.click()
    wait_text(chromium, "#toast", lambda t: t == "Deleted durable subscription audit", "delete")
    wait_text(chromium, "#durables-table", lambda t: "audit-app" not in t, "the row gone")
    left = admin.get("/api/subscriptions").json["items"]
    assert [(s["client_id"], s["name"]) for s in left] == [("dashboard-app", "dashboard")]


def test_without_users_the_console_opens_as_anonymous(
    tmp_path: Path, chromium: webdriver.Chrome
) -> None:
    running = start_managed()  # no users file: loopback only, everyone anonymous
    try:
        chromium.get(f"http://127.0.0.1:{running.server.port}/")
        wait_text(chromium, "#who-user", lambda t: t == "anonymous", "the anonymous user")
        assert not chromium.find_element(By.ID, "login").is_displayed()
        assert not chromium.find_element(By.ID, "logout").is_displayed()
        go(chromium, "#/destinations")
        element(chromium, "#create-name").send_keys("/queue/made.in.the.console")
        element(chromium, "#create-name").submit()
        wait_text(
            chromium, "#destinations-table", lambda t: "/queue/made.in.the.console" in t, "created"
        )
        names = [d["name"] for d in running.http.get("/api/destinations").json["items"]]
        assert names == ["/queue/made.in.the.console"]
    finally:
        running.stop()
