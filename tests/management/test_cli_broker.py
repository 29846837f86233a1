"""`sluice broker` serves the management server on `--http` (or `[http]`), says where, and
stops it with the broker; `--no-http` leaves it out."""

from __future__ import annotations

import re
from pathlib import Path

from brokerproc import BrokerProcess

from .conftest import Http

_HTTP_LINE = re.compile(r"management API on http://127\.0\.0\.1:(\d+)/")


def test_broker_serves_http_and_stops_it(tmp_path: Path) -> None:
    broker = BrokerProcess('[store]\nkind = "memory"\n', tmp_path, "--http", "127.0.0.1:0")
    broker.start()
    try:
        match = _HTTP_LINE.search(broker.log_text)
        assert match, broker.log_text
        http = Http(int(match.group(1)))
        assert http.get("/healthz").json == {"status": "ok"}
        assert http.get("/readyz").status == 200
        assert http.get("/api/overview").json["store"]["kind"] == "memory"
    finally:
        assert broker.stop() == 0
    assert "Traceback" not in broker.log_text


def test_no_http(tmp_path: Path) -> None:
    broker = BrokerProcess('[store]\nkind = "memory"\n', tmp_path, "--no-http")
    broker.start()
    try:
        assert "management API" not in broker.log_text
    finally:
        assert broker.stop() == 0
