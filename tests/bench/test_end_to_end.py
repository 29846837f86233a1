"""`sluice bench` against a real Sluice broker on port 0, worker processes and all."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from conftest import RunningBroker
from sluice.cli import main


def _run(broker: RunningBroker, tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "result.json"
    code = main(["bench", *argv, "--broker", broker.address, "--json", str(out), "--timeout", "60"])
    return code, json.loads(out.read_text())


def test_throughput_one_producer_one_consumer(
    broker: RunningBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The broker runs in this process, on a thread of its own.
    code, document = _run(
        broker,
        tmp_path,
        *("throughput", "--count", "2000", "--size", "256", "--warmup", "100"),
        *("--broker-pid", str(os.getpid()), "--drain-grace", "0.2"),
    )
    results = document["results"]
    assert isinstance(results, dict)
    assert code == 0, results
    assert results["ok"]
    assert results["messages"] == 2000
    assert results["verification"]["expected"] == 2100
    assert results["verification"]["duplicates"] == 0
    assert results["messages_per_s"] > 0
    assert results["latency_ms"]["count"] == 2000
    assert results["receipt_latency_ms"]["count"] == 20
    assert document["scenario"] == "throughput"
    assert "passcode" not in document["options"]
    verification = results["verification"]
    assert verification["queue_checked"] is True
    assert verification["late_duplicates"] == verification["left_queued"] == 0
    assert results["queue_checks"][0]["drained"] == 0
    assert results["receipt_every"] == 100
    for window in ("measured", "run"):
        cpu = results["cpu"][window]
        assert cpu["wall_s"] > 0
        assert cpu["broker"]["pid"] == os.getpid()
        assert cpu["broker"]["cpu_s"] > 0
        assert cpu["broker"]["us_per_msg"] > 0
        assert cpu["generator"]["cpu_s"] > 0
        names = [p["name"] for p in cpu["generator"]["processes"]]
        assert names == ["consumers-0", "producers-0", "coordinator"]
    assert results["cpu"]["measured"]["messages"] == 2000
    assert results["cpu"]["run"]["messages"] == 2100
    out = capsys.readouterr().out
    assert "exactly once" in out
    assert "and the queue was empty afterwards" in out
    assert "broker CPU (measured" in out


def test_sync_with_persistent_messages(
    broker: RunningBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, document = _run(
        broker,
        tmp_path,
        *("sync", "--producers", "2", "--count", "200", "--warmup", "10", "--persistent"),
        *("--broker-pid", str(os.getpid()), "--drain-grace", "0.2"),
    )
    results = document["results"]
    assert isinstance(results, dict)
    assert code == 0, results
    assert results["receipt_latency_ms"]["count"] == 200
    assert results["sent"] == 200
    assert results["sends_per_s"] > 0
    # Each synchronous producer in a process of its own.
    assert results["process_per_producer"] is True
    assert results["processes"] == {"consumers": 1, "producers": 2}
    names = [p["name"] for p in results["cpu"]["measured"]["generator"]["processes"]]
    assert names == ["consumers-0", "producers-0", "producers-1", "coordinator"]
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("sent ", "received ")))
    assert lines[first].startswith("sent 200 messages")
    assert "from the first send to the last receipt" in lines[first]


def test_sync_at_a_rate(broker: RunningBroker, tmp_path: Path) -> None:
    code, document = _run(
        broker,
        tmp_path,
        *("sync", "--producers", "2", "--count", "100", "--rate", "500", "--persistent"),
        *("--drain-grace", "0.2"),
    )
    results = document["results"]
    assert code == 0, results
    assert results["rate_per_s"] == 500
    assert results["receipt_latency_ms"]["count"] == 100
    # 100 messages at 500 msg/s take at least the timetable's 0.2 s (less one interval).
    assert results["send_elapsed_s"] >= 0.19
    assert 0 <= results["late_sends"] <= 100


def test_connections_round_trip(broker: RunningBroker, tmp_path: Path) -> None:
    code, document = _run(
        broker,
        tmp_path,
        "connections",
        "--connections",
        "20",
        "--duration",
        "1",
        # 1,000 messages: enough broker CPU to span several 10 ms clock ticks.
        "--rate-per-connection",
        "50",
        "--broker-pid",
        str(os.getpid()),
    )
    results = document["results"]
    assert isinstance(results, dict)
    assert code == 0, results
    assert results["established"] == results["held"] == 20
    assert results["received"] == results["sent"] > 0
    assert results["broker_rss_kib"]["before"] > 0
    assert results["markers_missing"] == 0
    assert results["duplicates"] == results["reordered"] == 0
    assert results["cpu"]["measured"]["broker"]["cpu_s"] > 0
    assert results["cpu"]["measured"]["messages"] == results["received"]
    assert results["cpu"]["connect"]["generator"]["cpu_s"] > 0


def test_unreachable_broker_fails_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(["bench", "throughput", "--count", "10", "--broker", f"127.0.0.1:{port}"])
    assert code == 1
    assert "refused" in capsys.readouterr().err.lower()


def test_timeout_ends_the_run_with_exit_1(
    broker: RunningBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    argv = ["bench", "throughput", "--count", "10000000", "--size", "64", "--timeout", "1.5"]
    code = main([*argv, "--broker", broker.address, "--json", str(out)])
    assert code == 1
    assert "timed out" in capsys.readouterr().err
    results = json.loads(out.read_text())["results"]
    assert not results["ok"]
    # What did arrive before the deadline was still verified: nothing twice.
    assert results["verification"]["duplicates"] == 0
