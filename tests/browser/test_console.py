"""The web console in real Chromium: logging in, watching a queue fill while a producer runs,
browsing a message, sending a dead letter back, purging, closing a connection; and the pages
the docs show (saved to docs/console/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import stomp
from selenium import webdriver
from selenium.webdriver.common.by import By

from management.conftest import Managed
from server.test_auth import PASSWORDS

from .consolekit import (
    base_url,
    click,
    confirm,
    console_errors,
    element,
    go,
    login,
    screenshot,
    start_console,
    wait_for,
    wait_text,
)


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Managed]:
    running = start_console(tmp_path, policy={"max_redeliveries": 0})
    try:
        yield running
    finally:
        running.stop()


def _stomp(managed: Managed, user: str, **connect: str) -> stomp.Connection12:
    conn = stomp.Connection12([("127.0.0.1", managed.broker.port)])
    conn.connect(user, PASSWORDS[user], wait=True, headers=connect)
    return conn


def _page(name: str) -> str:
    return "#/destination/" + quote(name, safe="")


def _depth(managed: Managed, name: str) -> int:
    reply = managed.http.as_user("alice", PASSWORDS["alice"]).get(
        "/api/destinations/queue/" + quote(name.removeprefix("/queue/"), safe="")
    )
    assert reply.status == 200, reply.text
    return int(reply.json["messages_ready"])


def test_login_refuses_a_wrong_password_then_lets_in(
    console: Managed, chromium: webdriver.Chrome
) -> None:
    chromium.get(base_url(console) + "/")
    element(chromium, "#login-user").send_keys("alice")
    element(chromium, "#login-password").send_keys("not her password")
    screenshot(chromium, "login")
    click(chromium, "#login-submit")
    refused = wait_text(chromium, "#login-error", bool, "the refusal")
    assert refused == "access refused: bad login or passcode"
    assert not element(chromium, "#login").get_attribute("hidden")
    assert chromium.find_element(By.ID, "nav").get_attribute("hidden") is not None
    assert console.broker.stats()["login_failures"] == 1
    # The right password: the console shows the overview, and the cookie is out of scripts'
    # reach.
    password = element(chromium, "#login-password")
    password.clear()
    password.send_keys(PASSWORDS["alice"])
    click(chromium, "#login-submit")
    wait_text(chromium, "#who-user", lambda t: t == "alice", "alice logged in")
    wait_text(chromium, "#card-connections", lambda t: "Connections" in t, "the overview")
    assert chromium.execute_script("return document.cookie") == ""
    cookie = chromium.get_cookie("sluice_session")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    # Logging out ends the session: a reload asks for the login again.
    click(chromium, "#logout")
    wait_text(chromium, "#login-error", lambda t: t == "Logged out.", "the login form")
    chromium.refresh()
    element(chromium, "#login-user")
    assert chromium.find_element(By.ID, "main").get_attribute("hidden") is not None


def test_depth_changes_while_a_producer_runs(console: Managed, chromium: webdriver.Chrome) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    assert admin.put("/api/destinations/queue/work").status == 201
    login(chromium, console, "alice")
    go(chromium, _page("/queue/work"))
    wait_text(chromium, "#stat-ready", lambda t: t == "0", "an empty queue")
    producer = _stomp(console, "alice")
    try:
        for batch in (1, 2, 3):
            for i in range(50):
                producer.send("/queue/work", f"job {batch}-{i}", headers={"persistent": "true"})
            shown = wait_text(
                chromium, "#stat-ready", lambda t, n=batch * 50: t == str(n), f"{batch * 50}"
            )
            assert shown == str(batch * 50)
            console.broker.call(console.server.rates.sample)  # a point of the overview's charts
    finally:
        producer.disconnect()
    screenshot(chromium, "destination")
    # Others beside it, for the table's picture.
    for name, count in (("orders.eu", 12), ("orders.us", 3), ("DLQ.orders.eu", 1), ("audit", 0)):
        for i in range(count):
            admin.post(f"/api/destinations/queue/{name}/messages", {"body": f"m{i}"})
        admin.put(f"/api/destinations/queue/{name}")
    admin.put("/api/destinations/topic/prices")
    # The destinations table shows the same depth, and sorts by it.
    go(chromium, "#/destinations")
    row = wait_for(
        chromium,
        lambda d: next(
            (
                r
                for r in d.find_elements(By.CSS_SELECTOR, "#destinations-table tbody tr")
                if "/queue/work" in r.text
            ),
            None,
        ),
        "the row of /queue/work",
    )
    assert row.find_element(By.CSS_SELECTOR, "td.depth").text == "150"
    screenshot(chromium, "destinations")
    go(chromium, "#/overview")
    wait_text(chromium, "#card-depth", lambda t: "166" in t, "the overview's depth (150 + 16)")
    screenshot(chromium, "overview")


def test_browse_a_message(console: Managed, chromium: webdriver.Chrome) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    sent = admin.post(
        "/api/destinations/queue/orders/messages",
        {"body": '{"order": 17, "total": 42.5}', "headers": {"customer": "ACME Ltd"}},
    )
    assert sent.status == 201
    message_id = sent.json["message_id"]
    login(chromium, console, "alice")
    go(chromium, _page("/queue/orders"))
    row = element(chromium, f'#messages-table tr.message[data-id="{message_id}"]')
    assert row.find_element(By.CSS_SELECTOR, "pre.preview").text == '{"order": 17, "total": 42.5}'
    headers = row.find_element(By.CSS_SELECTOR, "dl.headers").text.split("\n")
    assert headers == ["customer", "ACME Ltd"]
    link = row.find_element(By.CSS_SELECTOR, "a.download").get_attribute("href")
    assert link is not None
    assert link.endswith(f"/messages/{quote(message_id, safe='')}/body")
    # The download link gives the whole body (with the session's cookie), not consuming it.
    body = chromium.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.text()).then(done, e => done(String(e)));",
        link,
    )
    assert body == '{"order": 17, "total": 42.5}'
    assert _depth(console, "/queue/orders") == 1
    chromium.execute_script("arguments[0].scrollIntoView()", element(chromium, "#messages-panel"))
    screenshot(chromium, "messages")


def test_dead_letter_sent_back_to_its_queue(console: Managed, chromium: webdriver.Chrome) -> None:
    # A real dead letter: delivered once, refused (max_redeliveries = 0).
    consumer = _stomp(console, "alice")
    received: list[stomp.utils.Frame] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            received.append(frame)

    consumer.set_listener("", Listener())
    consumer.subscribe("/queue/payments", id="1", ack="client-individual")
    producer = _stomp(console, "alice")
    producer.send("/queue/payments", "pay 100", headers={"persistent": "true"})
    wait_for(chromium, lambda d: received, "the delivery")
    consumer.nack(received[0].headers["ack"])
    consumer.unsubscribe(id="1")
    wait_for(chromium, lambda d: _depth(console, "/queue/DLQ.payments") == 1, "a dead letter")
    login(chromium, console, "alice")
    go(chromium, _page("/queue/DLQ.payments"))
    row = element(chromium, "#messages-table tr.message")
    assert row.find_element(By.CSS_SELECTOR, "pre.preview").text == "pay 100"
    row.find_element(By.CSS_SELECTOR, "input.pick").click()
    wait_text(chromium, "#messages-selection", lambda t: t == "1 selected", "the selection")
    click(chromium, "#messages-retry")
    done = wait_text(chromium, "#toast", lambda t: t.startswith("retry"), "the answer")
    assert done == "retry: 1 of 1 messages"
    wait_text(chromium, "#messages-table tbody", lambda t: t == "no messages", "an empty DLQ")
    assert _depth(console, "/queue/payments") == 1
    assert _depth(console, "/queue/DLQ.payments") == 0
    producer.disconnect()
    consumer.disconnect()


def test_purge(console: Managed, chromium: webdriver.Chrome) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    for i in range(5):
        admin.post("/api/destinations/queue/batch/messages", {"body": f"m{i}"})
    login(chromium, console, "alice")
    go(chromium, _page("/queue/batch"))
    wait_text(chromium, "#stat-ready", lambda t: t == "5", "5 messages")
    confirm(chromium, '[data-action="purge"]')
    assert wait_text(chromium, "#toast", lambda t: "Purged" in t, "the purge") == (
        "Purged 5 messages of /queue/batch"
    )
    wait_text(chromium, "#stat-ready", lambda t: t == "0", "an empty queue")
    assert _depth(console, "/queue/batch") == 0


def test_close_a_connection(console: Managed, chromium: webdriver.Chrome) -> None:
    closed: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_error(self, frame: stomp.utils.Frame) -> None:
            closed.append(frame.headers.get("message", ""))

    victim = _stomp(console, "bob", **{"client-id": "shop-frontend"})
    victim.set_listener("", Listener())
    other = _stomp(console, "carol")
    try:
        login(chromium, console, "alice")
        go(chromium, "#/connections")
        row = wait_for(
            chromium,
            lambda d: next(
                (
                    r
                    for r in d.find_elements(By.CSS_SELECTOR, "#connections-table tbody tr")
                    if "shop-frontend" in r.text
                ),
                None,
            ),
            "bob's connection",
        )
        connection_id = row.get_attribute("data-id")
        screenshot(chromium, "connections")
        confirm(chromium, f'[data-action="close-{connection_id}"]')
        wait_text(chromium, "#toast", lambda t: t == f"Closed connection {connection_id}", "close")
        wait_for(chromium, lambda d: not victim.is_connected(), "bob's client to be closed")
        assert closed == ["connection closed by an operator (alice)"]
        wait_text(
            chromium, "#connections-table", lambda t: "shop-frontend" not in t, "the row gone"
        )
        assert other.is_connected()
    finally:
        other.disconnect()


def test_every_page_runs_without_script_errors_or_csp_refusals(
    console: Managed, chromium: webdriver.Chrome
) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    assert admin.post("/api/destinations/queue/orders/messages", {"body": "o"}).status == 201
    login(chromium, console, "alice")
    headings = {
        "#/overview": "Overview",
        "#/destinations": "Destinations",
        _page("/queue/orders"): "/queue/orders",
        "#/connections": "Connections",
        "#/subscriptions": "Subscriptions",
        "#/streams": "Streams in progress",
        "#/journal": "Journal",
    }
    for where, heading in headings.items():
        go(chromium, where)
        wait_text(chromium, "#main h1", lambda t, h=heading: t == h, heading)
        # Each page's first data drawn (a table, or the overview's cards).
        element(chromium, "#main table, #overview-cards .card")
    problems = [
        line
        for line in console_errors(chromium)
        if "Content Security Policy" in line or "Uncaught" in line or "Error" in line
    ]
    assert problems == []


def test_send_then_copy_and_move_selected_messages(
    console: Managed, chromium: webdriver.Chrome
) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    assert admin.put("/api/destinations/queue/inbox").status == 201
    login(chromium, console, "alice")
    go(chromium, _page("/queue/inbox"))
    # Three messages sent from the page, each with a header.
    element(chromium, "#send-panel summary").click()
    for n in range(3):
        element(chromium, "#send-body").send_keys(f"letter {n}")
        headers = element(chromium, "#send-headers")
        headers.clear()
        headers.send_keys(f"letter-number: {n}")
        click(chromium, "#send-submit")
        wait_text(
            chromium, "#toast", lambda t: t.startswith("Sent ") and "/queue/inbox" in t, "sent"
        )
        wait_text(chromium, "#stat-ready", lambda t, n=n: t == str(n + 1), f"{n + 1} messages")
        chromium.execute_script("document.getElementById('toast').textContent = ''")
    browsed = admin.get("/api/destinations/queue/inbox/messages").json["items"]
    assert [(m["body_preview"], m["headers"]["letter-number"]) for m in browsed] == [
        ("letter 0", "0"),
        ("letter 1", "1"),
        ("letter 2", "2"),
    ]
    click(chromium, "#messages-refresh")
    wait_for(chromium, lambda d: len(d.find_elements(By.CSS_SELECTOR, "input.pick")) == 3, "rows")
    picks = chromium.find_elements(By.CSS_SELECTOR, "input.pick")
    picks[0].click()
    picks[1].click()
    target = element(chromium, "#move-target")
    target.send_keys("/queue/copies")
    click(chromium, "#messages-copy")
    wait_text(chromium, "#toast", lambda t: t == "copy: 2 of 2 messages", "the copy")
    assert _depth(console, "/queue/copies") == 2
    assert _depth(console, "/queue/inbox") == 3
    # A copy leaves the selection; a move takes the selected messages away.
    target.clear()
    target.send_keys("/queue/archive")
    click(chromium, "#messages-move")
    wait_text(chromium, "#toast", lambda t: t == "move: 2 of 2 messages", "the move")
    assert _depth(console, "/queue/archive") == 2
    wait_text(chromium, "#stat-ready", lambda t: t == "1", "one message left")
    left = admin.get("/api/destinations/queue/inbox/messages").json["items"]
    assert [m["body_preview"] for m in left] == ["letter 2"]
