"""Start time of a broker holding a large backlog of persistent messages, and its disk use.

Fills a journal-store broker with N persistent messages (no consumer), then measures how long the
broker takes to listen again:

- after a clean stop, with `verify_journal` full (every journal record checksummed, the default)
  and with after_checkpoint (only what replay reads): the difference is the verification;
- after SIGKILL while producers are sending (for `--load-s` seconds first), so the start replays
  the journal written after the last index checkpoint; the records replayed are reported;
- after its index is deleted (rebuilt from the journal).

Then it drains the queue and reports disk use before and after (with an offline compaction).
Every start also checks the index (data.mdb read as a file, every entry against its digest).

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
import threading
import time
from pathlib import Path

from sluice.client import Client

LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
REPLAYED = re.compile(r"(\d+) records replayed")


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
        self.replayed = 0

    def start(self, config: Path | None = None) -> float:
        """Start; return the seconds until it listens (`replayed`: records it replayed)."""
        started = time.monotonic()
        extra = ["--config", str(config)] if config is not None else []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice",
                "-v",
                "broker",
                *extra,
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
        self.replayed = 0
        for line in self.proc.stderr:
            replayed = REPLAYED.search(line)
            if replayed:
                self.replayed = int(replayed.group(1))
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                elapsed = time.monotonic() - started
                # Keep reading so the broker never blocks on a full pipe.
                threading.Thread(target=self._drain_stderr, daemon=True).start()
                return elapsed
        raise RuntimeError("broker exited before listening")

    def _drain_stderr(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for _line in self.proc.stderr:
            pass

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


async def _load(port: int, size: int, producers: int, stop: threading.Event) -> int:
    """Producers sending persistent messages (a receipt every 100) until the broker dies or
    `stop` is set; returns how many messages were receipted."""
    body = b"l" * size

    async def produce() -> int:
        receipted = 0
        sent = 0
        try:
            client = await Client.connect(f"127.0.0.1:{port}", reconnect=False)
            while not stop.is_set():
                receipt = sent % 100 == 99
                await client.send("/queue/load", body, persistent=True, receipt=receipt)
                sent += 1
                if receipt:
                    receipted = sent
        except Exception:  # the broker was killed under us: that is the point
            return receipted
        await client.close()
        return receipted

    counts = await asyncio.gather(*(produce() for _ in range(producers)))
    return sum(counts)


def _kill_under_load(broker: Broker, size: int, load_s: float) -> int:
    """SIGKILL the broker `load_s` seconds into a load; returns the messages receipted."""
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(asyncio.run(_load(broker.port, size, 4, stop)))
    )
    thread.start()
    time.sleep(load_s)
    broker.stop(signal.SIGKILL)
    stop.set()
    thread.join(60)
    return result[0] if result else 0


async def _drain(port: int, count: int) -> float:
    started = time.monotonic()
    async with await Client.connect(f"127.0.0.1:{port}") as client:
        sub = await client.subscribe("/queue/backlog", ack="client", prefetch=1000)
        for i in range(count):
            message = await sub.get(timeout=60)
            assert message is not None, f"drained only {i} of {count}"
            if i % 500 == 499 or i == count - 1:
                await client.ack(message)
        # What the producers of the SIGKILL case left, so disk use compares like with like.
        load = await client.subscribe("/queue/load", ack="auto", prefetch=1000)
        while await load.get(timeout=2.0) is not None:
            pass
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--load-s", type=float, default=3.0, help="load before the SIGKILL")
    args = parser.parse_args()
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="sluice-restart-", dir=args.dir))
    data = workdir / "data"
    after_checkpoint = workdir / "after-checkpoint.toml"
    after_checkpoint.write_text('[store]\nverify_journal = "after_checkpoint"\n')
    results: dict[str, float | int] = {"messages": args.messages, "size": args.size}
    try:
        broker = Broker(data)
        broker.start()
        results["fill_s"] = asyncio.run(_fill(broker.port, args.messages, args.size))
        broker.stop()
        results["disk_bytes_full"] = _du(data)
        results["start_after_clean_stop_s"] = broker.start()
        broker.stop()
        results["start_after_clean_stop_checkpoint_only_s"] = broker.start(after_checkpoint)
        results["sigkill_receipted_messages"] = _kill_under_load(broker, args.size, args.load_s)
        results["start_after_sigkill_s"] = broker.start()
        results["sigkill_records_replayed"] = broker.replayed
        broker.stop()
        shutil.rmtree(data / "index")
        results["start_after_index_deleted_s"] = broker.start()
        results["rebuild_records_replayed"] = broker.replayed
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
