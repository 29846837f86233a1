"""@stomp/stompjs, the STOMP client of the browser world, in real headless Chromium: a page
served from 127.0.0.1 connects to the broker's `/stomp`, subscribes with client-individual
acknowledgements, receives and acknowledges what a stomp.py client sends over TCP, and sends
back, plainly and in transactions (one committed, one aborted)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import stomp

from browser.conftest import NODE_MODULES, PAGES, StaticServer
from management.conftest import Managed, start_managed
from server.test_interop_stomppy import Collector
from waiting import wait_until

STOMPJS = NODE_MODULES / "@stomp" / "stompjs" / "bundles" / "stomp.umd.min.js"
TO_BROWSER = "/queue/to.browser"
TO_TCP = "/queue/to.tcp"


@pytest.fixture
def page_server(
    static_server: Callable[[Mapping[str, Path]], StaticServer],
) -> StaticServer:
    return static_server({"/stomp.html": PAGES / "stomp.html", "/js/stomp.umd.min.js": STOMPJS})


@pytest.fixture
def broker(page_server: StaticServer) -> Iterator[Managed]:
    # The page comes from another origin than the broker's: it must be allowed.
    running = start_managed(http={"ws_allowed_origins": [page_server.origin]})
    try:
        yield running
    finally:
        running.stop()


def _page(driver: Any) -> dict[str, Any]:
    return driver.execute_script("return JSON.parse(JSON.stringify(window.page));")  # type: ignore[no-any-return]


def test_stompjs_in_chromium_exchanges_with_stomp_py_over_tcp(
    chromium: Any, page_server: StaticServer, broker: Managed, tmp_path: Path
) -> None:
    conn = stomp.Connection12([("127.0.0.1", broker.broker.port)])
    tcp = Collector()
    conn.set_listener("collector", tcp)
    conn.connect(wait=True)
    try:
        conn.subscribe(TO_TCP, id="t", ack="client-individual", receipt="tsub")
        tcp.receipt("tsub")
        query = urllib.parse.urlencode(
            {"broker": f"ws://127.0.0.1:{broker.server.port}/stomp", "subscribe": TO_BROWSER}
        )
        chromium.get(page_server.url(f"/stomp.html?{query}"))
        wait_until(lambda: _page(chromium)["connected"], what="stompjs connected")
        page = _page(chromium)
        assert (page["protocol"], page["version"]) == ("v12.stomp", "1.2")

        # stomp.py on TCP to the browser, which acknowledges each one.
        for n in range(3):
            conn.send(TO_BROWSER, f"to browser {n}", receipt=f"s{n}")
            tcp.receipt(f"s{n}")
        wait_until(lambda: len(_page(chromium)["received"]) == 3, what="three messages")
        assert [m["body"] for m in _page(chromium)["received"]] == [
            f"to browser {n}" for n in range(3)
        ]

        def to_browser_settled() -> bool:
            items = broker.http.get("/api/destinations").json["items"]
            queue = next(item for item in items if item["name"] == TO_BROWSER)
            return queue["messages_ready"] == 0 and queue["messages_in_flight"] == 0

        wait_until(to_browser_settled, what="the browser's acknowledgements")

        # The browser to stomp.py: plainly, then a transaction aborted and one committed.
        chromium.execute_script(f"page.send({json.dumps(TO_TCP)}, ['from browser']);")
        chromium.execute_script(
            f"page.sendInTransaction({json.dumps(TO_TCP)}, ['aborted'], false);"
            f"page.sendInTransaction({json.dumps(TO_TCP)}, ['tx 1', 'tx 2'], true);"
        )
        bodies = []
        for _ in range(3):
            frame = tcp.message()
            conn.ack(frame.headers["ack"])
            bodies.append(frame.body)
        assert bodies == ["from browser", "tx 1", "tx 2"]
        wait_until(lambda: "r-from browser" in _page(chromium)["receipts"], what="the receipt")
        assert _page(chromium)["errors"] == []

        chromium.save_screenshot(str(tmp_path / "stompjs.png"))
        assert (tmp_path / "stompjs.png").stat().st_size > 0
        listing = broker.http.get("/api/connections").json["items"]
        assert sorted(item["protocol"] for item in listing) == ["stomp-tcp", "stomp-ws"]
    finally:
        conn.disconnect()
