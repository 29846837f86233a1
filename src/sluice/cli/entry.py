"""The one entry point: `sluice broker|send|recv|put|get|store|bench|user|admin ...` (also
`python -m sluice`).

`build_parser` asks each command group (`broker`, `messages`, `transfer`, `store`, `bench`,
`users`, `admin`) to add its subcommands; `main` runs the one named. Exit codes are `ExitCode`s: 0
success, 1 failure with a one-line reason on stderr, 2 usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from sluice import __version__
from sluice.cli import admin, bench, broker, messages, store, transfer, users
from sluice.cli.common import Runner, UsageError
from sluice.cli.exitcodes import ExitCode
from sluice.cli.logformat import LogFormat, setup_logging
from sluice.errors import SluiceError

__all__ = ["build_parser", "main"]

# One-shot client commands: a failure is one line on stderr, so the client's own warnings
# (a broker's ERROR, a reconnect) are shown only with -v.
_QUIET_COMMANDS = frozenset({"send", "recv"})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit code 2 with a one-line reason
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)


def _parser_and_commands() -> tuple[argparse.ArgumentParser, dict[str, Runner]]:
    parser = _Parser(prog="sluice", description="Sluice, a persistent STOMP message broker.")
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands: dict[str, Runner] = {}
    for group in (broker, messages, transfer, store, bench, users, admin):
        commands.update(group.add_parsers(sub))
    return parser, commands


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    return _parser_and_commands()[0]


def _setup_logging(verbose: int, command: str, log_format: LogFormat) -> None:
    quiet = logging.ERROR if command in _QUIET_COMMANDS else logging.WARNING
    level = quiet if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    setup_logging(level, log_format)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser, commands = _parser_and_commands()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.command, getattr(args, "log_format", LogFormat.TEXT))
    try:
        return commands[args.command](args)
    except UsageError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except SluiceError as exc:
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    except OSError as exc:
        print(f"sluice {args.command}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.FAILURE
    except KeyboardInterrupt:
        return ExitCode.FAILURE
