"""The console's defences in real Chromium: markup in a message body, a header or a destination
name is shown as text and never runs; what a user may not do is not offered, and refused by the
API when forced; a state-changing request without the session's CSRF token is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from management.conftest import Managed
from server.test_auth import PASSWORDS

from .consolekit import element, go, login, start_console, wait_for, wait_text

# Each would set window.__xss if the page ran it.
BODY = '<script>window.__xss = "body"</script><img src=x onerror="window.__xss = \'img\'">'
HEADER = "<img src=x onerror=\"window.__xss = 'header'\">"
NAME = "/queue/shop.<img src=x onerror=window.__xss=1>"

_FETCH = """
const [method, path, token] = arguments;
const done = arguments[arguments.length - 1];
const headers = {"X-Sluice-Console": "1"};
if (token) headers["X-CSRF-Token"] = token;
fetch(path, {method, headers, credentials: "same-origin"})
  .then(async r => done({status: r.status, body: await r.text()}), e => done({error: String(e)}));
"""
_TOKEN = """
const done = arguments[arguments.length - 1];
fetch("/api/whoami").then(r => r.json()).then(w => done(w.csrf_token), e => done(String(e)));
"""


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Managed]:
    running = start_console(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _fetch(driver: webdriver.Chrome, method: str, path: str, token: str | None) -> Any:
    return driver.execute_async_script(_FETCH, method, path, token)


def _path(name: str) -> str:
    return "/api/destinations/queue/" + quote(name.removeprefix("/queue/"), safe="")


def test_markup_in_a_body_a_header_and_a_name_is_shown_as_text(
    console: Managed, chromium: webdriver.Chrome
) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    sent = admin.post(_path(NAME) + "/messages", {"body": BODY, "headers": {"x-note": HEADER}})
    assert sent.status == 201, sent.text
    login(chromium, console, "alice")
    go(chromium, "#/destinations")
    link = element(chromium, "#destinations-table a.dest")
    assert link.text == NAME
    link.click()
    wait_text(chromium, "#destination-name", lambda t: t == NAME, "the name, as text")
    row = element(chromium, "#messages-table tr.message")
    assert row.find_element(By.CSS_SELECTOR, "pre.preview").text == BODY
    values = row.find_elements(By.CSS_SELECTOR, "dl.headers dd")
    assert [v.text for v in values] == [HEADER]
    # Nothing of it became an element, and nothing ran.
    assert chromium.find_elements(By.CSS_SELECTOR, "main img, main script") == []
    assert chromium.execute_script("return window.__xss") is None
    # Nor on the table of destinations, nor in the message the console shows.
    go(chromium, "#/destinations")
    element(chromium, "#destinations-table a.dest")
    assert chromium.execute_script("return window.__xss") is None


def test_what_a_user_may_not_do_is_not_offered_and_is_refused(
    console: Managed, chromium: webdriver.Chrome
) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    assert admin.post(_path("/queue/shop.orders") + "/messages", {"body": "o1"}).status == 201
    login(chromium, console, "bob")  # shop: reads and writes /queue/shop.>, no admin
    # The pages of the whole broker are not offered to him.
    shown = [a.text for a in chromium.find_elements(By.CSS_SELECTOR, "#nav a") if a.is_displayed()]
    assert shown == ["Destinations", "Subscriptions", "Streams"]
    go(chromium, "#/destination/" + quote("/queue/shop.orders", safe=""))
    element(chromium, "#send-panel")  # he may write
    element(chromium, "#messages-table tr.message")  # and read
    assert chromium.find_elements(By.CSS_SELECTOR, '[data-action="purge"]') == []
    assert chromium.find_elements(By.CSS_SELECTOR, '[data-action="delete"]') == []
    # Forced, with a valid session and its token, the API refuses.
    token = chromium.execute_async_script(_TOKEN)
    assert isinstance(token, str)
    assert len(token) > 20
    refused = _fetch(chromium, "DELETE", _path("/queue/shop.orders") + "/messages", token)
    assert refused["status"] == 403
    assert "admin permission on /queue/shop.orders" in refused["body"]
    assert _fetch(chromium, "GET", "/api/overview", None)["status"] == 403
    depth = admin.get(_path("/queue/shop.orders")).json["messages_ready"]
    assert depth == 1


def test_a_change_without_the_csrf_token_is_refused(
    console: Managed, chromium: webdriver.Chrome
) -> None:
    admin = console.http.as_user("alice", PASSWORDS["alice"])
    assert admin.post(_path("/queue/jobs") + "/messages", {"body": "j1"}).status == 201
    login(chromium, console, "alice")
    purge = _path("/queue/jobs") + "/messages"
    refused = _fetch(chromium, "DELETE", purge, None)
    assert refused["status"] == 403
    assert "X-CSRF-Token" in refused["body"]
    wrong = _fetch(chromium, "DELETE", purge, "not-the-token")
    assert wrong["status"] == 403
    assert admin.get(_path("/queue/jobs")).json["messages_ready"] == 1
    assert console.broker.stats()["http_csrf_refused"] == 2
    # Reading needs no token; the same purge with it goes through.
    token = chromium.execute_async_script(_TOKEN)
    assert _fetch(chromium, "DELETE", purge, token)["status"] == 200
    wait_for(
        chromium,
        lambda d: admin.get(_path("/queue/jobs")).json["messages_ready"] == 0,
        "the purge",
    )
