"""`sluice send` and `sluice recv` against a broker on port 0: bodies from the argument and from
standard input, headers, failover across a list of brokers, and the exit codes (0 success, 1
failure with a one-line reason, 2 usage error)."""

from __future__ import annotations

import pytest

from conftest import RunningBroker

from .conftest import sluice, stderr_lines


def test_body_from_the_argument(broker: RunningBroker) -> None:
    sent = sluice("send", "/queue/cli", "hello there", "--broker", broker.address)
    assert sent.returncode == 0, sent.stderr
    got = sluice("recv", "/queue/cli", "--broker", broker.address, "--timeout", "10")
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"hello there\n"


def test_body_from_standard_input_byte_for_byte(broker: RunningBroker) -> None:
    body = b"line one\nline two\x00after a NUL\xff\xfe"
    sent = sluice("send", "/queue/stdin", "--broker", broker.address, stdin=body)
    assert sent.returncode == 0, sent.stderr
    got = sluice("recv", "/queue/stdin", "--broker", broker.address, "--timeout", "10")
    assert got.returncode == 0, got.stderr
    assert got.stdout == body + b"\n"


def test_headers_travel_with_the_message(broker: RunningBroker) -> None:
    sent = sluice(
        "send",
        "/queue/headers",
        "x",
        "-H",
        "color:blue",
        "--header",
        "trace:a:b",
        "-H",
        "color:red",  # the first of repeated headers wins, as on the wire
        "--broker",
        broker.address,
    )
    assert sent.returncode == 0, sent.stderr
    got = sluice(
        "recv", "/queue/headers", "--show-headers", "--broker", broker.address, "--timeout", "10"
    )
    assert got.returncode == 0, got.stderr
    lines = got.stdout.decode().splitlines()
    assert "color:blue" in lines
    assert "trace:a:b" in lines
    assert "color:red" not in lines
    assert lines[-1] == "x"


def test_recv_takes_count_messages_and_acknowledges_them(broker: RunningBroker) -> None:
    for body in ("one", "two", "three"):
        assert sluice("send", "/queue/n", body, "--broker", broker.address).returncode == 0
    got = sluice("recv", "/queue/n", "-n", "3", "--broker", broker.address, "--timeout", "10")
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"one\ntwo\nthree\n"
    # Acknowledged: nothing comes back.
    again = sluice("recv", "/queue/n", "--broker", broker.address, "--timeout", "0.5")
    assert again.returncode == 1
    assert again.stdout == b""


def test_persistent_send_is_stored_before_it_returns(broker: RunningBroker) -> None:
    sent = sluice("send", "/queue/p", "kept", "--persistent", "--broker", broker.address)
    assert sent.returncode == 0, sent.stderr
    got = sluice(
        "recv", "/queue/p", "--show-headers", "--broker", broker.address, "--timeout", "10"
    )
    assert "persistent:true" in got.stdout.decode().splitlines()


def test_failover_to_the_next_broker_of_the_list(
    broker: RunningBroker, refused_address: str
) -> None:
    brokers = f"{refused_address},{broker.address}"
    sent = sluice("send", "/queue/failover", "through", "--broker", brokers)
    assert sent.returncode == 0, sent.stderr
    got = sluice("recv", "/queue/failover", "--broker", brokers, "--timeout", "10")
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"through\n"


def test_no_message_within_the_timeout_is_a_failure(broker: RunningBroker) -> None:
    got = sluice("recv", "/queue/empty", "--broker", broker.address, "--timeout", "0.3")
    assert got.returncode == 1
    assert stderr_lines(got) == ["sluice recv: no message within 0.3 s"]


def test_unreachable_broker_is_a_failure_with_one_line(refused_address: str) -> None:
    for command in (["send", "/queue/a", "x"], ["recv", "/queue/a", "--timeout", "1"]):
        result = sluice(*command, "--broker", refused_address)
        assert result.returncode == 1
        (line,) = stderr_lines(result)
        assert line.startswith(f"sluice {command[0]}: ")
        assert refused_address in line


def test_broker_error_is_a_failure_with_one_line(broker: RunningBroker) -> None:
    result = sluice("send", "nowhere", "x", "--broker", broker.address)
    assert result.returncode == 1
    (line,) = stderr_lines(result)
    assert line.startswith("sluice send: ")
    assert "nowhere" in line


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["send"], "the following arguments are required: destination"),
        (["send", "/queue/a", "x", "-H", "no-colon"], "header must be NAME:VALUE"),
        (["send", "/queue/a", "x", "-H", ":empty-name"], "header must be NAME:VALUE"),
        (["send", "/queue/a", "x", "--broker", "host:port"], "argument --broker"),
        (["recv", "/queue/a", "-n", "-1"], "argument -n/--count"),
        (["recv", "/queue/a", "--timeout", "0"], "argument --timeout"),
        (["recv", "/queue/a", "--ack", "sometimes"], "argument --ack"),
        (["frobnicate"], "argument command"),
    ],
)
def test_usage_errors_exit_with_2_and_say_why(args: list[str], reason: str) -> None:
    result = sluice(*args)
    assert result.returncode == 2
    assert reason in stderr_lines(result)[-1]
    assert b"Traceback" not in result.stderr
