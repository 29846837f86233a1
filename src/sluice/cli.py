"""The one entry point: `sluice broker|send|recv|put|get|store|bench ...` (also `python -m sluice`).

Exit codes: 0 success, 1 failure with a one-line reason on stderr, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sluice import __version__
from sluice import config as config_mod
from sluice.errors import SluiceError

log = logging.getLogger("sluice")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

DEFAULT_BROKER = "127.0.0.1:61613"
# A stopping broker exits within this, whatever state its disk is in.
SHUTDOWN_TIMEOUT_S = 8.0


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit code 2 with a one-line reason
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _brokers(value: str) -> str:
    from sluice.client.address import parse_brokers  # noqa: PLC0415 - keeps start-up light

    try:
        parse_brokers(value)
    except SluiceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


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


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        default=DEFAULT_BROKER,
        type=_brokers,
        help="HOST:PORT of the broker; a comma-separated list fails over (default %(default)s)",
    )
    p.add_argument("--login", default=None)
    p.add_argument("--passcode", default=None)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="sluice", description="Sluice, a persistent STOMP message broker.")
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("broker", help="run the broker")
    b.add_argument("--config", type=Path, help="TOML configuration file")
    b.add_argument("--stomp", type=_host_port, help="listen on HOST:PORT (default 127.0.0.1:61613)")
    b.add_argument("--data", type=Path, help="data directory of the journal store")
    b.add_argument("--store", choices=["memory", "journal"], help="message store")
    b.add_argument("--repair", action="store_true", help="skip damaged journal records on start")

    s = sub.add_parser("send", help="send one message")
    _client_args(s)
    s.add_argument("destination")
    s.add_argument("body", nargs="?", help="message body (default: read standard input)")
    s.add_argument("--persistent", action="store_true")
    s.add_argument("-H", "--header", action="append", default=[], metavar="NAME:VALUE")

    r = sub.add_parser("recv", help="receive messages and print their bodies")
    _client_args(r)
    r.add_argument("destination")
    r.add_argument("-n", "--count", type=_count, default=1, help="messages to receive (0: forever)")
    r.add_argument(
        "--timeout", type=_seconds, default=None, help="seconds to wait for each message"
    )
    r.add_argument("--ack", choices=["auto", "client", "client-individual"], default="client")
    r.add_argument("--show-headers", action="store_true")

    from sluice.cli_transfer import add_transfer_parsers  # noqa: PLC0415

    add_transfer_parsers(sub, _client_args)

    st = sub.add_parser("store", help="offline tools for a journal data directory")
    st.add_argument("action", choices=["verify", "dump", "rebuild-index", "compact"])
    st.add_argument("data_dir", type=Path)

    from sluice.bench.cli import add_bench_parser  # noqa: PLC0415 - keeps start-up light

    add_bench_parser(sub)
    return parser


# One-shot client commands: a failure is one line on stderr, so the client's own warnings
# (a broker's ERROR, a reconnect) are shown only with -v.
_QUIET_COMMANDS = frozenset({"send", "recv"})


def _setup_logging(verbose: int, command: str) -> None:
    quiet = logging.ERROR if command in _QUIET_COMMANDS else logging.WARNING
    level = quiet if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def _broker_config(args: argparse.Namespace) -> config_mod.Config:
    overrides: dict[str, dict[str, Any]] = {}
    if args.stomp is not None:
        overrides["stomp"] = {"host": args.stomp[0], "port": args.stomp[1]}
    store: dict[str, Any] = {}
    if args.data is not None:
        store["data_dir"] = str(args.data)
    if args.store is not None:
        store["kind"] = args.store
    if args.repair:
        store["repair"] = True
    if store:
        overrides["store"] = store
    return config_mod.load(args.config, overrides=overrides)


def _run_broker(args: argparse.Namespace) -> int:
    cfg = _broker_config(args)
    if cfg.use_uvloop:
        try:
            import uvloop  # noqa: PLC0415

            uvloop.install()
        except ImportError:
            log.info("uvloop is not installed; using the default event loop")

    async def serve() -> None:
        from sluice.server.listener import BrokerServer  # noqa: PLC0415
        from sluice.server.stores import open_stores  # noqa: PLC0415

        store, temp_store = open_stores(cfg)
        server = BrokerServer(cfg, store, temp_store=temp_store)
        await server.start()
        # Until here a signal ends the process at once (a start is recovery: nothing to lose);
        # from the line that says the broker listens, it stops the broker cleanly.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(
            f"sluice {__version__} listening on {cfg.stomp.host}:{server.port} "
            f"(store: {cfg.store.kind.value}"
            + (f", data: {cfg.store.data_dir}" if cfg.store.kind.value == "journal" else "")
            + ")",
            file=sys.stderr,
            flush=True,
        )
        await stop.wait()
        # Whatever the disk does, the broker is gone within SHUTDOWN_TIMEOUT_S: past it, it
        # exits as after a crash (the next start replays the journal from its last checkpoint).
        watchdog = threading.Timer(SHUTDOWN_TIMEOUT_S, _stop_now)
        watchdog.daemon = True
        watchdog.start()
        await server.stop()
        watchdog.cancel()

    asyncio.run(serve())
    return EXIT_OK


def _stop_now() -> None:
    log.error(
        "the broker did not stop within %.0f s; exiting now (the next start recovers from the "
        "journal)",
        SHUTDOWN_TIMEOUT_S,
    )
    logging.shutdown()
    os._exit(EXIT_FAILURE)


def _parse_headers(items: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name:
            raise _UsageError(f"header must be NAME:VALUE, got {item!r}")
        headers.setdefault(name, value)
    return headers


def _run_send(args: argparse.Namespace) -> int:
    from sluice.client import BlockingClient  # noqa: PLC0415

    headers = _parse_headers(args.header)
    body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
    with BlockingClient(args.broker, login=args.login, passcode=args.passcode) as client:
        client.send(args.destination, body, headers=headers, persistent=args.persistent)
    return EXIT_OK


def _run_recv(args: argparse.Namespace) -> int:
    from sluice.client import BlockingClient  # noqa: PLC0415

    received = 0
    with BlockingClient(args.broker, login=args.login, passcode=args.passcode) as client:
        sub = client.subscribe(args.destination, ack=args.ack)
        while args.count == 0 or received < args.count:
            message = sub.receive(timeout=args.timeout)
            if message is None:
                print(f"sluice recv: no message within {args.timeout} s", file=sys.stderr)
                return EXIT_FAILURE
            if args.show_headers:
                for name, value in message.headers.items():
                    print(f"{name}:{value}")
                print()
            sys.stdout.buffer.write(message.body + b"\n")
            sys.stdout.flush()
            if args.ack != "auto":
                client.ack(message)
            received += 1
    return EXIT_OK


def _run_store(args: argparse.Namespace) -> int:
    from sluice.store.journal import tools  # noqa: PLC0415 - offline tools only

    data_dir: Path = args.data_dir
    if not (data_dir / "journal").is_dir():
        print(f"sluice store: {data_dir} has no journal/ directory", file=sys.stderr)
        return EXIT_FAILURE
    action = args.action
    if action == "dump":
        tools.dump(data_dir, sys.stdout)
        return EXIT_OK
    if action == "verify":
        report = tools.verify(data_dir)
        print("\n".join(report.lines))
        return EXIT_OK if report.ok else EXIT_FAILURE
    if action == "rebuild-index":
        print("\n".join(tools.rebuild_index(data_dir).lines))
        return EXIT_OK
    print("\n".join(tools.compact(data_dir).lines()) or "nothing to compact")
    return EXIT_OK


def _run_put(args: argparse.Namespace) -> int:
    from sluice.cli_transfer import run_put  # noqa: PLC0415

    return run_put(args)


def _run_get(args: argparse.Namespace) -> int:
    from sluice.cli_transfer import run_get  # noqa: PLC0415

    return run_get(args)


def _run_bench(args: argparse.Namespace) -> int:
    from sluice.bench.cli import run_bench  # noqa: PLC0415 - keeps start-up light

    return run_bench(args)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "broker": _run_broker,
    "send": _run_send,
    "recv": _run_recv,
    "put": _run_put,
    "get": _run_get,
    "store": _run_store,
    "bench": _run_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.command)
    try:
        return _COMMANDS[args.command](args)
    except _UsageError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SluiceError as exc:
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        print(f"sluice {args.command}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_FAILURE
