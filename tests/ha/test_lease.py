"""`FileLease` in one process: taking, waiting, taking over, releasing, the fence, and lease files
that are not leases. Two `FileLease` objects on one directory behave as two brokers: their OS
locks are separate open files, which exclude each other as two processes' do."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sluice.errors import FencedError, LeaseError
from sluice.ha import FileLease, LeaseRecord
from sluice.ha.filelease import FENCE_FRACTION, LEASE_NAME
from waiting import wait_until


def _record(directory: Path) -> LeaseRecord:
    return LeaseRecord.decode((directory / LEASE_NAME).read_bytes(), "test")


def test_first_broker_takes_epoch_1_and_a_second_finds_it_held(tmp_path: Path) -> None:
    first = FileLease(tmp_path, 5.0)
    second = FileLease(tmp_path, 5.0)
    try:
        assert first.acquire() == 1
        assert first.is_held()
        assert first.has_os_lock
        first.check()
        record = _record(tmp_path)
        assert (record.holder, record.epoch, record.released) == (first.holder, 1, False)
        assert second.acquire(wait=False) is None
        assert not second.is_held()
        with pytest.raises(FencedError):
            second.check()
    finally:
        first.release()
        second.release()


def test_released_lease_is_taken_at_once_with_the_next_epoch(tmp_path: Path) -> None:
    first = FileLease(tmp_path, 30.0)
    assert first.acquire() == 1
    first.release()
    assert _record(tmp_path).released
    second = FileLease(tmp_path, 30.0)
    started = time.monotonic()
    try:
        assert second.acquire(wait=False) == 2
        assert time.monotonic() - started < 5.0
        assert second.took_over_from is not None
        assert second.took_over_from.holder == first.holder
        assert not second.previous_may_be_alive
    finally:
        second.release()


def test_unrenewed_lease_is_taken_over_and_the_old_holder_is_fenced(tmp_path: Path) -> None:
    lost: list[str] = []
    frozen = FileLease(tmp_path, 1.0, on_lost=lost.append)
    waiting = FileLease(tmp_path, 1.0)
    try:
        assert frozen.acquire() == 1
        frozen.renew()  # renewals change the record; none come after this one
        seen_at = time.monotonic()
        # The holder keeps its OS lock (as a stopped process does): the lease record decides.
        assert waiting.acquire() == 2
        assert time.monotonic() - seen_at >= 1.0
        assert not waiting.has_os_lock
        assert waiting.previous_may_be_alive
        # Long before the takeover, the old holder's own clock had ended its writes.
        assert not frozen.is_held()
        with pytest.raises(FencedError):
            frozen.check()
        with pytest.raises(FencedError):
            frozen.renew()
        assert lost
        assert "not renewed" in lost[0]
        assert _record(tmp_path).epoch == 2
    finally:
        frozen.release()
        waiting.release()
    # The old holder's release leaves the new holder's lease alone.
    assert _record(tmp_path).holder == waiting.holder


def test_renewal_finds_another_holder_and_loses(tmp_path: Path) -> None:
    lost: list[str] = []
    lease = FileLease(tmp_path, 10.0, on_lost=lost.append)
    try:
        assert lease.acquire() == 1
        other = LeaseRecord(holder="elsewhere:1:x", epoch=2, renewals=0, host="elsewhere", pid=1)
        (tmp_path / LEASE_NAME).write_bytes(other.encode())
        with pytest.raises(FencedError):
            lease.renew()
        assert lost == ["the lease file shows elsewhere:1:x at epoch 2"]
        with pytest.raises(FencedError):
            lease.check()
    finally:
        lease.release()
    assert _record(tmp_path).holder == "elsewhere:1:x"


def test_renewing_keeps_the_fence_open_past_the_lease_time(tmp_path: Path) -> None:
    lease_s = 2.0
    lease = FileLease(tmp_path, lease_s)
    try:
        lease.acquire()
        lease.start_renewing()
        started = time.monotonic()
        renewals = _record(tmp_path).renewals
        wait_until(lambda: _record(tmp_path).renewals >= renewals + 3, 20.0, "three renewals")
        assert time.monotonic() - started > FENCE_FRACTION * lease_s
        lease.check()
    finally:
        lease.release()


def test_fence_closes_by_the_holders_own_clock(tmp_path: Path) -> None:
    lease = FileLease(tmp_path, 1.0)
    try:
        lease.acquire()
        started = time.monotonic()
        wait_until(lambda: not lease.is_held(), 5.0, "the fence to close")
        assert time.monotonic() - started >= FENCE_FRACTION * 1.0 - 0.05
        with pytest.raises(FencedError):
            lease.check()
    finally:
        lease.release()


def test_holder_gone_from_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(gone.stdout)
    lease = FileLease(tmp_path, 60.0)
    dead = LeaseRecord(
        holder=f"{lease.host}:{pid}:x", epoch=7, renewals=3, host=lease.host, pid=pid
    )
    (tmp_path / LEASE_NAME).write_bytes(dead.encode())
    try:
        started = time.monotonic()
        assert lease.acquire() == 8
        assert not lease.previous_may_be_alive
        assert time.monotonic() - started < 5.0
    finally:
        lease.release()


def test_stop_ends_the_wait(tmp_path: Path) -> None:
    holder = FileLease(tmp_path, 60.0)
    waiter = FileLease(tmp_path, 60.0)
    stop = threading.Event()
    try:
        holder.acquire()
        timer = threading.Timer(0.3, stop.set)
        timer.start()
        started = time.monotonic()
        assert waiter.acquire(stop) is None
        assert time.monotonic() - started < 5.0
        timer.join()
        assert _record(tmp_path).holder == holder.holder
    finally:
        holder.release()
        waiter.release()


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b'{"holder": "x"}', b"{" + b" " * 5000 + b"}", b'{"epoch": true}'],
)
def test_a_file_that_is_not_a_lease_stops_the_start(tmp_path: Path, content: bytes) -> None:
    (tmp_path / LEASE_NAME).write_bytes(content)
    lease = FileLease(tmp_path, 5.0)
    try:
        with pytest.raises(LeaseError, match="not a lease"):
            lease.acquire(wait=False)
    finally:
        lease.release()
