"""The broker's CPU per message read by the Spark source, and the reader's rate, without Spark.

A broker subprocess (journal store, topics kept for a day) gets `--rows` persistent messages of
`--body` bytes on one topic, in transactions of 10,000. Then the connector's own range reader
(`sluice.spark.fetch.read_range`, what a Spark task runs) reads the whole topic in this process,
once with range blocks (`fetch=blocks`, the default) and once frame by frame (`fetch=frames`),
in `--partitions` threads of consecutive ranges. Broker CPU is the broker process's user+system
time over the read (from /proc), divided by the rows read. Rates here have no Spark in them: they
are the ceiling a task can reach.

Run: `.venv/bin/python benchmarks/range_read_cost.py [--rows N] [--body BYTES] [--partitions P]
[--store journal|memory]` (the memory store, with memory limits raised, keeps every message in
the topic's log in memory: what is left is the cost of the block itself).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

from spark_connector import Broker

from sluice.spark.fetch import read_range
from sluice.spark.offsets import OffsetRange, split_range, topic_offsets
from sluice.spark.options import sink_options, source_options
from sluice.spark.produce import send_transaction

TOPIC = "/topic/bench.range"
_TX_ROWS = 10_000


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def publish(address: str, rows: int, body: bytes) -> None:
    options = sink_options({"broker": address, "destination": TOPIC})
    for first in range(0, rows, _TX_ROWS):
        count = min(_TX_ROWS, rows - first)
        send_transaction(options, ((None, None, body) for _ in range(count)), f"b-{first}:")


def read_all(address: str, fetch: str, partitions: int) -> tuple[int, float]:
    """(rows read, seconds) for the whole topic in `partitions` threads."""
    options = source_options(
        {"broker": address, "topic": TOPIC, "fetch": fetch, "startingOffsets": "earliest"},
        streaming=False,
    )
    kept = topic_offsets(options)
    ranges = split_range(OffsetRange(TOPIC, kept.first, kept.end), partitions)
    counts = [0] * len(ranges)

    def run(i: int) -> None:
        counts[i] = sum(b.num_rows for b in read_range(options, ranges[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ranges))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--body", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--store", choices=("journal", "memory"), default="journal")
    args = parser.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = (
            f"[store]\nkind = '{args.store}'\ndata_dir = '{work / 'data'}'\n"
            "[http]\nenabled = false\n[policy]\nretention_s = 86400.0\n"
            "[limits]\ndestination_memory_limit_bytes = 4294967296\n"
            "memory_limit_bytes = 8589934592\n"
        )
        broker = Broker(config, work)
        try:
            started = time.perf_counter()
            publish(broker.address, args.rows, b"x" * args.body)
            print(
                f"published {args.rows:,} x {args.body} B in {time.perf_counter() - started:.1f} s"
            )
            for fetch in ("blocks", "frames", "blocks"):
                before = cpu_s(broker.proc.pid)
                rows, seconds = read_all(broker.address, fetch, args.partitions)
                used = cpu_s(broker.proc.pid) - before
                print(
                    f"fetch={fetch:6} {rows:,} rows in {seconds:.2f} s: {rows / seconds:,.0f} "
                    f"rows/s; broker CPU {used:.2f} s = {used / rows * 1e6:.2f} us/message"
                )
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
