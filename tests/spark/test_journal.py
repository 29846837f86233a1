"""The offline journal reader: every record of the journal and its archive, no broker needed."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")

from conftest import start_broker
from sluice.spark.options import sink_options
from sluice.spark.produce import send_transaction
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command

from .helpers import drain_queue

pytestmark = pytest.mark.spark

QUEUE = "/queue/journal.audit"


def file_number(name: str) -> int:
    match = re.search(r"db-(\d+)\.log$", name)
    assert match is not None
    return int(match.group(1))


def wait_for_archive(data_dir: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any((data_dir / "archive").glob("db-*.log")):
        assert time.monotonic() < deadline, "the broker archived no journal file"
        time.sleep(0.1)


def test_journal_reader_returns_what_was_sent(spark: Any, tmp_path: Path) -> None:
    broker = start_broker(
        store={
            "kind": "journal",
            "data_dir": str(tmp_path),
            "archive": True,
            "journal_file_bytes": 1024 * 1024,
            "checkpoint_interval_s": 0.2,
            "gc_interval_s": 0.2,
        }
    )
    sent: dict[bytes, dict[str, str]] = {}
    try:
        options = sink_options({"broker": broker.address, "destination": QUEUE})
        first = [
            (None, {"i": str(i), "tag": "first"}, b"a%05d" % i + b"x" * 900) for i in range(3000)
        ]
        send_transaction(options, first, "journal-1:")
        # Consumed: their files hold nothing live any more and move to the archive.
        assert len(drain_queue(broker.address, QUEUE, 3000, quiet_s=0.5)) == 3000
        wait_for_archive(tmp_path)
        with WireSession.open(broker.address) as session:
            for i in range(200):
                session.send(
                    Command.SEND,
                    {"destination": QUEUE, "persistent": "true", "i": str(i), "tag": "second"},
                    b"b%05d" % i,
                )
            session.request(Command.SEND, {"destination": "/queue/journal.other"}, b"last")
        for _, headers, body in first:
            sent[body] = dict(headers or {})
        for i in range(200):
            sent[b"b%05d" % i] = {"i": str(i), "tag": "second"}
    finally:
        broker.stop()

    df = spark.read.format("sluice-journal").load(str(tmp_path))
    files = sorted({r.file for r in df.select("file").distinct().collect()})
    assert any(f.startswith("archive/") for f in files)
    assert any(f.startswith("journal/") for f in files)
    assert df.rdd.getNumPartitions() == len(files)

    commits = df.where("record_type = 'TX_COMMIT'").collect()
    assert [len(r.headers["sequences"].split(",")) for r in commits] == [3000]
    committed = {r.transaction: list(map(int, r.headers["sequences"].split(","))) for r in commits}

    adds = df.where("record_type = 'ADD' AND destination = '/queue/journal.audit'").collect()
    adds.sort(key=lambda r: (file_number(r.file), r.position))
    # Every ADD gets its sequence: its own, or for a transacted add the one its TX_COMMIT lists
    # in the order of the transaction's adds (docs/spark.md shows the same in Spark).
    in_tx: Counter[int] = Counter()
    by_sequence: dict[int, list[tuple[bytes, frozenset[tuple[str, str]]]]] = {}
    originals: dict[int, Any] = {}
    for row in adds:
        headers = dict(row.headers)
        assert headers.pop("persistent") == "true"
        headers.pop("x-dedup-id", None)
        assert row.message_id
        assert row.timestamp is not None
        sequence = row.sequence
        if sequence is None:
            sequence = committed[row.transaction][in_tx[row.transaction]]
            in_tx[row.transaction] += 1
        by_sequence.setdefault(sequence, []).append((row.body, frozenset(headers.items())))
        originals.setdefault(sequence, row)
    assert sorted(by_sequence) == list(range(1, 3201))
    # Compaction may have rewritten a live message at the head: a copy repeats it exactly.
    assert all(len(set(records)) == 1 for records in by_sequence.values())
    # One message per sequence: every one sent, none twice, with its headers.
    read_back = Counter(records[0] for records in by_sequence.values())
    assert read_back == Counter((body, frozenset(h.items())) for body, h in sent.items())
    for sequence, row in originals.items():
        transacted = row.body.startswith(b"a")
        assert transacted == (sequence <= 3000)
        assert (row.transaction is not None and row.sequence is None) == transacted

    removes = df.where("record_type = 'REMOVE'").count()
    assert removes == 3000
    assert df.where("record_type = 'DAMAGED'").count() == 0
