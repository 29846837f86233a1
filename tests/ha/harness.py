"""Two brokers on one data directory (`[ha] role = "auto"`), clients that use both addresses, and
the ledger of what the clients saw, for the failover tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from brokerproc import BrokerProcess
from sluice.client import Client, ClientError
from sluice.ha import LeaseRecord
from sluice.ha.filelease import LEASE_NAME

QUEUE = "/queue/ha"

_CONFIG = """
[store]
data_dir = "{data}"
journal_file_bytes = 1048576
gc_interval_s = 3600
# A queue message goes to its consumer once it is written, not while it is (see "Concurrent store
# and dispatch" in docs/high-availability.md): else a master that dies between the two leaves a
# delivery the journal never had, and the resent message is delivered again unflagged.
concurrent_store_and_dispatch_queues = false

[heartbeat]
send_ms = 500
receive_ms = 500

[ha]
role = "auto"
lease_s = {lease_s}
"""

# The same on the PostgreSQL store: the lease is in its database; each broker has a data directory
# of its own for the temp store.
_PG_CONFIG = """
[store]
kind = "postgres"
url = "{url}"
schema = "{schema}"
data_dir = "{data}"
concurrent_store_and_dispatch_queues = false

[heartbeat]
send_ms = 500
receive_ms = 500

[ha]
role = "auto"
lease_s = {lease_s}
"""

# Clients notice a dead or frozen broker within a second or two, and come back quickly.
CLIENT_OPTIONS = {
    "heartbeat_ms": (500, 500),
    "connect_timeout_s": 2.0,
    "initial_reconnect_delay_s": 0.05,
    "max_reconnect_delay_s": 0.5,
    "receipt_timeout_s": 30.0,
}


def free_port() -> int:
    """A port free on 127.0.0.1 now (both brokers' addresses must be known before they listen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class HaPair:
    """Brokers `a` and `b` on one data directory, each on a port fixed in advance."""

    def __init__(
        self,
        root: Path,
        lease_s: float,
        postgres: tuple[str, str] | None = None,
        extra: str = "",
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.lease_s = lease_s
        # (url, schema) of a PostgreSQL store, instead of the journal on `data`.
        self.postgres = postgres
        # More TOML for both brokers' configuration.
        self.extra = extra
        self.ports = {"a": free_port(), "b": free_port()}
        self.procs: list[BrokerProcess] = []

    @property
    def brokers(self) -> str:
        """The addresses of `a` and `b`, for `Client.connect` and `--broker`."""
        return ",".join(f"127.0.0.1:{self.ports[name]}" for name in ("a", "b"))

    def launch(self, name: str, *extra_args: str) -> BrokerProcess:
        """Start broker `name` without waiting for it to listen."""
        workdir = self.root / f"{name}-{len(self.procs)}"
        workdir.mkdir()
        if self.postgres is not None:
            url, schema = self.postgres
            config = _PG_CONFIG.format(
                url=url, schema=schema, data=workdir / "data", lease_s=self.lease_s
            )
        else:
            config = _CONFIG.format(data=self.data, lease_s=self.lease_s)
        config += self.extra
        port = self.ports.setdefault(name, free_port())
        broker = BrokerProcess(config, workdir, "--stomp", f"127.0.0.1:{port}", *extra_args)
        self.procs.append(broker)
        return broker.launch()

    def lease(self) -> LeaseRecord:
        """The lease file as it is now."""
        return LeaseRecord.decode((self.data / LEASE_NAME).read_bytes(), "lease")

    def journal_files(self) -> dict[int, Path]:
        """The data files of the journal by number."""
        files = {}
        for path in (self.data / "journal").glob("db-*.log"):
            files[int(path.name[3:-4])] = path
        return files

    def cleanup(self) -> None:
        """Stop every broker started, frozen ones too."""
        for broker in self.procs:
            if broker.proc is not None and broker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(broker.pid, signal.SIGCONT)
                broker.kill()


@contextlib.contextmanager
def ha_pair(
    root: Path, lease_s: float, postgres: tuple[str, str] | None = None, extra: str = ""
) -> Iterator[HaPair]:
    pair = HaPair(root, lease_s, postgres, extra)
    try:
        yield pair
    finally:
        pair.cleanup()


def first_file_of(broker: BrokerProcess) -> int:
    """The data file a master started (its `journal store open ... head db-N.log` line)."""
    match = re.search(r"head db-(\d+)\.log", broker.log_text)
    assert match, broker.log_text
    return int(match.group(1))


@dataclass
class Ledger:
    """What the clients saw: every receipted body (and when), every delivery's redelivered flag."""

    receipted: dict[str, float] = field(default_factory=dict)
    deliveries: dict[str, list[bool]] = field(default_factory=dict)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    errors: list[BaseException] = field(default_factory=list)

    async def note(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_receipted(self, count: int, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s), self.changed:
            await self.changed.wait_for(lambda: len(self.receipted) >= count or self.errors)
        assert not self.errors, self.errors

    async def wait_all_delivered(self, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s), self.changed:
            await self.changed.wait_for(
                lambda: self.receipted.keys() <= self.deliveries.keys() or self.errors
            )
        assert not self.errors, self.errors

    def first_receipt_after(self, moment: float) -> float:
        return min(at for at in self.receipted.values() if at > moment)

    def check(self) -> None:
        """Nothing receipted is lost; nothing is delivered twice unless flagged redelivered."""
        missing = self.receipted.keys() - self.deliveries.keys()
        assert not missing, (
            f"{len(missing)} receipted messages never delivered: {sorted(missing)[:5]}"
        )
        doubled = {body: flags for body, flags in self.deliveries.items() if not all(flags[1:])}
        assert not doubled, f"delivered again without redelivered: {list(doubled.items())[:5]}"


async def produce(brokers: str, number: int, ledger: Ledger, stop: asyncio.Event) -> None:
    """Send persistent messages one after another, each waiting for its RECEIPT."""
    try:
        async with await Client.connect(brokers, resend=True, **CLIENT_OPTIONS) as client:
            n = 0
            while not stop.is_set():
                body = f"p{number}-{n}"
                await client.send(QUEUE, body, persistent=True)
                ledger.receipted[body] = time.monotonic()
                n += 1
                await ledger.note()
    except BaseException as exc:
        ledger.errors.append(exc)
        await ledger.note()
        raise


async def consume(brokers: str, ledger: Ledger, stop: asyncio.Event) -> None:
    """Receive with client-individual acks, noting every delivery."""
    try:
        async with await Client.connect(brokers, **CLIENT_OPTIONS) as client:
            sub = await client.subscribe(QUEUE, ack="client-individual", prefetch=20)
            while not stop.is_set():
                message = await sub.get(timeout=0.2)
                if message is None:
                    continue
                ledger.deliveries.setdefault(message.text, []).append(message.redelivered)
                await ledger.note()
                # An ack on a lost connection fails: that broker's successor redelivers.
                with contextlib.suppress(ClientError):
                    await client.ack(message)
    except BaseException as exc:
        ledger.errors.append(exc)
        await ledger.note()
        raise


class Load:
    """Producers and consumers on both addresses, as tasks."""

    def __init__(self, brokers: str, producers: int, consumers: int) -> None:
        self.ledger = Ledger()
        self._stop_producing = asyncio.Event()
        self._stop_consuming = asyncio.Event()
        self._producers = [
            asyncio.create_task(produce(brokers, n, self.ledger, self._stop_producing))
            for n in range(producers)
        ]
        self._consumers = [
            asyncio.create_task(consume(brokers, self.ledger, self._stop_consuming))
            for _ in range(consumers)
        ]

    async def finish(self) -> Ledger:
        """Stop producing, wait until every receipted message was delivered, stop consuming."""
        self._stop_producing.set()
        await asyncio.gather(*self._producers)
        await self.ledger.wait_all_delivered()
        self._stop_consuming.set()
        await asyncio.gather(*self._consumers)
        return self.ledger

    async def cancel(self) -> None:
        for task in self._producers + self._consumers:
            task.cancel()
        await asyncio.gather(*self._producers, *self._consumers, return_exceptions=True)


@dataclass
class Failovers:
    """What `run_failovers` measured: each takeover (kill to the slave listening), each first
    receipt after a kill, the ledger of the whole run, and the master at the end."""

    takeovers: list[float]
    firsts: list[float]
    ledger: Ledger
    master: BrokerProcess

    def summary(self, what: str) -> str:
        return (
            f"{len(self.takeovers)} failovers ({what}): takeover median "
            f"{statistics.median(self.takeovers):.2f} s, max {max(self.takeovers):.2f} s; first "
            f"receipt after the kill median {statistics.median(self.firsts):.2f} s, max "
            f"{max(self.firsts):.2f} s; {len(self.ledger.receipted)} messages receipted and "
            "delivered"
        )


def run_failovers(pair: HaPair, rounds: int) -> Failovers:
    """Brokers `a` (master) and `b` (slave) under load from two producers and a consumer on
    both addresses; `rounds` times: SIGKILL the master, wait for the slave to listen and for a
    receipt, and start the killed one again as the next slave."""
    names = ["a", "b"]
    master = pair.launch("a")
    master.wait_listening()
    slave = pair.launch("b")
    slave.wait_log("waiting for the lease")
    takeovers: list[float] = []
    firsts: list[float] = []

    async def scenario() -> Ledger:
        nonlocal master, slave
        load = Load(pair.brokers, producers=2, consumers=1)
        try:
            for number in range(rounds):
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 50)
                killed_at = time.monotonic()
                master.kill()
                await asyncio.to_thread(slave.wait_listening, 30)
                takeovers.append(time.monotonic() - killed_at)
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 1)
                firsts.append(load.ledger.first_receipt_after(killed_at) - killed_at)
                master, slave = slave, pair.launch(names[number % 2])
                await asyncio.to_thread(slave.wait_log, "waiting for the lease")
            return await load.finish()
        except BaseException:
            await load.cancel()
            raise

    ledger = asyncio.run(scenario())
    return Failovers(takeovers, firsts, ledger, master)
