"""`sluice broker --store memory|journal --data DIR`: the flags win over the configuration file,
and a journal broker keeps what `sluice send --persistent` was told is stored, across a kill;
`--latency-hops-file` reports on SIGUSR1 and at stop."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from brokerproc import BrokerProcess
from sluice.client import BlockingClient
from waiting import wait_until

from .conftest import sluice, stderr_lines

# Small journal files: quick to preallocate.
SMALL_FILES = "journal_file_bytes = 4194304\n"


def _address(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.port}"


def test_journal_flags_keep_a_persistent_message_across_a_kill(tmp_path: Path) -> None:
    data = tmp_path / "flag-data"
    # The file says memory and another directory: the flags decide.
    config = f'[store]\nkind = "memory"\ndata_dir = "{tmp_path / "file-data"}"\n{SMALL_FILES}'
    args = ("--store", "journal", "--data", str(data))
    first = BrokerProcess(config, tmp_path, *args).start()
    try:
        assert f"data: {data}" in first.log_text
        kept = sluice("send", "/queue/kept", "kept", "--persistent", "--broker", _address(first))
        assert kept.returncode == 0, kept.stderr
        lost = sluice("send", "/queue/kept", "not persistent", "--broker", _address(first))
        assert lost.returncode == 0, lost.stderr
    finally:
        # SIGKILL: the RECEIPT that `send --persistent` waited for means the message is on disk.
        first.kill()
    assert (data / "journal").is_dir()
    assert not (tmp_path / "file-data").exists()

    second = BrokerProcess(config, tmp_path, *args).start()
    try:
        got = sluice("recv", "/queue/kept", "--broker", _address(second), "--timeout", "10")
        assert got.returncode == 0, got.stderr
        assert got.stdout == b"kept\n"
        # The non-persistent one was in memory only.
        none = sluice("recv", "/queue/kept", "--broker", _address(second), "--timeout", "0.5")
        assert none.returncode == 1
    finally:
        assert second.stop() == 0


def test_memory_flag_wins_over_a_journal_configuration(tmp_path: Path) -> None:
    config = f'[store]\nkind = "journal"\ndata_dir = "{tmp_path / "data"}"\n{SMALL_FILES}'
    first = BrokerProcess(config, tmp_path, "--store", "memory").start()
    try:
        assert "(store: memory)" in first.log_text
        sent = sluice("send", "/queue/m", "gone", "--persistent", "--broker", _address(first))
        assert sent.returncode == 0, sent.stderr
    finally:
        assert first.stop() == 0
    assert not (tmp_path / "data").exists()

    second = BrokerProcess(config, tmp_path, "--store", "memory").start()
    try:
        got = sluice("recv", "/queue/m", "--broker", _address(second), "--timeout", "0.5")
        assert got.returncode == 1
        assert stderr_lines(got) == ["sluice recv: no message within 0.5 s"]
    finally:
        assert second.stop() == 0


def test_unknown_store_is_a_usage_error(tmp_path: Path) -> None:
    result = sluice("broker", "--store", "paper", "--stomp", "127.0.0.1:0")
    assert result.returncode == 2
    assert "argument --store" in stderr_lines(result)[-1]


def test_a_broker_whose_stop_hangs_still_exits_soon_after_sigterm(tmp_path: Path) -> None:
    # Whatever holds the stop up (a writer stuck in the kernel on a failing disk, here a stop
    # that never returns), SIGTERM ends the process within SHUTDOWN_TIMEOUT_S, as a crash.
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import sys, time\n"
        "from sluice import cli\n"
        "from sluice.server.listener import BrokerServer\n"
        "async def stop(self):\n"
        "    time.sleep(3600)\n"
        "BrokerServer.stop = stop\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    config = f'[store]\nkind = "journal"\ndata_dir = "{tmp_path / "data"}"\n{SMALL_FILES}'
    broker = BrokerProcess(config, tmp_path)
    broker.args[1:3] = [str(hang)]  # the script instead of -m sluice
    broker.start()
    assert broker.proc is not None
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    broker.proc.wait(30)
    took = time.monotonic() - started
    assert broker.stop() == 1  # already gone: this only collects the rest of its log
    assert took < 10.0, took
    assert "did not stop within 8 s; exiting now" in broker.log_text


def test_latency_hops_are_reported_on_sigusr1_and_at_stop(tmp_path: Path) -> None:
    config = f'[store]\nkind = "journal"\ndata_dir = "{tmp_path / "data"}"\n{SMALL_FILES}'
    report = tmp_path / "hops.json"
    broker = BrokerProcess(config, tmp_path, "--latency-hops-file", str(report)).start()
    try:
        with BlockingClient(_address(broker)) as client:
            for i in range(5):
                client.send("/queue/hops", b"%d" % i, persistent=True)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGUSR1)
        wait_until(report.exists, what="the report written on SIGUSR1")
        assert json.loads(report.read_text())["sends"] == 5
        with BlockingClient(_address(broker)) as client:
            client.send("/queue/hops", b"one more", persistent=True)
    finally:
        assert broker.stop() == 0
    assert json.loads(report.read_text())["sends"] == 6
    assert "latency of 6 persistent SENDs" in broker.log_text
    assert "fsync" in broker.log_text
