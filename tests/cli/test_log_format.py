"""`sluice broker --log-format json`: every line the broker writes on standard error is one
JSON object with `ts`, `level`, `logger` and `message`, and a connection's lines carry its
`connection_id` (the management API's), `session`, `peer` and `user`; an operator's change
carries the operator. The formatter alone: extras, tracebacks, and nothing on a second line."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from brokerproc import BrokerProcess
from management.conftest import Http
from rawstomp import RawStomp
from sluice.cli.logformat import JsonFormatter
from waiting import wait_until

_HTTP = re.compile(r"management API on http://127\.0\.0\.1:(\d+)/")


def _lines(broker: BrokerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in broker.stderr_lines if line.strip()]


def test_the_broker_logs_one_json_object_per_line(tmp_path: Path) -> None:
    broker = BrokerProcess(
        '[store]\nkind = "memory"\n',
        tmp_path,
        "--http",
        "127.0.0.1:0",
        "--log-format",
        "json",
    )
    broker.start()
    try:
        match = _HTTP.search(broker.log_text)
        assert match, broker.log_text
        http = Http(int(match.group(1)))
        client = RawStomp(broker.port)
        client.connect()
        (view,) = http.get("/api/connections").json["items"]
        assert http.delete(f"/api/connections/{view['id']}").status == 200
        wait_until(lambda: "connection closed by an operator" in broker.log_text, what="a close")
        # A peer that sends garbage before CONNECT is logged with its address, not yet an id.
        garbage = RawStomp(broker.port)
        garbage.send(b"NOT A FRAME\n\n\0")
        wait_until(lambda: "closing after error" in broker.log_text, what="an error")
        client.sock.close()
        garbage.sock.close()
    finally:
        assert broker.stop() == 0
    lines = _lines(broker)
    for line in lines:
        assert {"ts", "level", "logger", "message"} <= set(line), line
        assert set(line) <= {
            "ts",
            "level",
            "logger",
            "message",
            "connection_id",
            "session",
            "peer",
            "user",
            "exception",
        }
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line["ts"])
    messages = [line["message"] for line in lines]
    assert any(m.startswith("sluice management API on http://") for m in messages)
    assert any(" listening on 127.0.0.1:" in m for m in messages)
    (closed,) = [line for line in lines if line["message"].startswith("closing: connection")]
    assert closed["connection_id"] == view["id"]
    assert closed["user"] == "anonymous"
    assert closed["peer"] == view["address"]
    assert not closed["message"].startswith("[")  # the fields, not the text's prefix
    (operator,) = [line for line in lines if line["message"].startswith("management API: user")]
    assert (operator["user"], operator["peer"]) == ("anonymous", "127.0.0.1")
    before_connect = [
        line
        for line in lines
        if line["message"].startswith("closing after error") and "connection_id" not in line
    ]
    assert before_connect
    assert all(line["peer"].startswith("127.0.0.1:") for line in before_connect)
    assert "Traceback" not in broker.log_text


def test_the_formatter_keeps_to_its_fields_on_one_line() -> None:
    formatter = JsonFormatter()
    try:
        raise ValueError("two\nlines")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "sluice.x", logging.ERROR, __file__, 1, "[7 peer] failed: %s", ("a\nb",), exc_info
    )
    record.log_prefix = "[7 peer] "
    record.connection_id = 42
    record.peer = "10.0.0.7:51866"
    record.unrelated = "left out"
    text = formatter.format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert line["message"] == "failed: a\nb"
    assert (line["level"], line["logger"], line["connection_id"]) == ("ERROR", "sluice.x", 42)
    assert line["peer"] == "10.0.0.7:51866"
    assert "ValueError: two" in line["exception"]
    assert "unrelated" not in line
