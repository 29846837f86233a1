"""The scripts under benchmarks/ still run against today's code: each is started small, as a user
would start it, and must finish and print its result line. (A script that broke when the code under
it changed would only be found by the next person measuring.)"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RunningBroker
from pgserver import unavailable_reason as pg_unavailable

ROOT = Path(__file__).resolve().parent.parent

SCRIPTS = [
    pytest.param(["broker_path.py", "--messages", "2000"], "us CPU per message", id="broker_path"),
    pytest.param(
        ["broker_path.py", "--messages", "1000", "--persistent", "--latency-hops"],
        "fsync",
        id="broker_path_hops",
    ),
    pytest.param(["stomp_codec.py", "--frames", "2000"], "encode:", id="stomp_codec"),
    pytest.param(
        [
            "gc_pauses.py",
            *("--backlog", "3000", "--size", "64", "--rate", "200", "--seconds", "1"),
            *("--churn", "5000"),
        ],
        "steady phase: longest loop stall",
        id="gc_pauses",
    ),
    pytest.param(
        ["journal_store.py", "adds", "--seconds", "0.2"], "adds/sync=", id="journal_store"
    ),
    pytest.param(["streams.py", "--size", "2MiB", "--no-kill"], "verified", id="streams"),
    pytest.param(
        ["postgres_store.py", "--seconds", "0.3", "--outstanding", "1,8"],
        "adds/batch=",
        id="postgres_store",
        # It starts a throwaway PostgreSQL server as the `postgres` user.
        marks=pytest.mark.skipif(pg_unavailable() is not None, reason=str(pg_unavailable())),
    ),
    pytest.param(
        ["tls_cost.py", "--count", "2000", "--runs", "1", "--connections", "20"],
        "connections (tls",
        id="tls_cost",
        # It makes its certificates with the openssl commands of docs/security.md.
        marks=pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
    ),
    pytest.param(
        [
            "metrics_cost.py",
            *("--runs", "1", "--count", "2000", "--warmup", "100"),
            *("--scrape-cost", "3", "--scrapes", "5"),
        ],
        "broker CPU median",
        id="metrics_cost",
    ),
    pytest.param(
        ["range_read_cost.py", "--rows", "2000"],
        "us/message",
        id="range_read_cost",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("pyspark") is None, reason="needs the spark extra"
        ),
    ),
    pytest.param(["machine.py"], "fsync", id="machine", marks=pytest.mark.slow),  # writes 1 GiB
    pytest.param(
        ["sync_crosscheck.py", "--runs", "1", "--producers", "2", "--count", "20"],
        "| sync-2 | sluice | stomppy | ",
        id="sync_crosscheck",
        marks=pytest.mark.slow,  # starts three brokers and measures the fsync rate twice
    ),
    pytest.param(
        ["restart.py", "--messages", "2000"],
        "disk_bytes_drained",
        id="restart",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("argv", "expected"), SCRIPTS)
def test_benchmark_script_runs(argv: list[str], expected: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if argv[0] in ("restart.py", "streams.py"):
        argv = [*argv, "--dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:]],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert expected in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--producers", "2", "--consumers", "1", "--count", "60"], id="sync"),
        pytest.param(
            ["--producers", "2", "--count", "40", "--rate", "400", "--consumer-ack", "auto"],
            id="rate",
        ),
        pytest.param(
            [
                *("--producers", "2", "--consumers", "2", "--count", "200"),
                *("--receipt-every", "10", "--window", "3", "--non-persistent"),
            ],
            id="windows",
        ),
    ],
)
def test_stomppy_load_runs(broker: RunningBroker, argv: list[str], tmp_path: Path) -> None:
    """The stomp.py generator against a broker of the test suite (it speaks to any broker)."""
    out = tmp_path / "load.json"
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "benchmarks" / "stomppy_load.py")),
            *("--port", str(broker.port), "--warmup", "3", "--idle-timeout", "5", *argv),
            *("--json", str(out)),
        ],
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "msg/s" in done.stdout, done.stdout[-3000:]
    summary = json.loads(out.read_text())
    assert summary["ok"]
    assert summary["producers"] == 2
    assert summary["messages_per_s"] > 0
    if "--window" in argv:
        # A receipt on every 10th send and each producer's last: 11 of each producer's 100.
        assert summary["receipt_latency_ms"]["count"] == 22
        assert summary["delivered_per_s"] > 0
        assert summary["consumed"]["unique"] == summary["consumed"]["expected"] == 206
    else:
        assert summary["receipt_latency_ms"]["count"] == summary["messages"]
    if "--consumers" in argv and "--window" not in argv:
        assert summary["consumed"] == {
            "expected": 66,
            "unique": 66,
            "duplicates": 0,
            "foreign": 0,
        }


def test_stomppy_load_reports_a_refused_connection(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "benchmarks" / "stomppy_load.py"), "--port", str(port)),
            *("--count", "5", "--timeout", "20"),
        ],
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "stomppy_load: producer 0: ConnectFailedException" in done.stderr
