"""What the management server and its metrics cost on the non-persistent benchmark: `sluice bench
throughput` against a broker without HTTP (`--no-http`) and against one serving it whose
`/metrics` is scraped every second while the benchmark runs, interleaved (off, on, off, on,
...), a fresh broker for each run. Prints each run, the medians of the throughput and of the
broker's CPU time per message (read from /proc: steadier than throughput on a shared machine),
their ratios, the scrapes made, and the load average before and after. Then, steadier still, the
broker's CPU time per scrape (from /proc, over `--scrapes` scrapes in a row) with a few
destinations and with many: at one scrape a second, the share of a core the metrics take.

    .venv/bin/python benchmarks/metrics_cost.py --runs 5 --count 200000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
HTTP = re.compile(r"management API on (http://\S+/)")


class Broker:
    """A `sluice broker` subprocess on ports the OS chose."""

    def __init__(self, directory: Path, *, http: bool) -> None:
        command = [
            sys.executable,
            "-m",
            "sluice",
            "broker",
            "--store",
            "journal",
            "--data",
            str(directory / "data"),
            "--stomp",
            "127.0.0.1:0",
            *(["--http", "127.0.0.1:0"] if http else ["--no-http"]),
        ]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        self.port = 0
        self.url: str | None = None
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            found = HTTP.search(line)
            if found:
                self.url = found.group(1)
            found = LISTENING.search(line)
            if found:
                self.port = int(found.group(1))
                break
        if not self.port or (http and self.url is None):
            raise RuntimeError("the broker did not start")
        # Keep reading its stderr so that it never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for _line in self.proc.stderr:
            pass

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Scraper:
    """GET /metrics every `interval_s` on a thread until stopped; counts the scrapes."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url + "metrics"
        self.interval_s = interval_s
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as reply:
                    reply.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def bench(port: int, args: argparse.Namespace, out: Path, broker_pid: int) -> tuple[float, float]:
    """One run: (messages per second, broker CPU microseconds per message)."""
    command = [
        sys.executable,
        "-m",
        "sluice",
        "bench",
        "throughput",
        "--producers",
        str(args.producers),
        "--consumers",
        str(args.consumers),
        "--size",
        "1024",
        "--count",
        str(args.count),
        "--warmup",
        str(args.warmup),
        "--broker",
        f"127.0.0.1:{port}",
        "--broker-pid",
        str(broker_pid),
        "--json",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True)
    results = json.loads(out.read_text())["results"]
    return float(results["messages_per_s"]), float(
        results["cpu"]["measured"]["broker"]["us_per_msg"]
    )


def one_run(directory: Path, args: argparse.Namespace, *, http: bool) -> tuple[float, float, int]:
    """A fresh broker, the benchmark against it (scraped when `http`); returns msg/s, broker
    µs/msg and the scrapes made."""
    shutil.rmtree(directory / "data", ignore_errors=True)
    broker = Broker(directory, http=http)
    scraper = None
    try:
        if http:
            assert broker.url is not None
            scraper = Scraper(broker.url, args.scrape_interval)
        rate, cpu = bench(broker.port, args, directory / "run.json", broker.proc.pid)
    finally:
        if scraper is not None:
            scraper.stop()
            if scraper.failures:
                raise RuntimeError(f"{scraper.failures} scrapes failed")
        broker.stop()
    return rate, cpu, scraper.scrapes if scraper is not None else 0


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process, all threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape_cost(directory: Path, destinations: int, scrapes: int) -> float:
    """The broker's CPU milliseconds per /metrics scrape with this many destinations (each
    with messages, so each has its series)."""
    shutil.rmtree(directory / "data", ignore_errors=True)
    broker = Broker(directory, http=True)
    try:
        assert broker.url is not None
        for i in range(destinations):
            request = urllib.request.Request(
                f"{broker.url}api/destinations/queue/cost.{i}/messages",
                data=b'{"body": "x"}',
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                reply.read()
        url = broker.url + "metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            reply.read()
        before = _cpu_s(broker.proc.pid)
        for _ in range(scrapes):
            with urllib.request.urlopen(url, timeout=10) as reply:
                reply.read()
        return (_cpu_s(broker.proc.pid) - before) * 1000 / scrapes
    finally:
        broker.stop()


def _medians(off: list[tuple[float, float, int]], on: list[tuple[float, float, int]]) -> None:
    rate_off = statistics.median(r[0] for r in off)
    rate_on = statistics.median(r[0] for r in on)
    cpu_off = statistics.median(r[1] for r in off)
    cpu_on = statistics.median(r[1] for r in on)
    print(
        f"throughput median: off {rate_off:,.0f} msg/s, on {rate_on:,.0f} msg/s, "
        f"on/off {rate_on / rate_off:.3f}"
    )
    print(
        f"broker CPU median: off {cpu_off:.2f} us/msg, on {cpu_on:.2f} us/msg, "
        f"on/off {cpu_on / cpu_off:.3f}"
    )
    print(f"scrapes: {sum(r[2] for r in on)} in {len(on)} runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs in each mode")
    parser.add_argument("--count", type=int, default=200_000, help="messages per run")
    parser.add_argument("--warmup", type=int, default=5000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds")
    parser.add_argument(
        "--scrape-cost",
        type=int,
        nargs="*",
        default=[4, 1000],
        metavar="DESTINATIONS",
        help="also measure the broker's CPU per scrape with these many destinations",
    )
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per cost measure")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="sluice-metrics-cost-"))
    load_before = os.getloadavg()
    off: list[tuple[float, float, int]] = []
    on: list[tuple[float, float, int]] = []
    try:
        for run in range(args.runs):
            off.append(one_run(directory, args, http=False))
            on.append(one_run(directory, args, http=True))
            print(
                f"run {run + 1}: http off {off[-1][0]:,.0f} msg/s {off[-1][1]:.1f} us/msg, "
                f"http on {on[-1][0]:,.0f} msg/s {on[-1][1]:.1f} us/msg "
                f"({on[-1][2]} scrapes)",
                flush=True,
            )
        for count in args.scrape_cost:
            cost = scrape_cost(directory, count, args.scrapes)
            print(f"scrape cost: {cost:.2f} ms of broker CPU per scrape, {count} destinations")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.runs:
        _medians(off, on)
    load_after = os.getloadavg()
    print(
        "load average: before "
        + " ".join(f"{x:.2f}" for x in load_before)
        + ", after "
        + " ".join(f"{x:.2f}" for x in load_after)
    )


if __name__ == "__main__":
    main()
