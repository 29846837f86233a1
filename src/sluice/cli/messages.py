"""`sluice send` and `sluice recv`: one message out, messages in, from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from sluice.cli.common import Runner, UsageError, add_client_args, client_options
from sluice.cli.exitcodes import ExitCode

__all__ = ["add_parsers"]


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count of 0 or more, got {value!r}")
    return int(value)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {value!r}")
    return seconds


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `send` and `recv` to the subcommand parsers; return their runners by name."""
    s = sub.add_parser("send", help="send one message")
    add_client_args(s)
    s.add_argument("destination")
    s.add_argument("body", nargs="?", help="message body (default: read standard input)")
    s.add_argument("--persistent", action="store_true")
    s.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE")

    r = sub.add_parser("recv", help="receive messages and print their bodies")
    add_client_args(r)
    r.add_argument("destination")
    r.add_argument("-n", "--count", type=_count, default=1, help="messages to receive (0: forever)")
    r.add_argument(
        "--timeout", type=_seconds, default=None, help="seconds to wait for each message"
    )
    r.add_argument("--ack", choices=["auto", "client", "client-individual"], default="client")
    r.add_argument("--show-headers", action="store_true")
    return {"send": _run_send, "recv": _run_recv}


def _parse_headers(items: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name:
            raise UsageError(f"header must be NAME:VALUE, got {item!r}")
        headers.setdefault(name, value)
    return headers


def _run_send(args: argparse.Namespace) -> int:
    from sluice.client import BlockingClient  # noqa: PLC0415

    headers = _parse_headers(args.header)
    body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
    # With several --broker addresses, a failover while the message is on its way sends it again
    # to the next broker (with an x-dedup-id, so it is stored once).
    with BlockingClient(args.broker, resend=True, **client_options(args)) as client:
        client.send(args.destination, body, headers=headers, persistent=args.persistent)
    return ExitCode.OK


def _run_recv(args: argparse.Namespace) -> int:
    from sluice.client import BlockingClient  # noqa: PLC0415

    received = 0
    with BlockingClient(args.broker, **client_options(args)) as client:
        sub = client.subscribe(args.destination, ack=args.ack)
        while args.count == 0 or received < args.count:
            message = sub.receive(timeout=args.timeout)
            if message is None:
                print(f"sluice recv: no message within {args.timeout} s", file=sys.stderr)
                return ExitCode.FAILURE
            if args.show_headers:
                for name, value in message.headers.items():
                    print(f"{name}:{value}")
                print()
            sys.stdout.buffer.write(message.body + b"\n")
            sys.stdout.flush()
            if args.ack != "auto":
                client.ack(message)
            received += 1
    return ExitCode.OK
