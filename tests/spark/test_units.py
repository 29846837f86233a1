"""The connector's parts without Spark: options, ranges, the journal decoder, reading ranges."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="needs the spark extra")

from conftest import RunningBroker
from sluice.errors import ClientError, CorruptionError
from sluice.spark import blocks
from sluice.spark.blocks import BlockError, decode_block
from sluice.spark.fetch import DataLossError, read_range
from sluice.spark.journal import JournalFile, journal_files, read_journal_file
from sluice.spark.offsets import NEXT_OFFSET_HEADER, OffsetRange, fetch_offsets, split_range
from sluice.spark.options import OptionError, journal_options, sink_options, source_options
from sluice.spark.produce import DedupWindowExceeded, send_transaction
from sluice.spark.wire import WireSession
from sluice.stomp.frames import Command
from sluice.stomp.records import encode_block
from sluice.store.api import StoredMessage
from sluice.store.journal import format as fmt

from .helpers import drain_queue

pytestmark = pytest.mark.spark


# -- options and ranges -------------------------------------------------------------------------


def test_source_options_defaults_and_checks() -> None:
    stream = source_options({"topic": "events"}, streaming=True)
    assert stream.topic == "/topic/events"
    assert stream.starting == "latest"
    assert stream.fail_on_data_loss
    batch = source_options(
        {"TOPIC": "/topic/x", "startingoffsets": "12", "endingOffsets": "20"}, streaming=False
    )
    assert (batch.starting, batch.ending) == ("12", "20")
    for bad in (
        {"topic": "/queue/q"},
        {"topic": "t", "startingOffsets": "first"},
        {"topic": "t", "maxOffsetsPerTrigger": "0"},
        {"topic": "t", "failOnDataLoss": "maybe"},
        {"topic": "t", "endingOffsets": "5"},
        {},
    ):
        with pytest.raises(OptionError):
            source_options(bad, streaming=True)
    with pytest.raises(OptionError, match="before"):
        source_options(
            {"topic": "t", "startingOffsets": "9", "endingOffsets": "3"}, streaming=False
        )
    with pytest.raises(OptionError):
        sink_options({"destination": "nowhere"})


def test_split_range_covers_the_range_without_empty_parts() -> None:
    whole = OffsetRange("/topic/t", 10, 21)
    parts = split_range(whole, 3)
    assert [(p.start, p.end) for p in parts] == [(10, 14), (14, 18), (18, 21)]
    assert [(p.start, p.end) for p in split_range(OffsetRange("/topic/t", 5, 7), 4)] == [
        (5, 6),
        (6, 7),
    ]
    assert split_range(OffsetRange("/topic/t", 5, 5), 2) == []


# -- reading ranges off Spark -------------------------------------------------------------------


def send(
    broker: RunningBroker, topic: str, count: int, expired: frozenset[int] = frozenset()
) -> None:
    past = str(int(time.time() * 1000) - 60_000)
    with WireSession.open(broker.address) as session:
        for i in range(count):
            headers = {"destination": topic, "persistent": "true", "i": str(i)}
            if i in expired:
                headers["expires"] = past
            session.send(Command.SEND, headers, b"m%d" % i)
        session.request(Command.SEND, {"destination": "/queue/flush"}, b"")


def offsets_read(
    broker: RunningBroker, topic: str, start: int, end: int, **options: str
) -> list[int]:
    opts = source_options({"broker": broker.address, "topic": topic, **options}, streaming=False)
    batches = read_range(opts, OffsetRange(topic, start, end), batch_rows=7)
    return [offset for batch in batches for offset in batch.column("offset").to_pylist()]


# Both ways of reading: range blocks (the default) and one frame per message.
FETCH_MODES = pytest.mark.parametrize("fetch", ["blocks", "frames"])


@FETCH_MODES
def test_read_range_is_exact_and_batched(spark_broker: RunningBroker, fetch: str) -> None:
    topic = f"/topic/units.exact.{fetch}"
    send(spark_broker, topic, 50)
    assert fetch_offsets(spark_broker.address, topic) == (1, 50)
    assert offsets_read(spark_broker, topic, 11, 31, fetch=fetch) == list(range(11, 31))
    assert offsets_read(spark_broker, topic, 1, 51, prefetch="4", fetch=fetch) == list(range(1, 51))


def test_range_blocks_split_a_range_exactly(
    spark_broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "/topic/units.blocks"
    send(spark_broker, topic, 30)
    monkeypatch.setattr(blocks, "BLOCK_COUNT", 4)
    opts = source_options({"broker": spark_broker.address, "topic": topic}, streaming=False)
    batches = list(read_range(opts, OffsetRange(topic, 3, 27)))
    assert [b.num_rows for b in batches] == [4, 4, 4, 4, 4, 4]
    rows = [row for b in batches for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(3, 27))
    assert rows[0]["body"] == b"m2"
    assert rows[0]["destination"] == topic
    assert rows[0]["message_id"]
    assert dict(rows[0]["headers"]) == {"persistent": "true", "i": "2"}


@FETCH_MODES
def test_expired_messages_are_holes_not_loss(spark_broker: RunningBroker, fetch: str) -> None:
    topic = f"/topic/units.expired.{fetch}"
    send(spark_broker, topic, 12, expired=frozenset({2, 3, 8}))
    assert offsets_read(spark_broker, topic, 1, 13, fetch=fetch) == [1, 2, 5, 6, 7, 8, 10, 11, 12]


@FETCH_MODES
def test_a_range_past_the_topic_end_is_loss(
    spark_broker: RunningBroker, caplog: pytest.LogCaptureFixture, fetch: str
) -> None:
    topic = f"/topic/units.short.{fetch}"
    send(spark_broker, topic, 5)
    with pytest.raises(DataLossError, match="offsets 6 to 9"):
        offsets_read(spark_broker, topic, 1, 10, fetch=fetch)
    with caplog.at_level(logging.WARNING, logger="sluice.spark.fetch"):
        read = offsets_read(spark_broker, topic, 1, 10, failOnDataLoss="false", fetch=fetch)
        assert read == [1, 2, 3, 4, 5]
    assert f"offsets 6 to 9 of {topic} are lost: the topic's last offset is 5" in caplog.text
    assert "skipped, as failOnDataLoss=false" in caplog.text


def broker_reports_cursor(broker: RunningBroker) -> bool:
    with WireSession.open(broker.address) as session:
        session.request(Command.SUBSCRIBE, {"destination": "/topic/probe", "id": "p"})
        return NEXT_OFFSET_HEADER in session.request(Command.UNSUBSCRIBE, {"id": "p"})


def test_expired_last_message_ends_the_range(spark_broker: RunningBroker) -> None:
    if not broker_reports_cursor(spark_broker):
        pytest.skip(f"the broker does not report {NEXT_OFFSET_HEADER} on UNSUBSCRIBE receipts")
    topic = "/topic/units.expired-last"
    send(spark_broker, topic, 6, expired=frozenset({5}))
    started = time.monotonic()
    assert offsets_read(spark_broker, topic, 1, 7, timeoutMs="20000") == [1, 2, 3, 4, 5]
    assert offsets_read(spark_broker, topic, 1, 7, fetch="frames") == [1, 2, 3, 4, 5]
    assert time.monotonic() - started < 10


# -- sending a task's rows off Spark -----------------------------------------------------------


@pytest.mark.parametrize("send", ["blocks", "frames"])
def test_a_transaction_beyond_the_dedup_window_delivers_nothing(
    spark_broker: RunningBroker, send: str
) -> None:
    a, b = f"/queue/units.window.a.{send}", f"/queue/units.window.b.{send}"
    options = sink_options(
        {"broker": spark_broker.address, "destination": a, "dedupWindow": "5", "send": send}
    )

    def rows(to_a: int, to_b: int) -> list[tuple[str | None, None, bytes]]:
        return [(None, None, b"a%d" % i) for i in range(to_a)] + [
            (b, None, b"b%d" % i) for i in range(to_b)
        ]

    refused = r"limit dedupWindow=5 exceeded.*units\.window\.a\."
    with pytest.raises(DedupWindowExceeded, match=refused):
        send_transaction(options, rows(6, 0), f"units-window-{send}:")
    assert drain_queue(spark_broker.address, a, 0, quiet_s=0.5) == []
    # Nothing was committed, so no id is known: the same ids go through, 5 per destination.
    result = send_transaction(options, rows(5, 5), f"units-window-{send}:")
    assert result.rows == 10
    assert dict(result.per_destination) == {a: 5, b: 5}
    assert sorted(f.body for f in drain_queue(spark_broker.address, a, 5, quiet_s=0.5)) == [
        b"a%d" % i for i in range(5)
    ]
    assert len(drain_queue(spark_broker.address, b, 5, quiet_s=0.5)) == 5
    # Sent again with the same ids (a retried task): the broker drops every one.
    send_transaction(options, rows(5, 5), f"units-window-{send}:")
    assert drain_queue(spark_broker.address, a, 0, quiet_s=0.5) == []
    assert drain_queue(spark_broker.address, b, 0, quiet_s=0.5) == []
    with pytest.raises(OptionError, match="dedupWindow"):
        sink_options({"dedupWindow": "0"})


# -- the journal decoder ------------------------------------------------------------------------


def add_record(seq: int, body: bytes, txno: int = 0, **headers: str) -> bytes:
    message = StoredMessage("/queue/j", seq, f"ID:{seq}", 1_700_000_000_000 + seq, headers, body)
    head, data, _ = fmt.encode_add(message, txno)
    return fmt.record_bytes(fmt.RecordType.ADD, head + data)


def other_record(record: fmt.Record) -> bytes:
    rtype, payload = fmt.encode(record)
    return fmt.record_bytes(rtype, payload)


def write_journal(path: Path, *, tail: bytes = b"", damage_at: int | None = None) -> list[int]:
    """A data file: header, 3 adds, a transaction of 2 adds, a remove, zeros; positions."""
    records = [
        fmt.encode_file_header(7, b"s" * 16, 1_700_000_000_000),
        add_record(1, b"one", k="a"),
        add_record(2, b"two"),
        add_record(3, b"three"),
        other_record(fmt.TxBegin(5, "tx-a")),
        add_record(0, b"t1", 5),
        add_record(0, b"t2", 5),
        other_record(fmt.TxCommit(5, (4, 5))),
        other_record(fmt.Remove(0, "/queue/j", 1)),
    ]
    positions = []
    data = bytearray()
    for record in records:
        positions.append(len(data))
        data += record
    if damage_at is not None:
        data[positions[damage_at] + fmt.HEADER_BYTES + 3] ^= 0xFF
    path.write_bytes(bytes(data) + tail + b"\0" * 4096)
    return positions


def rows_of(path: Path, **options: bool) -> list[dict[str, object]]:
    journal_file = JournalFile(7, str(path), path.name)
    return [
        row for batch in read_journal_file(journal_file, **options) for row in batch.to_pylist()
    ]


def test_journal_decoder_reads_every_record(tmp_path: Path) -> None:
    path = tmp_path / "db-7.log"
    positions = write_journal(path)
    rows = rows_of(path)
    assert [r["record_type"] for r in rows] == [
        "FILE_HEADER",
        "ADD",
        "ADD",
        "ADD",
        "TX_BEGIN",
        "ADD",
        "ADD",
        "TX_COMMIT",
        "REMOVE",
    ]
    assert [r["position"] for r in rows] == positions
    assert rows[1]["body"] == b"one"
    assert dict(rows[1]["headers"]) == {"k": "a", "persistent": "true"}  # type: ignore[arg-type]
    assert rows[1]["sequence"] == 1
    assert rows[1]["transaction"] is None
    assert rows[5]["sequence"] is None
    assert rows[5]["transaction"] == 5
    assert dict(rows[7]["headers"]) == {"sequences": "4,5"}  # type: ignore[arg-type]
    assert dict(rows[4]["headers"]) == {"txid": "tx-a"}  # type: ignore[arg-type]
    assert all(r["file"] == "db-7.log" for r in rows)


def test_damage_in_the_middle_is_a_row_or_an_error(tmp_path: Path) -> None:
    path = tmp_path / "db-7.log"
    positions = write_journal(path, damage_at=2)
    rows = rows_of(path)
    types = [r["record_type"] for r in rows]
    assert types[:3] == ["FILE_HEADER", "ADD", "DAMAGED"]
    assert rows[2]["position"] == positions[2]
    assert dict(rows[2]["headers"])["length"] == str(positions[3] - positions[2])  # type: ignore[arg-type]
    assert [r["body"] for r in rows if r["record_type"] == "ADD"] == [
        b"one",
        b"three",
        b"t1",
        b"t2",
    ]
    with pytest.raises(CorruptionError, match=r"db-7\.log"):
        rows_of(path, fail_on_corruption=True)


def test_torn_tail_ends_the_file_quietly(tmp_path: Path) -> None:
    path = tmp_path / "db-7.log"
    torn = add_record(9, b"x" * 100)[:-30]
    write_journal(path, tail=torn)
    rows = rows_of(path, fail_on_corruption=True)
    assert len(rows) == 9
    assert "DAMAGED" not in {r["record_type"] for r in rows}


def test_journal_files_orders_archive_and_journal(tmp_path: Path) -> None:
    (tmp_path / "journal").mkdir()
    (tmp_path / "archive").mkdir()
    for name in ("archive/db-2.log", "archive/db-10.log", "journal/db-11.log", "journal/x.log"):
        (tmp_path / name).write_bytes(b"")
    assert [f.name for f in journal_files(tmp_path)] == [
        "archive/db-2.log",
        "archive/db-10.log",
        "journal/db-11.log",
    ]
    with pytest.raises(FileNotFoundError):
        journal_files(tmp_path / "missing")


def test_journal_paths_are_made_absolute_where_the_read_is_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert journal_options({"path": "data"}).path == str(tmp_path / "data")
    assert journal_options({"path": "./a/../data/"}).path == str(tmp_path / "data")
    assert journal_options({"path": "/srv/sluice"}).path == "/srv/sluice"
    assert journal_options({"path": "file:///srv/my%20data"}).path == "/srv/my data"
    assert journal_options({"path": "file:/srv/data"}).path == "/srv/data"
    with pytest.raises(OptionError, match="hdfs"):
        journal_options({"path": "hdfs://namenode/sluice"})


def test_journal_partitions_read_from_another_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark", reason="needs the spark extra")
    from sluice.spark.journal_source import (  # noqa: PLC0415 - needs pyspark
        SluiceJournalDataSource,
        journal_schema,
    )

    (tmp_path / "planner" / "data" / "journal").mkdir(parents=True)
    write_journal(tmp_path / "planner" / "data" / "journal" / "db-7.log")
    (tmp_path / "executor").mkdir()
    monkeypatch.chdir(tmp_path / "planner")
    reader = SluiceJournalDataSource({"path": "data"}).reader(journal_schema())
    partitions = reader.partitions()
    assert [p.journal_file.name for p in partitions] == ["journal/db-7.log"]
    # An executor runs the task in a directory of its own.
    monkeypatch.chdir(tmp_path / "executor")
    rows = [row for batch in reader.read(partitions[0]) for row in batch.to_pylist()]
    assert len(rows) == 9


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_one_broker_is_tried_once_and_several_until_the_timeout(
    spark_broker: RunningBroker,
) -> None:
    """A failover: with a master and its slave given, none answering for a moment is waited
    for; a lone broker that does not answer is an error at once."""
    closed = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(ClientError, match="no broker answered"):
        WireSession.open(closed, timeout_s=5)
    assert time.monotonic() - started < 2
    other = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(ClientError, match=f"no broker answered: {closed}: .*; {other}: "):
        WireSession.open(f"{closed},{other}", timeout_s=0.8)
    assert time.monotonic() - started >= 0.8
    with WireSession.open(f"{closed},{spark_broker.address}", timeout_s=5) as session:
        assert session.label == spark_broker.address


# -- range blocks --------------------------------------------------------------------------------


def _block(messages: list[StoredMessage]) -> bytes:
    return b"".join(encode_block(messages))


def test_a_block_round_trips_every_column() -> None:
    messages = [
        StoredMessage("/topic/b", 7, "ID:1", 1_700_000_000_123, {"k": "v:1\n", "é": "ü"}, b"\x00x"),
        StoredMessage(
            "/topic/b", 9, "ID:2", 5, {}, b"", persistent=False, priority=9, expires_ms=8
        ),
    ]
    batch, count = decode_block(_block(messages), "/topic/b")
    assert count == 2
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [7, 9]
    assert [r["message_id"] for r in rows] == ["ID:1", "ID:2"]
    assert rows[0]["timestamp"].timestamp() == 1_700_000_000.123
    assert dict(rows[0]["headers"]) == {"persistent": "true", "k": "v:1\n", "é": "ü"}
    assert dict(rows[1]["headers"]) == {"expires": "8", "priority": "9"}
    assert [r["body"] for r in rows] == [b"\0x", b""]
    assert decode_block(_block([]), "/topic/b")[1] == 0


def test_a_malformed_block_is_an_error_not_a_row() -> None:
    good = _block([StoredMessage("/topic/b", 1, "ID:1", 5, {"a": "b"}, b"body")])
    with pytest.raises(BlockError, match="wrong magic"):
        decode_block(b"XXXX" + good[4:], "/topic/b")
    for cut in (3, 12, 20, len(good) - 1):
        with pytest.raises(BlockError):
            decode_block(good[:cut], "/topic/b")
    with pytest.raises(BlockError, match="past its last column"):
        decode_block(good + b"!", "/topic/b")
    # A count far beyond the body: refused before anything is sliced or allocated.
    huge = good[:4] + (1 << 30).to_bytes(4, "little") + good[8:]
    with pytest.raises(BlockError, match="cut short"):
        decode_block(huge, "/topic/b")
    # Offsets that run backwards inside the bounds: caught by validation.
    body_offsets_at = good.rindex(b"body") - 8
    backwards = good[:body_offsets_at] + (9).to_bytes(4, "little") + good[body_offsets_at + 4 :]
    with pytest.raises(BlockError):
        decode_block(backwards, "/topic/b")


def test_the_broker_names_its_block_features(spark_broker: RunningBroker) -> None:
    with WireSession.open(spark_broker.address) as session:
        assert session.server.startswith("sluice/")
        assert session.has_feature("range-reads")
        assert session.has_feature("records-blocks")
        assert not session.has_feature("sluice/")


def test_a_broker_without_blocks_gets_frames(
    spark_broker: RunningBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older broker would store a records block as one message: the connector looks at the
    features CONNECTED names and reads and writes frame by frame without them."""
    monkeypatch.setattr(WireSession, "has_feature", lambda self, feature: False)
    queue, topic = "/queue/units.old-broker", "/topic/units.old-broker"
    with caplog.at_level(logging.INFO, logger="sluice.spark"):
        for destination in (queue, topic):
            options = sink_options({"broker": spark_broker.address, "destination": destination})
            send_transaction(options, [(None, None, b"a"), (None, None, b"b")], "old:")
        assert offsets_read(spark_broker, topic, 1, 3) == [1, 2]
    assert "has no records blocks: one SEND per row" in caplog.text
    assert "has no range reads: reading frame by frame" in caplog.text
    bodies = [f.body for f in drain_queue(spark_broker.address, queue, 2, quiet_s=0.5)]
    assert sorted(bodies) == [b"a", b"b"]
