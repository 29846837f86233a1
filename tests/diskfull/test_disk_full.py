"""A full disk, for real: brokers in subprocesses with their data on a small tmpfs or a loop-mounted
ext4, persistent 64 KiB sends with receipts through real sockets.

The first test is the scenario of the wedge once reported (a 200 MiB tmpfs, the default
configuration): the producer used to get neither a RECEIPT nor an ERROR while the preallocator
spun at 100 % CPU and SIGTERM was ignored. The others show the policy: `block` pauses producers
and resumes them by itself once consumers have drained and collection has freed files; `error`
refuses with the limit named; a broker stops within 10 s whatever its disk; a start on a disk too
small says so in one line. In every case each receipted message is delivered exactly once.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from diskfull.helpers import (
    BODY_BYTES,
    PRODUCERS,
    QUEUE,
    MiB,
    Produced,
    cpu_seconds,
    drain,
    free_bytes,
    produce_sluice,
    start_broker,
    stop_within,
    wait_for_log,
)

SMALL_FILES = "journal_file_bytes = 4194304"  # 4 MiB: a 64 MiB disk holds a dozen
STOP_LIMIT_S = 10.0


def _fill(mount: Path, leave_bytes: int = 0) -> Path:
    """Take the disk's free space, all of it or all but `leave_bytes`, with a filler file."""
    filler = mount / "filler"
    chunk = b"\xff" * MiB
    with open(filler, "wb") as f:
        while free_bytes(mount) > leave_bytes + len(chunk):
            try:
                f.write(chunk)
                f.flush()
            except OSError:
                break
        try:
            while free_bytes(mount) > leave_bytes:
                f.write(chunk[:4096])
                f.flush()
        except OSError:
            pass
    return filler


def _check_exactly_once(seen: list[int], produced: Produced, *, maybe: set[int]) -> None:
    """Every receipted index delivered once; anything else delivered only from `maybe` (a send
    that was taken but whose receipt never came)."""
    assert len(seen) == len(set(seen)), "a message was delivered twice"
    missing = set(produced.receipted) - set(seen)
    assert not missing, f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:5]}"
    extra = set(seen) - set(produced.receipted)
    assert extra <= maybe, f"unexpected messages {sorted(extra)[:5]}"


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_the_reported_wedge_a_full_200mib_tmpfs(
    small_fs: Callable[..., Path], tmp_path: Path, client: str
) -> None:
    mount = small_fs(200)
    data = mount / "data"
    broker = start_broker(tmp_path / "first", data)
    produce = PRODUCERS[client]
    # More than the disk holds: the producer must be held back, not wedged and not failed.
    produced = produce(broker.port, 200 * MiB // BODY_BYTES, stall_s=2.0)
    assert produced.error is None, produced.error
    assert produced.stalled_at is not None, "the disk never filled"
    assert len(produced.receipted) * BODY_BYTES > 64 * MiB
    wait_for_log(broker, "the store is full")
    assert "persistent producers are paused" in broker.log_text
    # Paused, not spinning: the broker idles while the producer waits.
    before = cpu_seconds(broker.pid)
    time.sleep(1.0)
    assert cpu_seconds(broker.pid) - before < 0.3
    code, took = stop_within(broker, STOP_LIMIT_S)
    assert code == 0, broker.log_text[-3000:]
    print(f"{client}: {len(produced.receipted)} receipted, stopped in {took:.2f} s")

    # The full disk starts again (it needs nothing new), and every receipted message is there.
    again = start_broker(tmp_path / "second", data)
    try:
        seen = drain(again.port, expect=len(produced.receipted))
    finally:
        assert stop_within(again, STOP_LIMIT_S)[0] == 0
    _check_exactly_once(seen, produced, maybe={produced.stalled_at})


def test_block_pauses_the_producer_until_consumers_free_the_disk(
    small_fs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = small_fs(64)
    broker = start_broker(tmp_path, mount / "data", SMALL_FILES)
    total = 100 * MiB // BODY_BYTES  # about twice what the disk holds
    results: list[Produced] = []
    producer = threading.Thread(
        target=lambda: results.append(produce_sluice(broker.port, total, stall_s=120.0))
    )
    producer.start()
    try:
        wait_for_log(broker, "the store is full")
        assert producer.is_alive()
        # The consumer drains; its acks are recorded, collection frees files, the producer
        # resumes by itself and finishes.
        seen = drain(broker.port, idle_s=10.0, expect=total)
        producer.join(120)
        assert not producer.is_alive()
        seen += drain(broker.port, idle_s=0.5)
    finally:
        producer.join(1)
        code, _ = stop_within(broker, STOP_LIMIT_S)
    assert code == 0
    (produced,) = results
    assert produced.error is None
    assert produced.stalled_at is None
    assert produced.receipted == list(range(total))
    _check_exactly_once(seen, produced, maybe=set())
    log = broker.log_text
    assert log.count("the store is full") >= 1
    assert "the store has room again" in log
    assert "journal gc: deleted" in log
    # The producer may fill the disk again before the consumer is done: an episode or more.
    summary = (
        r"disk while running: [1-9]\d* episodes of a full store \(\d+ of the temp store\), [1-9]"
    )
    assert re.search(summary, log), log[-2000:]


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_error_names_the_limit_and_keeps_what_was_receipted(
    small_fs: Callable[..., Path], tmp_path: Path, client: str
) -> None:
    mount = small_fs(64)
    broker = start_broker(tmp_path, mount / "data", f'{SMALL_FILES}\nstore_full = "error"')
    try:
        produced = PRODUCERS[client](broker.port, 100 * MiB // BODY_BYTES, stall_s=20.0)
        assert produced.stalled_at is None
        assert produced.error is not None
        assert "limit store.reserve_bytes=8388608 exceeded" in produced.error
        assert "the store is full" in produced.error
        seen = drain(broker.port, expect=len(produced.receipted))
        # Refused means not stored: nothing beyond what was receipted.
        _check_exactly_once(seen, produced, maybe=set())
        # Once collection has freed the drained files, sends are taken again.
        wait_for_log(broker, "the store has room again")
        later = PRODUCERS[client](broker.port, 20, stall_s=20.0, start=100_000)
        assert later.error is None
        assert len(later.receipted) == 20
        assert sorted(drain(broker.port, expect=20)) == later.receipted
    finally:
        assert stop_within(broker, STOP_LIMIT_S)[0] == 0


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_sigterm_stops_a_broker_on_a_disk_with_no_byte_free(
    small_fs: Callable[..., Path], tmp_path: Path, kind: str
) -> None:
    mount = small_fs(64, kind)
    data = mount / "data"
    broker = start_broker(tmp_path / "first", data, SMALL_FILES)
    produced = produce_sluice(broker.port, 100 * MiB // BODY_BYTES, stall_s=2.0)
    assert produced.stalled_at is not None
    # Something else takes every byte left, so the store's reserve is gone too; a consumer
    # acknowledges into what is left of the head file.
    filler = _fill(mount)
    assert free_bytes(mount) < MiB
    consumer = threading.Thread(target=drain, args=(broker.port,), kwargs={"idle_s": 1.0})
    consumer.start()
    time.sleep(1.0)  # let the broker meet the disk with nothing free: measures, acks, a GC
    code, took = stop_within(broker, STOP_LIMIT_S)
    consumer.join(30)
    assert code == 0, broker.log_text[-3000:]
    print(f"{kind}: stopped in {took:.2f} s with {free_bytes(mount)} bytes free")

    # Space back: a restart recovers from the journal; what was receipted and not acknowledged
    # by the consumer is still there, and nothing was lost.
    filler.unlink()
    again = start_broker(tmp_path / "second", data, SMALL_FILES)
    try:
        left = drain(again.port, idle_s=1.0)
    finally:
        assert stop_within(again, STOP_LIMIT_S)[0] == 0
    assert len(left) == len(set(left))
    assert set(left) <= set(produced.receipted) | {produced.stalled_at}


def test_space_freed_by_someone_else_resumes_the_producer(
    small_fs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = small_fs(64)
    broker = start_broker(tmp_path, mount / "data", SMALL_FILES)
    results: list[Produced] = []
    try:
        first = produce_sluice(broker.port, 20, stall_s=20.0)
        assert len(first.receipted) == 20
        # Something else takes the disk while the producer is idle; the broker sees it within
        # a measure. (A disk taken faster than that refuses the sends it has no room for, with
        # an ERROR: see tests/diskfull/test_io_errors.py.)
        filler = _fill(mount, leave_bytes=MiB)
        wait_for_log(broker, "the store is full")
        producer = threading.Thread(
            target=lambda: results.append(
                produce_sluice(broker.port, 200, stall_s=60.0, start=1000)
            )
        )
        producer.start()
        time.sleep(1.0)
        assert producer.is_alive()
        assert not results
        filler.unlink()
        producer.join(60)
        assert not producer.is_alive()
        wait_for_log(broker, "the store has room again")
        seen = drain(broker.port, expect=220)
    finally:
        assert stop_within(broker, STOP_LIMIT_S)[0] == 0
    (later,) = results
    assert later.error is None
    assert later.receipted == list(range(1000, 1200))
    both = Produced(receipted=first.receipted + later.receipted)
    _check_exactly_once(seen, both, maybe=set())


def test_a_start_on_a_disk_too_small_says_what_it_needs(
    small_fs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = small_fs(80)
    data = mount / "data"
    done = subprocess.run(
        [sys.executable, "-m", "sluice", "broker", "--data", str(data), "--stomp", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("sluice broker: not enough disk space to start: ")
    assert "has 80.0 MiB free, 160.0 MiB needed" in lines[0]
    assert "store.reserve_bytes=64.0 MiB" in lines[0]
    assert not any(data.rglob("db-*")), "the refused start left data files behind"
    assert QUEUE  # the queue the other tests use is not created here
