"""`sluice put` and `sluice get` as subprocesses: round trip, names, exit codes, a consumer killed
mid-stream, a producer killed mid-stream (live and transactional), through the journal store."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from conftest import RunningBroker
from sluice.client import BlockingClient
from waiting import wait_until

from .conftest import (
    JOURNAL_FILE_BYTES,
    Q,
    RawProducer,
    payload,
    run_cli,
    sha,
    start_cli,
)

BROKER_TOML = f"""
[store]
kind = "journal"
data_dir = "data"
journal_file_bytes = {JOURNAL_FILE_BYTES}
"""


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_put_then_get(jbroker: RunningBroker, tmp_path: Path) -> None:
    data = payload(3_000_000)
    source = tmp_path / "report.bin"
    source.write_bytes(data)
    state = tmp_path / "state"
    put = run_cli(
        "put",
        str(source),
        Q,
        "--broker",
        jbroker.address,
        "--chunk-size",
        "256KiB",
        "--state-dir",
        str(state),
    )
    assert put.returncode == 0, put.stderr
    assert f"sha256 {sha(data)}" in put.stderr
    assert "12 chunks" in put.stderr
    assert list(state.glob("*.json")) == []  # complete: nothing to resume
    out = tmp_path / "out"
    get = run_cli("get", Q, str(out), "--broker", jbroker.address, "--timeout", "5")
    assert get.returncode == 0, get.stderr
    assert (out / "report.bin").read_bytes() == data
    assert "sha256 ok" in get.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.bin"]  # no part, no records


def test_get_keeps_names_inside_its_directory(jbroker: RunningBroker, tmp_path: Path) -> None:
    names = ["../../escape.txt", "..\\..\\win.txt", "/etc/passwd", "\x01.hidden\n", "..", ""]
    with BlockingClient(jbroker.address) as client:
        for i, name in enumerate(names):
            client.send_stream(Q, f"body {i}".encode(), headers={"x-stream-name": name})
    out = tmp_path / "box" / "out"
    get = run_cli(
        "get",
        Q,
        str(out),
        "--broker",
        jbroker.address,
        "--count",
        str(len(names)),
        "--timeout",
        "5",
    )
    assert get.returncode == 0, get.stderr
    written = {p.name for p in out.iterdir()}
    assert {"escape.txt", "hidden", "passwd", "win.txt"} < written
    others = written - {"escape.txt", "hidden", "passwd", "win.txt"}
    assert len(others) == 2
    assert all(name.startswith("stream-") for name in others)
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == ["out"]
    assert (out / "passwd").read_bytes() == b"body 2"


def test_exit_codes(jbroker: RunningBroker, tmp_path: Path, refused_address: str) -> None:
    missing = run_cli("put", str(tmp_path / "nope"), Q, "--broker", jbroker.address)
    assert missing.returncode == 1
    assert _lines(missing.stderr) == [f"sluice put: {tmp_path / 'nope'}: No such file or directory"]
    usage = run_cli("put", "x", Q, "--chunk-size", "banana")
    assert usage.returncode == 2
    assert "--chunk-size" in usage.stderr
    assert run_cli("put", "x", Q, "--window", "0").returncode == 2
    assert run_cli("get", Q, "d", "--count", "-1").returncode == 2
    drained = run_cli(
        "get", Q, str(tmp_path / "o"), "--broker", jbroker.address, "--count", "0",
        "--timeout", "0.3",
    )  # fmt: skip
    assert drained.returncode == 0, drained.stderr
    empty = run_cli("get", Q, str(tmp_path / "o"), "--broker", jbroker.address, "--timeout", "0.3")
    assert empty.returncode == 1
    assert _lines(empty.stderr) == ["sluice get: no stream within 0.3 s (received 0 of 1)"]
    source = tmp_path / "f"
    source.write_bytes(b"x")
    down = run_cli("put", str(source), Q, "--broker", refused_address)
    assert down.returncode == 1
    assert len(_lines(down.stderr)) == 1


def test_get_refuses_a_resumed_stream_it_has_no_start_of(
    jbroker: RunningBroker, tmp_path: Path
) -> None:
    data = payload(40_000)
    with BlockingClient(jbroker.address) as client:
        client.send_stream(Q, data, chunk_size=10_000, headers={"x-stream-name": "a"})
        with client.stream_reader(Q) as reader:
            stream = reader.next_stream(timeout=5)
            assert stream is not None
            assert len(stream.read(10_000) + stream.read(5)) == 10_005
        # The reader left mid-stream: the stream resumes at offset 10000 (chunk 1).
    get = run_cli("get", Q, str(tmp_path / "o"), "--broker", jbroker.address, "--timeout", "5")
    assert get.returncode == 1
    assert "resumes at offset 10000" in get.stderr
    assert "holds no part of it" in get.stderr
    with BlockingClient(jbroker.address) as client, client.stream_reader(Q) as reader:
        stream = reader.next_stream(timeout=5)
        assert stream is not None
        assert stream.resumed_at == 10_000  # still there, for a get that has the start
        assert b"".join(stream) == data[10_000:]


def test_consumer_killed_mid_stream_is_finished_by_the_next(
    jbroker: RunningBroker, tmp_path: Path
) -> None:
    chunk = 64 * 1024
    data = payload(200 * chunk)
    with BlockingClient(jbroker.address) as client:
        client.send_stream(Q, data, chunk_size=chunk, headers={"x-stream-name": "big.bin"})
    out = tmp_path / "out"
    part = out / "big.bin.part"
    # One chunk of credit: every chunk waits for the previous one's ACK, so get is slow enough to
    # be killed mid-stream with chunks in flight.
    first = start_cli(
        "get", Q, str(out), "--broker", jbroker.address, "--prefetch-bytes", str(chunk)
    )
    try:
        wait_until(lambda: part.exists() and part.stat().st_size >= 2 * 1024 * 1024, what="part")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    written = part.stat().st_size
    assert written < len(data)
    second = run_cli("get", Q, str(out), "--broker", jbroker.address, "--timeout", "5")
    assert second.returncode == 0, second.stderr
    assert "resuming big.bin at offset" in second.stderr
    resumed_at = int(second.stderr.split("resuming big.bin at offset ")[1].split()[0])
    assert 0 < resumed_at <= written
    assert "sha256 ok" in second.stderr  # checked over the whole file, prefix included
    assert (out / "big.bin").read_bytes() == data
    assert not part.exists()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    work = tmp_path / "broker"
    work.mkdir()
    process = BrokerProcess(BROKER_TOML, work).start()
    try:
        yield process
    finally:
        process.kill()


def _stalled_put(process: BrokerProcess, source: Path, state: Path, *flags: str) -> dict[str, int]:
    """Start a put, let some chunks be receipted, freeze the broker, kill the put, thaw the
    broker. Returns the put's state file."""
    # One chunk at a time, each waiting for its journal sync: slow enough to be caught midway.
    put = start_cli(
        "put",
        str(source),
        Q,
        "--broker",
        f"127.0.0.1:{process.port}",
        "--chunk-size",
        "64KiB",
        "--window",
        "1",
        "--state-dir",
        str(state),
        *flags,
    )

    journal = process.workdir / "data" / "journal"

    def progressed() -> bool:
        if put.poll() is not None:
            raise AssertionError(f"put ended before it could be stopped: {put.returncode}")
        if "--transactional" in flags:
            # Its progress is not in the state file: look for a second journal file.
            return len(list(journal.glob("db-*.log"))) >= 2
        files = list(state.glob("*.json"))
        if not files:
            return False
        try:
            saved = json.loads(files[0].read_text())
        except ValueError:
            return False
        return bool(saved["next_seq"] >= 8)

    assert process.proc is not None
    try:
        wait_until(progressed, what="put progress")
        process.proc.send_signal(signal.SIGSTOP)
        put.send_signal(signal.SIGKILL)
        put.wait(10)
    finally:
        put.kill()
        process.proc.send_signal(signal.SIGCONT)
    saved: dict[str, int] = json.loads(next(state.glob("*.json")).read_text())
    return saved


@pytest.mark.crash
def test_put_killed_mid_stream_continues_without_duplicates(
    broker_process: BrokerProcess, tmp_path: Path
) -> None:
    data = payload(48 * 1024 * 1024)
    source = tmp_path / "movie.bin"
    source.write_bytes(data)
    state = tmp_path / "state"
    address = f"127.0.0.1:{broker_process.port}"
    saved = _stalled_put(broker_process, source, state)
    again = run_cli(
        "put",
        str(source),
        Q,
        "--broker",
        address,
        "--chunk-size",
        "64KiB",
        "--state-dir",
        str(state),
    )
    assert again.returncode == 0, again.stderr
    assert f"continuing stream {saved['stream_id']} at chunk" in again.stderr
    out = tmp_path / "out"
    get = run_cli("get", Q, str(out), "--broker", address, "--timeout", "5")
    # The first put's death aborted the stream; the second continued it where it stopped. Any
    # chunk sent twice would be out of place and make get fail.
    assert get.returncode == 0, get.stderr
    assert "aborted by the broker" in get.stderr
    assert (out / "movie.bin").read_bytes() == data
    assert "sha256 ok" in get.stderr


@pytest.mark.crash
def test_transactional_put_killed_leaves_nothing_then_sends_whole(
    broker_process: BrokerProcess, tmp_path: Path
) -> None:
    data = payload(48 * 1024 * 1024)
    source = tmp_path / "ledger.bin"
    source.write_bytes(data)
    state = tmp_path / "state"
    address = f"127.0.0.1:{broker_process.port}"
    _stalled_put(broker_process, source, state, "--transactional")
    out = tmp_path / "out"
    nothing = run_cli("get", Q, str(out), "--broker", address, "--timeout", "0.5")
    assert nothing.returncode == 1
    assert "no stream within" in nothing.stderr
    again = run_cli(
        "put",
        str(source),
        Q,
        "--broker",
        address,
        "--chunk-size",
        "64KiB",
        "--transactional",
        "--state-dir",
        str(state),
    )
    assert again.returncode == 0, again.stderr
    get = run_cli("get", Q, str(out), "--broker", address, "--timeout", "5")
    assert get.returncode == 0, get.stderr
    assert "aborted" not in get.stderr
    assert (out / "ledger.bin").read_bytes() == data


def test_get_drops_a_corrupt_stream(jbroker: RunningBroker, tmp_path: Path) -> None:
    raw = RawProducer(jbroker.port)
    try:
        raw.chunk("S", 0, 0, b"0123456789", x_stream_name="bad.bin")
        raw.chunk("S", 1, 10, b"abc", end=b"something else", x_stream_name="bad.bin")
    finally:
        raw.close()
    out = tmp_path / "out"
    get = run_cli("get", Q, str(out), "--broker", jbroker.address, "--timeout", "0.5")
    assert get.returncode == 1
    assert "SHA-256" in get.stderr
    assert "bad.bin.part deleted" in get.stderr
    assert sorted(p.name for p in out.iterdir()) == []
