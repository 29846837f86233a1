"""Start time of a broker holding a large backlog of persistent messages, and its disk use.

Fills a journal-store broker with N persistent messages (no consumer), then measures how long the
broker takes to listen again after a clean stop, after SIGKILL, and after its index is deleted
(rebuilt from the journal); then drains the queue and reports disk use before and after (with an
offline compaction).

    .venv/bin/python benchmarks/restart.py --messages 1000000 --size 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluice.client import Client

LISTENING = re.compile(r"listening on [\d.]+:(\d+)")


def _du(path: Path) -> int:
    """Bytes allocated on disk under `path` (preallocated journal files count in full)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


class Broker:
    """`sluice broker` on the journal store in a subprocess."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> float:
        """Start; return the seconds until it listens."""
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice",
                "broker",
                "--store",
                "journal",
                "--data",
                str(self.data),
                "--stomp",
                "127.0.0.1:0",
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                return time.monotonic() - started
        raise RuntimeError("broker exited before listening")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(120)


async def _fill(port: int, count: int, size: int) -> float:
    body = b"x" * size
    started = time.monotonic()
    async with await Client.connect(f"127.0.0.1:{port}") as client:
        for i in range(count):
            last = i == count - 1 or i % 1000 == 999
            await client.send("/queue/backlog", body, persistent=True, receipt=last)
    return time.monotonic() - started


async def _drain(port: int, count: int) -> float:
    started = time.monotonic()
    async with await Client.connect(f"127.0.0.1:{port}") as client:
        sub = await client.subscribe("/queue/backlog", ack="client", prefetch=1000)
        for i in range(count):
            message = await sub.get(timeout=60)
            assert message is not None, f"drained only {i} of {count}"
            if i % 500 == 499 or i == count - 1:
                await client.ack(message)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sluice-restart-", dir=args.dir))
    data = workdir / "data"
    results: dict[str, float | int] = {"messages": args.messages, "size": args.size}
    try:
        broker = Broker(data)
        broker.start()
        results["fill_s"] = asyncio.run(_fill(broker.port, args.messages, args.size))
        broker.stop()
        results["disk_bytes_full"] = _du(data)
        results["start_after_clean_stop_s"] = broker.start()
        broker.stop(signal.SIGKILL)
        results["start_after_sigkill_s"] = broker.start()
        broker.stop()
        shutil.rmtree(data / "index")
        results["start_after_index_deleted_s"] = broker.start()
        results["drain_s"] = asyncio.run(_drain(broker.port, args.messages))
        broker.stop()
        results["disk_bytes_drained"] = _du(data)
        subprocess.run(
            [sys.executable, "-m", "sluice", "store", "compact", str(data)],
            check=True,
            capture_output=True,
        )
        results["disk_bytes_after_compact"] = _du(data)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for key, value in results.items():
        print(f"{key}: {value:,.2f}" if isinstance(value, float) else f"{key}: {value:,}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
