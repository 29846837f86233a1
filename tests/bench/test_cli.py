"""`sluice bench` argument parsing and how a run is planned from it."""

from __future__ import annotations

import argparse

import pytest

from sluice.bench.runner import split_processes
from sluice.cli.bench import _clients_plan, parse_broker, split_count
from sluice.cli.entry import build_parser


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_throughput_defaults() -> None:
    args = _parse("throughput")
    assert args.scenario == "throughput"
    assert (args.producers, args.consumers, args.size, args.count) == (1, 1, 1024, 100_000)
    assert args.broker == ("127.0.0.1", 61613)
    assert args.host_header == "/"
    assert not args.persistent
    assert args.processes is None
    assert args.ack == "client"
    assert (args.receipt_every, args.max_receipts) == (None, 8)  # None: by message size
    assert args.drain_grace == 1.0
    assert args.broker_pid is None
    plan = _clients_plan(args, "/queue/q.run")
    assert plan.producers[0].receipt_every == 100
    assert plan.drain_grace_s == 1.0


@pytest.mark.parametrize(
    ("size", "argv", "window"),
    [
        (1024, [], 100),
        (300 * 1024, [], 3),
        (1024 * 1024, [], 1),
        # Given explicitly, the window is used as given whatever the size.
        (1024 * 1024, ["--receipt-every", "4"], 4),
        (1024, ["--receipt-every", "7"], 7),
    ],
)
def test_receipt_window(size: int, argv: list[str], window: int) -> None:
    args = _parse("throughput", "--size", str(size), "--max-receipts", "4", *argv)
    (producer,) = _clients_plan(args, "/queue/q.run").producers
    assert (producer.receipt_every, producer.max_receipts) == (window, 4)


def test_throughput_options() -> None:
    args = _parse(
        "throughput",
        "--broker",
        "10.0.0.1:5000",
        "--login",
        "guest",
        "--passcode",
        "pw",
        "--host-header",
        "vhost1",
        "--producers",
        "4",
        "--consumers",
        "2",
        "--size",
        "100",
        "--count",
        "1001",
        "--persistent",
        "--destination",
        "/topic/t",
        "--processes",
        "3",
        "--warmup",
        "10",
        "--timeout",
        "5",
        "-H",
        "x-a:b:c",
    )
    assert args.broker == ("10.0.0.1", 5000)
    assert args.processes == 3
    assert args.send_header == [("x-a", "b:c")]
    plan = _clients_plan(args, "/topic/t.run")
    assert [p.count for p in plan.producers] == [251, 250, 250, 250]
    assert [p.warmup for p in plan.producers] == [3, 3, 2, 2]
    assert all(p.persistent and p.destination == "/topic/t.run" for p in plan.producers)
    assert plan.producers[0].headers == {"x-a": "b:c"}
    assert len(plan.consumers) == 2
    assert plan.consumers[0].per_producer == [254, 253, 252, 252]
    assert plan.consumers[0].warmup == [3, 3, 2, 2]
    assert plan.every_consumer  # a topic: every consumer gets everything
    assert plan.expected_unique(warmup_only=False) == 2 * 1011
    assert plan.expected_unique(warmup_only=True) == 2 * 10
    assert plan.timeout_s == 5
    assert plan.broker["host_header"] == "vhost1"


def test_sync_sends_one_at_a_time() -> None:
    plan = _clients_plan(_parse("sync", "--count", "10"), "/queue/q.run")
    (producer,) = plan.producers
    assert (producer.receipt_every, producer.max_receipts) == (1, 1)
    assert producer.rate_per_s == 0
    assert not plan.every_consumer


def test_sync_producers_each_have_a_process_by_default() -> None:
    plan = _clients_plan(_parse("sync", "--producers", "8"), "/queue/q.run")
    assert plan.process_per_producer
    assert split_processes(8, 1, plan.processes, process_per_producer=True) == (1, 8)
    shared = _clients_plan(_parse("sync", "--no-process-per-producer"), "/queue/q.run")
    assert not shared.process_per_producer
    # Throughput keeps producers together unless asked.
    assert not _clients_plan(_parse("throughput"), "/queue/q.run").process_per_producer
    asked = _parse("throughput", "--process-per-producer")
    assert _clients_plan(asked, "/queue/q.run").process_per_producer


def test_sync_rate_is_shared_and_interleaved() -> None:
    plan = _clients_plan(_parse("sync", "--producers", "4", "--rate", "2000"), "/queue/q.r")
    assert [p.rate_per_s for p in plan.producers] == [500.0] * 4
    assert [p.start_offset_s for p in plan.producers] == [0.0, 0.0005, 0.001, 0.0015]
    assert all((p.receipt_every, p.max_receipts) == (1, 1) for p in plan.producers)


def test_latency_follows_a_timetable() -> None:
    plan = _clients_plan(_parse("latency", "--rate", "200", "--duration", "2.5"), "/queue/q.r")
    (producer,) = plan.producers
    assert producer.rate_per_s == 200
    assert producer.count == 500
    assert len(plan.consumers) == 1


def test_ack_every_defaults_to_half_the_prefetch() -> None:
    plan = _clients_plan(_parse("throughput", "--prefetch", "300"), "/queue/q.r")
    assert plan.consumers[0].prefetch == 300
    assert plan.consumers[0].ack_every == 150


def test_connections_options() -> None:
    args = _parse("connections", "--connections", "10000", "--duration", "60", "--broker-pid", "42")
    assert (args.connections, args.duration, args.broker_pid) == (10000, 60.0, 42)
    assert (args.marker_timeout, args.drain_grace) == (30.0, 1.0)
    assert args.per_process == 2500
    assert args.rate_per_connection == 0.1


@pytest.mark.parametrize(
    "argv",
    [
        ["throughput", "--size", "31"],
        ["throughput", "--count", "0"],
        ["throughput", "--producers", "-1"],
        ["throughput", "--destination", "queue/x"],
        ["throughput", "--broker", "nohost"],
        ["throughput", "--processes", "many"],
        ["latency", "--rate", "0"],
        ["sync", "--rate", "-1"],
        ["latency", "--process-per-producer"],
        ["sync", "-H", "noheader"],
        ["throughput", "--drain-grace", "-1"],
        ["sync", "--broker-pid", "0"],
        ["nosuchscenario"],
    ],
)
def test_usage_errors_exit_with_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parse(*argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_parse_broker() -> None:
    assert parse_broker("host:1") == ("host", 1)
    assert parse_broker(":61613") == ("127.0.0.1", 61613)
    assert parse_broker("a:1,b:2") == ("a", 1)
    assert parse_broker("[::1]:7") == ("::1", 7)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_broker("host:70000")


def test_split_count() -> None:
    assert split_count(10, 3) == [4, 3, 3]
    assert split_count(2, 4) == [1, 1, 0, 0]
    assert sum(split_count(1_000_003, 7)) == 1_000_003


def test_split_processes_keeps_roles_apart() -> None:
    assert split_processes(1, 1, None) == (1, 1)
    assert split_processes(4, 4, 4) == (2, 2)
    assert split_processes(4, 4, 100) == (4, 4)
    assert split_processes(6, 2, 4) == (1, 3)
    assert split_processes(1, 1, 1) == (1, 1)  # at least one process per role
    consumers, producers = split_processes(8, 8, None)
    assert consumers >= 1
    assert producers >= 1


def test_split_processes_one_per_producer() -> None:
    assert split_processes(8, 1, None, process_per_producer=True) == (1, 8)
    assert split_processes(1, 1, None, process_per_producer=True) == (1, 1)
    # Explicit processes: the producers take theirs, the consumers what is left (at least one).
    assert split_processes(4, 4, 6, process_per_producer=True) == (2, 4)
    assert split_processes(4, 4, 2, process_per_producer=True) == (1, 4)
