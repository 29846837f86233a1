"""`sluice admin` on a queue's messages, run as a user runs it (a subprocess) against a broker's
management API: send, count and search, move and copy with a dry run first, delete by id, retry
dead letters, and the usage errors that keep `--all` from being a default."""

from __future__ import annotations

import json
from pathlib import Path

from server.test_interop_stomppy import _connect, _subscribe

from .conftest import Managed
from .test_cli_admin import admin


def test_send_search_move_copy_delete_retry(managed: Managed, tmp_path: Path) -> None:
    for i in range(6):
        code, out, err = admin(
            managed, "send", "/queue/in", f"m{i}", "-H", f"k:{'ab'[i % 2]}", "--persistent"
        )
        assert code == 0, err
        assert out.startswith("sent ID:")
        assert out.strip().endswith(" to /queue/in")

    code, out, _ = admin(managed, "count", "/queue/in", "-H", "k:a")
    assert (code, out.strip()) == (0, "3 messages of /queue/in match (3 waiting, 0 in flight)")
    code, out, _ = admin(managed, "browse", "/queue/in", "--selector", "k = 'b'")
    assert code == 0
    assert [line.split()[-1] for line in out.splitlines()[1:]] == ["m1", "m3", "m5"]

    code, out, _ = admin(
        managed, "move", "/queue/in", "/queue/out", "--selector", "k = 'a'", "--dry-run"
    )
    assert (code, out.splitlines()) == (
        0,
        ["would move 3 of 3 matching messages of /queue/in", "  3 to /queue/out"],
    )
    code, out, _ = admin(managed, "move", "/queue/in", "/queue/out", "--selector", "k = 'a'")
    assert out.splitlines()[0] == "moved 3 of 3 matching messages of /queue/in"
    code, out, _ = admin(managed, "--json", "copy", "/queue/out", "/queue/copies", "--all")
    assert json.loads(out)["copied"] == 3

    code, out, _ = admin(managed, "--json", "browse", "/queue/in")
    first = json.loads(out)["items"][0]["message_id"]
    code, out, _ = admin(managed, "delete-messages", "/queue/in", "--id", first)
    assert out.splitlines()[0] == "deleted 1 of 1 matching messages of /queue/in"
    code, out, _ = admin(managed, "--json", "count", "/queue/in")
    assert json.loads(out)["count"] == 2

    # Dead letters go back where their header says; the others stay, and say why.
    code, _, _ = admin(
        managed, "send", "/queue/DLQ.back", "d", "-H", "x-original-destination:/queue/back"
    )
    assert code == 0
    code, out, _ = admin(managed, "retry", "/queue/DLQ.back", "--all")
    assert out.splitlines() == [
        "retried 1 of 1 matching messages of /queue/DLQ.back",
        "  1 to /queue/back",
    ]
    code, out, _ = admin(managed, "retry", "/queue/in", "--all")
    assert out.splitlines() == [
        "retried 0 of 2 matching messages of /queue/in",
        "  2 skipped: no x-original-destination header",
    ]

    payload = tmp_path / "payload.bin"
    payload.write_bytes(bytes(range(256)) * 10)
    code, _, err = admin(managed, "send", "/queue/files", "--file", str(payload))
    assert code == 0, err

    conn, col = _connect(managed.broker.port)
    _subscribe(conn, col, "/queue/out", "o", "auto")
    assert sorted(col.message().body for _ in range(3)) == ["m0", "m2", "m4"]
    _subscribe(conn, col, "/queue/back", "b", "auto")
    back = col.message()
    assert back.body == "d"
    assert "x-original-destination" not in back.headers
    _subscribe(conn, col, "/queue/files", "f", "auto")
    assert col.message().headers["content-length"] == str(2560)
    conn.disconnect()

    for args in (
        ("delete-messages", "/queue/in"),
        ("delete-messages", "/queue/in", "--all", "--selector", "k = 'a'"),
        ("move", "/queue/in", "out", "--all"),
        ("send", "/queue/in", "x", "-H", "nocolon"),
        ("send", "/queue/in", "--priority", "10"),
    ):
        code, _, err = admin(managed, *args)
        assert code == 2, (args, err)
    code, _, err = admin(managed, "delete-messages", "/queue/in", "--selector", "k =")
    assert code == 1
    assert "(invalid_selector, HTTP 400)" in err[0]
