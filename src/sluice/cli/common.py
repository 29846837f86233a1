"""What the command groups share: client options, the usage error, the runner type."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sluice.errors import SluiceError

__all__ = ["DEFAULT_BROKER", "Runner", "UsageError", "add_client_args"]

DEFAULT_BROKER = "127.0.0.1:61613"

# Runs one command on its parsed arguments and returns the exit code (an `ExitCode`).
Runner = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A command's arguments are wrong in a way argparse cannot see; the message says how."""


def _brokers(value: str) -> str:
    from sluice.client.address import parse_brokers  # noqa: PLC0415 - keeps start-up light

    try:
        parse_brokers(value)
    except SluiceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_client_args(p: argparse.ArgumentParser) -> None:
    """`--broker`, `--login` and `--passcode` of the commands that connect as a client."""
    p.add_argument(
        "--broker",
        default=DEFAULT_BROKER,
        type=_brokers,
        help="HOST:PORT of the broker; a comma-separated list fails over (default %(default)s)",
    )
    p.add_argument("--login", default=None)
    p.add_argument("--passcode", default=None)
