#!/usr/bin/env python3
"""Start time with a backlog: how long a store takes to open, and a broker to serve its first
message, with COUNT messages pending in one queue.

For each store (`postgres`: the PostgreSQL store on a throwaway server started here with
Debian's initdb and pg_ctl, fsync on; `journal`: the journal store in a temporary directory):
fill it with COUNT persistent SIZE-byte messages through the store's own API (group commit, as
a broker would write them), close it, then
- open and close the store `--opens` times, timing `open()` (what recovery costs);
- start `sluice broker` on it, timing the start until it listens, then until a consumer has
  its first message; stop it.

    .venv/bin/python benchmarks/start_backlog.py --count 1000000          # as root (postgres)
    .venv/bin/python benchmarks/start_backlog.py --count 100000 --stores journal

Prints each figure and a table; `--json FILE` keeps them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from pgserver import PgServer  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.config import MiB, StoreConfig  # noqa: E402
from sluice.store.api import MessageStore, StoredMessage, WriteHandle  # noqa: E402
from sluice.store.journal.store import JournalStore  # noqa: E402
from sluice.store.postgres.store import PostgresStore  # noqa: E402

QUEUE = "/queue/backlog"
_LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
_IN_FLIGHT = 20_000


class _Sink:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done = 0

    def __call__(self, handles: Sequence[WriteHandle]) -> None:
        with self.cond:
            self.done += len(handles)
            self.cond.notify_all()

    def wait_for(self, count: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.done >= count, 600):
                raise TimeoutError(f"{count - self.done} writes not completed in 600 s")


def fill(make: Callable[[], MessageStore], count: int, size: int) -> float:
    """Add `count` messages, at most _IN_FLIGHT queued at a time; returns the seconds taken."""
    store = make()
    sink = _Sink()
    store.open(sink)
    body = b"x" * size
    started = time.monotonic()
    for seq in range(1, count + 1):
        if seq - sink.done > _IN_FLIGHT:
            sink.wait_for(seq - _IN_FLIGHT // 2)
        message = StoredMessage(QUEUE, seq, f"backlog-{seq}", 1_000 + seq, {"k": "v"}, body)
        store.add(message, None)
    sink.wait_for(count)
    took = time.monotonic() - started
    store.close()
    return took


def time_opens(make: Callable[[], MessageStore], opens: int) -> tuple[list[float], int]:
    """Seconds each `open()` took, and the pending count it reported."""
    times = []
    pending = 0
    for _ in range(opens):
        store = make()
        started = time.monotonic()
        recovery = store.open(_Sink())
        times.append(time.monotonic() - started)
        pending = sum(d.message_count for d in recovery.destinations)
        store.close()
    return times, pending


def broker_start(args: list[str], workdir: Path) -> tuple[float, float]:
    """(seconds to listen, seconds to a consumer's first message) of `sluice broker ARGS`."""
    log_path = workdir / "broker.log"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), SLUICE_HTTP__PORT="0")
    command = [str(Path(sys.executable).parent / "sluice"), "broker", *args]
    command += ["--stomp", "127.0.0.1:0"]
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stderr=log, stdout=subprocess.DEVNULL, env=env)
    try:
        port = 0
        while not port:
            match = _LISTENING.search(log_path.read_text(errors="replace"))
            if match:
                port = int(match.group(1))
            elif proc.poll() is not None:
                raise RuntimeError(f"broker exited: {log_path.read_text()[-2000:]}")
            else:
                time.sleep(0.01)
        listening = time.monotonic() - started

        async def first() -> None:
            async with await Client.connect(f"127.0.0.1:{port}") as client:
                sub = await client.subscribe(QUEUE, ack="client-individual")
                message = await sub.get(timeout=300)
                assert message is not None, "no message within 300 s"

        asyncio.run(first())
        return listening, time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)


def measure(
    name: str,
    make: Callable[[], MessageStore],
    broker_args: list[str],
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    filled = fill(make, args.count, args.size)
    print(f"{name}: filled {args.count:,} messages in {filled:.1f} s", flush=True)
    opens, pending = time_opens(make, args.opens)
    print(f"{name}: open() with {pending:,} pending: {[round(t, 3) for t in opens]} s", flush=True)
    listening, first = broker_start(broker_args, work)
    print(f"{name}: broker listening after {listening:.2f} s, first message {first:.2f} s")
    return {
        "store": name,
        "count": args.count,
        "pending_reported": pending,
        "fill_s": round(filled, 2),
        "open_s": [round(t, 3) for t in opens],
        "open_median_s": round(statistics.median(opens), 3),
        "broker_listening_s": round(listening, 2),
        "broker_first_message_s": round(first, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--opens", type=int, default=3)
    parser.add_argument("--stores", default="postgres,journal")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = []
    work = Path(tempfile.mkdtemp(prefix="sluice-start-backlog-"))
    try:
        for name in [s.strip() for s in args.stores.split(",") if s.strip()]:
            if name == "postgres":
                server = PgServer()
                try:
                    server.init()
                    server.start()
                    url = server.url()

                    def make_pg(url: str = url) -> MessageStore:
                        return PostgresStore(url)

                    broker_args = ["--store", "postgres", "--postgres-url", url]
                    broker_args += ["--data", str(work / "pg-tmp")]
                    results.append(measure(name, make_pg, broker_args, args, work))
                finally:
                    server.destroy()
            elif name == "journal":
                data = work / "journal"
                config = StoreConfig(data_dir=data, journal_file_bytes=32 * MiB)

                def make_journal(config: StoreConfig = config) -> MessageStore:
                    return JournalStore(config)

                broker_args = ["--store", "journal", "--data", str(data)]
                results.append(measure(name, make_journal, broker_args, args, work))
                shutil.rmtree(data, ignore_errors=True)
            else:
                parser.error(f"unknown store {name!r}: postgres or journal")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| store | pending | fill s | open() s (median) | broker listening s | first message s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['store']} | {r['pending_reported']:,} | {r['fill_s']} | {r['open_median_s']} "
            f"| {r['broker_listening_s']} | {r['broker_first_message_s']} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
