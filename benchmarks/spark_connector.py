"""Throughput of the Spark connector, in rows per second.

1. Source: a topic of 1 KiB messages streamed into Spark's no-op sink (`availableNow`, one batch,
   2 partitions), against a trivial in-memory Python data source with the same schema in the same
   session (rows as tuples, and as Arrow batches). Batch reads too.
2. Sink: a DataFrame of 1 KiB rows written to a queue with `df.write.format("sluice")`.
3. Journal reader: `format("sluice-journal")` over about `--journal-gib` GiB of journal files
   written by a broker (persistent 1 KiB messages to a queue), into the no-op sink.

All three run in one Spark session (`local[2]`). The broker runs in a subprocess
(`python -m sluice broker`, memory store for 1 and 2, journal store for 3) on a free port; its
`limits.dedup_window` and the sink's `dedupWindow` are raised to `--rows`, so that each of the
sink's two tasks may send its half in one transaction. Each measurement is the best of several
runs (the first starts Spark's Python workers); the source comparison interleaves the three
sources. The output starts with the exact command, the machine and the Spark and Java versions.

Run: `.venv/bin/python benchmarks/spark_connector.py [--rows N] [--journal-gib G]
[--journal-dir DIR] [--skip-source] [--skip-journal]`
(needs the `spark` extra and Java 17+). The published figures use the defaults (200,000 rows,
1 GiB of journal) on a quiet machine; `--rows 20000 --journal-gib 0.03` checks the whole run in
a few minutes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from machine import machine_info
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

import sluice.spark
from sluice.spark.options import sink_options
from sluice.spark.produce import send_transaction
from sluice.spark.schema import TOPIC_ARROW_SCHEMA
from sluice.spark.source import topic_schema
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "/topic/bench.spark"
_LISTENING = re.compile(r"listening (?:for STOMP )?on [\d.]+:(\d+)")
# Within the broker's default dedup window: `send_transaction` refuses bigger transactions.
_TX_ROWS = 10_000


class Broker:
    """`python -m sluice broker` on a free port, with a TOML configuration."""

    def __init__(self, config: str, workdir: Path) -> None:
        (workdir / "sluice.toml").write_text(config)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice",
                "broker",
                "--config",
                str(workdir / "sluice.toml"),
                "--stomp",
                "127.0.0.1:0",
            ],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            match = _LISTENING.search(line)
            if match:
                self.address = f"127.0.0.1:{match.group(1)}"
                break
        else:
            raise RuntimeError("the broker did not start")
        # Keep reading its log so that it never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def publish_plain(address: str, destination: str, rows: int) -> float:
    """Send `rows` persistent messages of `BODY` one by one, as producers do (pipelined, one
    receipt at the end); return rows per second."""
    start = time.perf_counter()
    with WireSession.open(address) as session:
        for i in range(rows):
            session.send(
                Command.SEND,
                {"destination": destination, "persistent": "true", "n": str(i)},
                BODY,
            )
        session.request(Command.SEND, {"destination": "/queue/bench.flush"})
    return rows / (time.perf_counter() - start)


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def publish(address: str, destination: str, rows: int) -> float:
    """Send `rows` persistent messages of `BODY` in transactions; return rows per second."""
    options = sink_options(
        {"broker": address, "destination": destination, "dedupWindow": str(_TX_ROWS)}
    )
    start = time.perf_counter()
    for first in range(0, rows, _TX_ROWS):
        count = min(_TX_ROWS, rows - first)
        batch = ((None, {"n": str(first + i)}, BODY) for i in range(count))
        send_transaction(options, batch, f"bench-{first}:")
    return rows / (time.perf_counter() - start)


class _Range(InputPartition):  # type: ignore[misc]
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end


class _TrivialReader(DataSourceStreamReader):  # type: ignore[misc]
    """Rows made in memory: the same schema as the sluice source, nothing read from anywhere."""

    def __init__(self, rows: int, arrow: bool) -> None:
        self.rows, self.arrow = rows, arrow

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {"offset": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:  # noqa: N802
        return {"offset": self.rows}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        a, b = start["offset"], end["offset"]
        middle = (a + b) // 2
        return [p for p in (_Range(a, middle), _Range(middle, b)) if p.end > p.start]

    def read(self, partition: _Range) -> Iterator[Any]:
        stamp = datetime.datetime.now(datetime.UTC)
        if not self.arrow:
            for i in range(partition.start, partition.end):
                yield (i, TOPIC, "ID:x", stamp, {"n": "1"}, BODY)
            return
        micros = int(stamp.timestamp() * 1e6)
        for first in range(partition.start, partition.end, 8192):
            n = min(8192, partition.end - first)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(range(first, first + n), pa.int64()),
                    pa.array([TOPIC] * n, pa.string()),
                    pa.array(["ID:x"] * n, pa.string()),
                    pa.array([micros] * n, pa.timestamp("us", tz="UTC")),
                    pa.array([[("n", "1")]] * n, TOPIC_ARROW_SCHEMA.field("headers").type),
                    pa.array([BODY] * n, pa.binary()),
                ],
                schema=TOPIC_ARROW_SCHEMA,
            )


class TrivialSource(DataSource):  # type: ignore[misc]
    """`format("trivial-bench")` with options `rows` and `arrow`."""

    @classmethod
    def name(cls) -> str:
        return "trivial-bench"

    def schema(self) -> Any:
        return topic_schema()

    def streamReader(self, schema: Any) -> _TrivialReader:  # noqa: N802
        return _TrivialReader(int(self.options["rows"]), self.options.get("arrow") == "true")


def stream_rate(spark: Any, reader: Any, rows: int, checkpoints: Path) -> float:
    """Rows per second of an availableNow run of `reader` into the no-op sink (best of two)."""
    rate = 0.0
    for attempt in range(2):
        checkpoint = checkpoints / f"c{time.monotonic_ns()}-{attempt}"
        start = time.perf_counter()
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        read = sum(p["numInputRows"] for p in query.recentProgress)
        assert read == rows, (read, rows)
        rate = max(rate, rows / elapsed)
    return rate


def batch_rate(df_factory: Any, rows: int) -> float:
    """Rows per second of a batch read into the no-op sink (best of two)."""
    rate = 0.0
    for _ in range(2):
        start = time.perf_counter()
        df_factory().write.format("noop").mode("overwrite").save()
        rate = max(rate, rows / (time.perf_counter() - start))
    return rate


def spark_session() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("sluice-bench")
    for key, value in (
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.sql.shuffle.partitions", "2"),
        ("spark.driver.memory", "2g"),
        ("spark.sql.session.timeZone", "UTC"),
    ):
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sluice.spark.register(spark)
    sluice.spark.register_data_source(spark, TrivialSource)
    return spark


def print_setup(spark: Any) -> None:
    """The command, the machine and the versions, so that a result can be read in context."""
    print("command:", shlex.join([sys.executable, *sys.argv]))
    m = machine_info()
    memory = (m["memory_total_bytes"] or 0) / 2**30
    print(
        f"machine: {m['cpu_model']}, {m['cpus_usable']} of {m['cpu_count']} CPUs usable, "
        f"{memory:.1f} GiB memory, {m['kernel']}, {m['python']}, "
        f"load average {' '.join(map(str, m['loadavg']))}"
    )
    jvm = spark.sparkContext._jvm
    print(
        f"spark: {spark.version} ({spark.sparkContext.master}), "
        f"Java {jvm.java.lang.System.getProperty('java.version')}"
    )
    print(f"started: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")


def bench_source_and_sink(spark: Any, rows: int, work: Path, store: str) -> None:
    window = max(rows, _TX_ROWS)
    config = (
        f"[store]\nkind = '{store}'\ndata_dir = '{work / 'broker-data'}'\n"
        "[http]\nenabled = false\n[policy]\nretention_s = 86400.0\n"
        "[limits]\ndestination_memory_limit_bytes = 4294967296\n"
        f"memory_limit_bytes = 8589934592\ndedup_window = {window}\n"
    )
    broker = Broker(config, work)
    pid = broker.proc.pid
    try:
        publish_rate = publish_plain(broker.address, TOPIC, rows)
        print(
            f"publish ({len(BODY)} B bodies, persistent, one by one, {store} store): "
            f"{publish_rate:,.0f} rows/s"
        )

        def sluice_reader(stream: bool, fetch: str) -> Any:
            reader = spark.readStream if stream else spark.read
            return (
                reader.format("sluice")
                .option("broker", broker.address)
                .option("topic", TOPIC)
                .option("startingOffsets", "earliest")
                .option("minPartitions", "2")
                .option("fetch", fetch)
            )

        def trivial(arrow: bool) -> Any:
            return (
                spark.readStream.format("trivial-bench")
                .option("rows", str(rows))
                .option("arrow", str(arrow).lower())
            )

        # Interleaved, best of three each: the machine's other load hits all alike.
        names = ("tuples", "arrow", "blocks", "frames")
        rates = dict.fromkeys(names, 0.0)
        broker_cpu = {"blocks": 0.0, "frames": 0.0}
        for _ in range(3):
            for name, reader in (
                ("tuples", trivial(False)),
                ("arrow", trivial(True)),
                ("blocks", sluice_reader(True, "blocks")),
                ("frames", sluice_reader(True, "frames")),
            ):
                before = cpu_s(pid)
                rates[name] = max(rates[name], stream_rate(spark, reader, rows, work))
                if name in broker_cpu:
                    broker_cpu[name] += cpu_s(pid) - before
        runs = 3 * 2  # stream_rate runs each twice
        print(f"stream, trivial source (tuples) -> noop: {rates['tuples']:,.0f} rows/s")
        print(f"stream, trivial source (Arrow)  -> noop: {rates['arrow']:,.0f} rows/s")
        for fetch in ("blocks", "frames"):
            us = broker_cpu[fetch] / (runs * rows) * 1e6
            print(
                f"stream, sluice source fetch={fetch} -> noop: {rates[fetch]:,.0f} rows/s "
                f"({rates[fetch] / rates['tuples']:.0%} of the trivial source with tuples, "
                f"{rates[fetch] / rates['arrow']:.0%} of it with Arrow); "
                f"broker CPU {us:.1f} us/message"
            )
        for fetch in ("blocks", "frames"):
            before = cpu_s(pid)
            rate = batch_rate(lambda f=fetch: sluice_reader(False, f).load(), rows)
            us = (cpu_s(pid) - before) / (2 * rows) * 1e6
            print(
                f"batch,  sluice source fetch={fetch} -> noop: {rate:,.0f} rows/s; "
                f"broker CPU {us:.1f} us/message"
            )

        df = spark.range(rows, numPartitions=2).select(sf.lit(BODY).alias("body")).cache()
        df.count()
        sink_rates = []
        before = cpu_s(pid)
        for attempt in range(2):
            start = time.perf_counter()
            (
                df.write.format("sluice")
                .mode("append")
                .option("broker", broker.address)
                .option("destination", f"/queue/bench.sink.{attempt}")
                .option("dedupWindow", str(window))
                .save()
            )
            sink_rates.append(rows / (time.perf_counter() - start))
        us = (cpu_s(pid) - before) / (2 * rows) * 1e6
        print(
            f"sink (2 partitions, persistent, {store} store): {max(sink_rates):,.0f} rows/s; "
            f"broker CPU {us:.1f} us/row"
        )
    finally:
        broker.stop()


def bench_journal(spark: Any, gib: float, work: Path, data: Path | None) -> None:
    if data is None or not (data / "journal").is_dir():
        data = data or work / "journal-data"
        config = (
            f"[store]\nkind = 'journal'\ndata_dir = '{data}'\nsync = 'never'\n"
            "[limits]\nmemory_limit_bytes = 268435456\n"
        )
        rows = int(gib * 1024 * 1024 * 1024 / (len(BODY) + 160))
        broker = Broker(config, work)
        try:
            rate = publish(broker.address, "/queue/bench.journal", rows)
            print(f"journal written: {rows:,} persistent 1 KiB messages at {rate:,.0f} rows/s")
        finally:
            broker.stop()
    paths = sorted((data / "journal").glob("db-*.log"))
    files = len(paths)
    # Data only: journal files are preallocated, and the last one ends in zeros.
    size = sum(len(path.read_bytes().rstrip(b"\0")) for path in paths)
    records = spark.read.format("sluice-journal").load(str(data)).count()
    rate = batch_rate(lambda: spark.read.format("sluice-journal").load(str(data)), records)
    print(
        f"journal reader: {size / 2**30:.2f} GiB of records in {files} files, "
        f"{records:,} records: "
        f"{rate:,.0f} rows/s ({rate * size / records / 2**20:,.0f} MiB/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows for source and sink")
    parser.add_argument("--body", type=int, default=1024, help="body bytes for source and sink")
    parser.add_argument("--store", choices=("memory", "journal"), default="journal")
    parser.add_argument("--journal-gib", type=float, default=1.0, help="journal size to read")
    parser.add_argument("--skip-journal", action="store_true")
    parser.add_argument("--skip-source", action="store_true", help="measure the journal only")
    parser.add_argument(
        "--journal-dir", type=Path, help="data directory to read (written first if it is empty)"
    )
    args = parser.parse_args()
    global BODY  # one size per run, read by the helpers and the trivial source
    BODY = (bytes(range(256)) * (args.body // 256 + 1))[: args.body]
    work = Path(tempfile.mkdtemp(prefix="sluice-spark-bench-"))
    spark = spark_session()
    print_setup(spark)
    try:
        if not args.skip_source:
            bench_source_and_sink(spark, args.rows, work, args.store)
        if not args.skip_journal:
            bench_journal(spark, args.journal_gib, work, args.journal_dir)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
