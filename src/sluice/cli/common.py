"""What the command groups share: client options, the usage error, the runner type."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sluice.errors import SluiceError

__all__ = [
    "DEFAULT_BROKER",
    "Runner",
    "UsageError",
    "add_client_args",
    "add_tls_args",
    "client_options",
    "tls_options",
]

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
    add_tls_args(p)


def add_tls_args(p: argparse.ArgumentParser) -> None:
    """`--tls`, `--ca`, `--cert` and `--key`: dial a TLS listener."""
    g = p.add_argument_group("TLS")
    g.add_argument("--tls", action="store_true", help="connect with TLS (implied by the others)")
    g.add_argument("--ca", default=None, metavar="FILE", help="CA certificates (PEM) to trust")
    g.add_argument(
        "--cert", default=None, metavar="FILE", help="client certificate (PEM) to present"
    )
    g.add_argument("--key", default=None, metavar="FILE", help="its private key (PEM)")


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """The TLS keyword arguments of `Client.connect` that `add_tls_args`'s flags give."""
    return {"tls": args.tls, "ca": args.ca, "cert": args.cert, "key": args.key}


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `Client.connect` (and `BlockingClient`) that `add_client_args`'s
    flags give: credentials and TLS."""
    return {"login": args.login, "passcode": args.passcode, **tls_options(args)}
