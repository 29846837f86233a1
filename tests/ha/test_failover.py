"""Master/slave on one data directory with real broker processes: the slave waits without
listening and stops at once on SIGTERM; a master killed with SIGKILL under load from producers and
consumers (our client, with both addresses) is replaced by the slave, and every receipted message
is delivered, none twice unless flagged redelivered; a master frozen (SIGSTOP) past its lease and
then resumed writes nothing and exits, and the lease's epoch grows. The 100-failover loop is
behind --run-slow (its numbers are in docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from ha.harness import Load, first_file_of, ha_pair, listening_ports, run_failovers

pytestmark = pytest.mark.crash


def test_slave_waits_without_listening_and_stops_at_once(tmp_path: Path) -> None:
    with ha_pair(tmp_path, lease_s=10) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log(f"waiting for the lease on .* held by .*:{master.pid}:")
        assert listening_ports(slave.pid) == set()
        assert pair.ports["a"] in listening_ports(master.pid)
        started = time.monotonic()
        assert slave.stop() == 0
        assert time.monotonic() - started < 5.0
        assert "stopped while waiting for the lease" in slave.log_text
        # master-only never waits: it says who holds the lease and exits.
        other = pair.launch("c", "--ha-role", "master-only")
        assert other.proc is not None
        assert other.proc.wait(30) == 1
        other.stop()
        assert "is held by another broker (ha.role = master-only)" in other.log_text
        # The master went on undisturbed, and gives the lease up when it stops.
        assert pair.lease().holder.split(":")[1] == str(master.pid)
        assert master.stop() == 0
        assert pair.lease().released


def test_sigkill_of_the_master_under_load(tmp_path: Path) -> None:
    lease_s = 5.0
    with ha_pair(tmp_path, lease_s) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log("waiting for the lease")

        async def scenario() -> tuple[float, float]:
            load = Load(pair.brokers, producers=3, consumers=2)
            try:
                await load.ledger.wait_receipted(300)
                killed_at = time.monotonic()
                master.kill()
                await asyncio.to_thread(slave.wait_listening, 30)
                takeover_s = time.monotonic() - killed_at
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 300)
                client_s = load.ledger.first_receipt_after(killed_at) - killed_at
                ledger = await load.finish()
            except BaseException:
                await load.cancel()
                raise
            ledger.check()
            return takeover_s, client_s

        takeover_s, client_s = asyncio.run(scenario())
        print(f"failover: takeover {takeover_s:.2f} s, first receipt {client_s:.2f} s")
        # Its process gone, the old master writes nothing more: the files are taken as they are.
        assert "is gone (its process ended)" in slave.log_text
        assert "copies now" not in slave.log_text
        assert takeover_s < lease_s + 3
        assert pair.lease().epoch == 2
        assert slave.stop() == 0


def _digests(files: dict[int, Path], below: int) -> dict[int, str]:
    return {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items() if n < below}


def test_frozen_master_resumed_after_takeover_writes_nothing(tmp_path: Path) -> None:
    lease_s = 3.0
    with ha_pair(tmp_path, lease_s) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log("waiting for the lease")

        async def scenario() -> None:
            load = Load(pair.brokers, producers=2, consumers=1)
            try:
                await load.ledger.wait_receipted(200)
                frozen_at = time.monotonic()
                os.kill(master.pid, signal.SIGSTOP)
                await asyncio.to_thread(slave.wait_listening, 30)
                takeover_s = time.monotonic() - frozen_at
                print(f"failover from a frozen master: takeover {takeover_s:.2f} s")
                assert takeover_s < lease_s + 3, slave.log_text
                # What the old master wrote is in files below the new master's first one;
                # nothing may change them once it has taken over.
                before = _digests(pair.journal_files(), first_file_of(slave))
                assert before
                os.kill(master.pid, signal.SIGCONT)
                assert await asyncio.to_thread(master.proc.wait, 30) == 3  # type: ignore[union-attr]
                assert _digests(pair.journal_files(), first_file_of(slave)) == before
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 200)
                ledger = await load.finish()
            except BaseException:
                await load.cancel()
                raise
            ledger.check()

        asyncio.run(scenario())
        assert "lost the lease" in master.log_text
        # Taken over unrenewed: the old master may have woken, so it was cut off from the files.
        assert "the journal's newest file and the index are copies now" in slave.log_text
        assert "exiting at once without writing" in master.log_text
        lease = pair.lease()
        assert lease.epoch == 2
        assert lease.holder.split(":")[1] == str(slave.pid)
        assert slave.stop() == 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_hundred_failovers(tmp_path: Path) -> None:
    lease_s = 5.0
    rounds = 100
    with ha_pair(tmp_path, lease_s) as pair:
        run = run_failovers(pair, rounds)
        print(run.summary(f"SIGKILL, lease_s {lease_s:g}"))
        run.ledger.check()
        assert pair.lease().epoch == rounds + 1
        assert max(run.takeovers) < lease_s + 3
        assert run.master.stop() == 0
