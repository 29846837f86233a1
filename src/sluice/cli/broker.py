"""`sluice broker`: run the broker until SIGINT or SIGTERM; SIGHUP reloads the users file and
the `[[acl]]` rules; with `--latency-hops`, SIGUSR1 reports the per-hop latency so far. With
`[ha] role`, it first takes the lease on its store (`sluice.ha`), waiting as a slave
while another broker holds it; it opens nothing and listens nowhere until then."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice import __version__
from sluice import config as config_mod
from sluice.cli.collector import FreezeSurvivors
from sluice.cli.common import Runner
from sluice.cli.exitcodes import ExitCode
from sluice.cli.logformat import LogFormat
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.ha import Lease

__all__ = ["add_parsers"]

log = logging.getLogger("sluice")

# A stopping broker exits within this, whatever state its disk is in.
SHUTDOWN_TIMEOUT_S = 8.0


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _store_where(store: config_mod.StoreConfig) -> str:
    """Where the store keeps its data, for the start line (a URL without its password)."""
    if store.kind is config_mod.StoreKind.JOURNAL:
        return f", data: {store.data_dir}"
    if store.kind is config_mod.StoreKind.POSTGRES:
        from sluice.store.postgres.urls import safe_url  # noqa: PLC0415 - psycopg only then

        return f", {safe_url(store.url)} schema {store.schema}"
    return ""


def _broker_config(args: argparse.Namespace) -> config_mod.Config:
    overrides: dict[str, dict[str, Any]] = {}
    if args.stomp is not None:
        overrides["stomp"] = {"host": args.stomp[0], "port": args.stomp[1]}
    if args.no_http:
        overrides["http"] = {"enabled": False}
    elif args.http is not None:
        overrides["http"] = {"enabled": True, "host": args.http[0], "port": args.http[1]}
    store: dict[str, Any] = {}
    if args.data is not None:
        store["data_dir"] = str(args.data)
    if args.store is not None:
        store["kind"] = args.store
    if args.postgres_url is not None:
        store["url"] = args.postgres_url
    if args.repair:
        store["repair"] = True
    if store:
        overrides["store"] = store
    if args.ha_role is not None:
        overrides["ha"] = {"role": args.ha_role}
    if args.latency_hops or args.latency_hops_file is not None:
        overrides["latency"] = {"hops": True}
        if args.latency_hops_file is not None:
            overrides["latency"]["hops_file"] = str(args.latency_hops_file)
    return config_mod.load(args.config, overrides=overrides)


def _run_broker(args: argparse.Namespace) -> int:
    cfg = _broker_config(args)
    if cfg.use_uvloop:
        try:
            import uvloop  # noqa: PLC0415

            uvloop.install()
        except ImportError:
            log.info("uvloop is not installed; using the default event loop")

    lease: Lease | None = None
    if cfg.ha.role is not config_mod.HaRole.OFF:
        lease = _take_lease(cfg)
        if lease is None:
            return ExitCode.OK if cfg.ha.role is config_mod.HaRole.AUTO else ExitCode.FAILURE

    async def serve() -> None:
        from sluice.ha import FileLease  # noqa: PLC0415
        from sluice.server.listener import BrokerServer  # noqa: PLC0415
        from sluice.server.stores import open_stores  # noqa: PLC0415

        if lease is None or isinstance(lease, FileLease):
            # A lease taken because it went unrenewed: its holder may be frozen, not dead.
            store, temp_store = open_stores(
                cfg,
                fence=lease,
                detach_previous_master=lease is not None and lease.previous_may_be_alive,
            )
        else:
            from sluice.ha.pglease import PgLease  # noqa: PLC0415 - psycopg only then

            assert isinstance(lease, PgLease), lease
            # The PostgreSQL store's lease fences each batch in the database too.
            store, temp_store = open_stores(cfg, database_fence=lease)
        server = BrokerServer(cfg, store, temp_store=temp_store)
        await server.start()
        management = None
        if cfg.http.enabled:
            from sluice.http import ManagementServer  # noqa: PLC0415

            management = ManagementServer(server)
            try:
                await management.start()
            except BaseException:
                await server.stop()
                raise
        freezer = _freeze_startup_objects()
        # Until here a signal ends the process at once (a start is recovery: nothing to lose);
        # from the line that says the broker listens, it stops the broker cleanly.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, _reload, args, server)
        if server.latency is not None:
            loop.add_signal_handler(signal.SIGUSR1, server.report_latency)
        if management is not None:
            _announce(args, f"sluice management API on {management.url}")
        _announce(
            args,
            f"sluice {__version__} listening on "
            + ", ".join(str(bound) for bound in server.listeners)
            + " "
            f"(store: {cfg.store.kind.value}"
            + _store_where(cfg.store)
            + (f", ha: master at epoch {lease.epoch}" if lease is not None else "")
            + ")",
        )
        await stop.wait()
        # Whatever the disk does, the broker is gone within SHUTDOWN_TIMEOUT_S: past it, it
        # exits as after a crash (the next start replays the journal from its last checkpoint).
        watchdog = threading.Timer(SHUTDOWN_TIMEOUT_S, _stop_now)
        watchdog.daemon = True
        watchdog.start()
        if management is not None:
            await management.stop()
        await server.stop()
        watchdog.cancel()
        freezer.uninstall()

    try:
        asyncio.run(serve())
    finally:
        if lease is not None:
            lease.release()
    return ExitCode.OK


def _take_lease(cfg: config_mod.Config) -> Lease | None:
    """Take the lease on the store before anything is opened (on the data directory, or in the
    PostgreSQL store's database): wait for it as a slave
    (`role = "auto"`) or not at all (`master-only`). SIGINT or SIGTERM while waiting ends the
    wait at once (a waiting slave never holds up a rolling deploy): None is returned, as it is
    when `master-only` finds the lease held."""
    from sluice.ha import FileLease  # noqa: PLC0415 - only with [ha]

    lease: Lease
    where: object
    if cfg.store.kind is config_mod.StoreKind.POSTGRES:
        from sluice.ha.pglease import PgLease  # noqa: PLC0415 - psycopg only then

        lease = PgLease(cfg.store.url, cfg.ha.lease_s, schema=cfg.store.schema, on_lost=_lease_lost)
        where = f"the database (schema {cfg.store.schema})"
    else:
        lease = FileLease(cfg.store.data_dir, cfg.ha.lease_s, on_lost=_lease_lost)
        where = cfg.store.data_dir
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda _signo, _frame: stop.set())
    try:
        log.info("taking the lease on %s as %s", where, lease.holder)
        epoch = lease.acquire(stop, wait=cfg.ha.role is config_mod.HaRole.AUTO)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if epoch is None:
        if stop.is_set():
            log.warning("stopped while waiting for the lease on %s", where)
        else:
            print(
                f"sluice broker: the lease on {where} is held by another broker "
                "(ha.role = master-only)",
                file=sys.stderr,
                flush=True,
            )
        return None
    lease.start_renewing()
    return lease


def _lease_lost(reason: str) -> None:
    """Another broker has the store, or may have it any moment: stop serving at once. Nothing
    is closed cleanly (a clean close writes: a checkpoint, the index): the listeners close with
    the process, and clients fail over to the new master."""
    log.critical("exiting at once without writing: the lease is lost (%s)", reason)
    logging.shutdown()
    os._exit(ExitCode.LEASE_LOST)


def _announce(args: argparse.Namespace, text: str) -> None:
    """Say where the broker serves, on standard error whatever the log level (scripts wait for
    these lines): as text, or as a JSON log line with `--log-format json`, so that every line
    is one."""
    if args.log_format is LogFormat.JSON:
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, text, (), None))
    else:
        print(text, file=sys.stderr, flush=True)


def _freeze_startup_objects() -> FreezeSurvivors:
    """Keep long-lived objects out of the cyclic garbage collector's sight (`collector`): first
    what the start built (modules, configuration, the recovered state), then what survives each
    full collection, such as queued messages. A full collection visits every tracked object it
    sees, a pause of the event loop at a moment nobody chooses."""
    freezer = FreezeSurvivors()
    freezer.install()
    log.info("%d objects of the start frozen out of garbage collection", gc.get_freeze_count())
    return freezer


def _reload(args: argparse.Namespace, server: Any) -> None:
    """SIGHUP: read the configuration again and apply its [auth] and [[acl]] (only those)."""
    try:
        server.reload_auth(_broker_config(args))
    except SluiceError as exc:
        # The users and rules in force stay; nothing is half applied.
        log.error("reload refused, keeping the users and access rules in force: %s", exc)
    else:
        log.warning("reloaded the users file and access rules")


def _stop_now() -> None:
    log.error(
        "the broker did not stop within %.0f s; exiting now (the next start recovers from the "
        "journal)",
        SHUTDOWN_TIMEOUT_S,
    )
    logging.shutdown()
    os._exit(ExitCode.FAILURE)


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `broker` to the subcommand parsers; return its runner by name."""
    b = sub.add_parser("broker", help="run the broker")
    b.add_argument("--config", type=Path, help="TOML configuration file")
    b.add_argument(
        "--stomp",
        type=_host_port,
        help="listen on HOST:PORT (default 127.0.0.1:61613); [[listeners]] in the configuration "
        "file give several, plain or TLS",
    )
    b.add_argument(
        "--http",
        type=_host_port,
        help="serve the management API, /metrics and the health checks on HOST:PORT "
        "(default 127.0.0.1:8161, [http] in the configuration file)",
    )
    b.add_argument(
        "--no-http", action="store_true", help="no management API, /metrics or health checks"
    )
    b.add_argument(
        "--log-format",
        type=LogFormat,
        choices=list(LogFormat),
        default=LogFormat.TEXT,
        metavar="text|json",
        help="log lines as text (default) or one JSON object per line (ts, level, logger, "
        "message, and connection_id, session, peer, user where known)",
    )
    b.add_argument("--data", type=Path, help="data directory of the journal store")
    b.add_argument("--store", choices=["memory", "journal", "postgres"], help="message store")
    b.add_argument(
        "--postgres-url",
        metavar="URL",
        help="the PostgreSQL store's database, postgresql://USER@HOST:PORT/DB (store.url)",
    )
    b.add_argument("--repair", action="store_true", help="skip damaged journal records on start")
    b.add_argument(
        "--ha-role",
        choices=[role.value for role in config_mod.HaRole],
        help="high availability on a shared data directory ([ha] role): auto waits for the "
        "lease as a slave, master-only exits if another broker holds it, off (the default) "
        "takes no lease",
    )
    b.add_argument(
        "--latency-hops",
        action="store_true",
        help="time every persistent SEND with a receipt hop by hop, from its first byte read to "
        "its RECEIPT written; the histograms are logged at stop and on SIGUSR1 (journal store)",
    )
    b.add_argument(
        "--latency-hops-file",
        type=Path,
        metavar="FILE",
        help="also write them to FILE as JSON (implies --latency-hops)",
    )
    return {"broker": _run_broker}
