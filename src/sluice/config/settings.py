"""Every setting of the broker, as frozen dataclasses with their defaults in one place, and the
checks a whole configuration must pass (`Config.validate`). Reading them from files, the
environment and the command line is `loading.py`'s job.

Names carry their unit (`_bytes`, `_ms`, `_s`).
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

DEFAULT_STOMP_HOST = "127.0.0.1"
DEFAULT_STOMP_PORT = 61613
# The management API, /metrics and the health checks (ActiveMQ's web console port).
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8161
# Destinations with series of their own in /metrics (`http.metrics_max_destinations`).
DEFAULT_METRICS_MAX_DESTINATIONS = 1000
# Console logins (`[http]`): sessions held at once, and how long one lasts idle and at most.
DEFAULT_CONSOLE_MAX_SESSIONS = 1000
DEFAULT_CONSOLE_SESSION_IDLE_S = 1800.0
DEFAULT_CONSOLE_SESSION_MAX_S = 43200.0

# Prefetch defaults as ActiveMQ's: credit in messages per subscription kind.
DEFAULT_QUEUE_PREFETCH = 1000
DEFAULT_TOPIC_PREFETCH = 32767
DEFAULT_DURABLE_PREFETCH = 100
# `x-dedup-id`s remembered per destination (`limits.dedup_window`).
DEFAULT_DEDUP_WINDOW = 10_000
# `[ha] lease_s`: how long a master's lease on a shared data directory lasts unrenewed.
DEFAULT_LEASE_S = 10.0
# The shortest and longest leases accepted: below one second a busy disk or a scheduling hiccup
# costs the master its lease; above ten minutes a failover takes longer than anyone waits.
MIN_LEASE_S = 1.0
MAX_LEASE_S = 600.0
# `[store] write_connections`: more than a few only adds commits waiting on the chain.
MAX_WRITE_CONNECTIONS = 4


class StoreKind(enum.Enum):
    """Which message store the broker runs on."""

    MEMORY = "memory"
    JOURNAL = "journal"
    POSTGRES = "postgres"


class SyncPolicy(enum.Enum):
    """When the journal writer syncs to disk."""

    ALWAYS = "always"
    PERIODIC = "periodic"
    NEVER = "never"


class StoreFullPolicy(enum.Enum):
    """What a persistent SEND meets when the store is full: `block` stops reading the producer's
    socket until there is room again; `error` answers with an ERROR that names the limit."""

    BLOCK = "block"
    ERROR = "error"


class JournalVerify(enum.Enum):
    """How much of the journal a start reads and checksums: `full` every record (damage anywhere
    stops the start), `after_checkpoint` only what the index does not hold yet (faster with a
    large backlog; damage before the checkpoint then shows when a message is read back)."""

    FULL = "full"
    AFTER_CHECKPOINT = "after_checkpoint"


class StreamPolicy(enum.Enum):
    """What happens to a stream whose consumer dies mid-way."""

    RESUME = "resume"
    RESTART = "restart"
    DISCARD = "discard"


@dataclass(frozen=True)
class Limits:
    """Every bound of the broker. Nothing that grows with input goes without one of these."""

    max_frame_bytes: int = 64 * MiB
    max_header_bytes: int = 64 * KiB
    max_headers: int = 1000
    max_connections: int = 20_000
    max_subscriptions_per_connection: int = 1000
    max_transactions_per_connection: int = 100
    # One transaction until its COMMIT: how many messages (SENDs) it may carry, and the bytes it
    # holds in memory meanwhile (the stub of each message, its headers and bookkeeping, while the
    # body waits in the store; the whole message with the memory store).
    max_transaction_messages: int = 1_000_000
    max_transaction_held_bytes: int = 256 * MiB
    max_open_streams_per_connection: int = 1000
    # Live streams a destination tracks for the idle abort (those whose end has not come).
    max_open_streams_per_destination: int = 10_000
    max_pending_receipts_per_connection: int = 10_000
    # Whole broker, messages held in memory (queued, paged in, in flight).
    memory_limit_bytes: int = 1 * GiB
    # One destination's share of that memory before its producers are paused.
    destination_memory_limit_bytes: int = 64 * MiB
    # Flow control resumes producers when usage falls below this fraction of the limit.
    memory_resume_ratio: float = 0.7
    max_async_writes: int = 10_000
    max_async_write_bytes: int = 64 * MiB
    # The temp store's disk (non-persistent messages spooled past the memory limits); the store's
    # own bound is `StoreConfig.max_bytes`. Both keep `StoreConfig.reserve_bytes` free on the disk
    # and follow `StoreConfig.store_full`.
    temp_limit_bytes: int = 50 * GiB
    write_buffer_high_bytes: int = 1 * MiB
    write_buffer_low_bytes: int = 256 * KiB
    slow_consumer_timeout_s: float = 30.0
    dedup_window: int = DEFAULT_DEDUP_WINDOW
    max_message_groups: int = 1024
    max_destinations: int = 100_000
    # Connecting and logging in. A client that has not sent CONNECT within `connect_timeout_s` is
    # closed. A failed login is answered `login_failure_delay_s` late; `login_lockout_failures`
    # failures within `login_lockout_window_s`, for one login name or from one address, refuse
    # every login of that name or address until the window has passed. Failures are remembered
    # for at most `max_login_failure_records` names and addresses (the oldest are forgotten).
    connect_timeout_s: float = 30.0
    login_failure_delay_s: float = 1.0
    login_lockout_failures: int = 5
    login_lockout_window_s: float = 300.0
    max_login_failure_records: int = 10_000
    # Connections one user (a login of the users file) may have open at once; 0: no limit.
    # Anonymous clients are bounded by `max_connections` alone.
    max_connections_per_user: int = 1000
    # -- Against hostile or broken clients (see docs/security.md) --
    # Bytes of frames still arriving (and frames read but not yet handled), all connections
    # together. Past it, the connection holding the largest partial frame gets an ERROR.
    max_inbound_buffered_bytes: int = 256 * MiB
    # The frame size allowed before a connection is CONNECTED (RabbitMQ's
    # max_frame_size_unauthenticated): CONNECT and nothing else needs more than this.
    max_frame_bytes_unauthenticated: int = 64 * KiB
    # A frame whose first byte came must be complete within this (0: no deadline). The clock
    # stops while the broker itself is not reading the connection (flow control).
    frame_timeout_s: float = 60.0
    # A connection without heart-beats from its peer that has sent nothing for this long and
    # holds nothing (no subscription, transaction, stream, receipt) is closed (0: never).
    idle_timeout_s: float = 600.0
    # Destinations one connection created that still exist (its own quota of max_destinations).
    max_destinations_per_connection: int = 10_000
    # The UTF-8 length of a destination name a client gives, prefix (/queue/, /topic/) included.
    max_destination_name_bytes: int = 512
    # An empty, unused destination is removed after this long (ActiveMQ's gcInactiveDestinations,
    # RabbitMQ's auto-delete); 0 keeps every destination for ever.
    destination_idle_timeout_s: float = 300.0


@dataclass(frozen=True)
class HeartBeatSettings:
    """Heart-beats the broker offers and the grace it allows a silent peer."""

    send_ms: int = 10_000
    receive_ms: int = 10_000
    grace_factor: float = 2.0


@dataclass(frozen=True)
class DestinationPolicy:
    """Per-destination behaviour. Applied to every destination unless a pattern overrides it."""

    max_redeliveries: int = 6
    dlq_prefix: str = "DLQ."
    # Dead letters of a topic go to the queue `<topic_dlq_prefix><topic name>`, apart from the
    # queues' (as ActiveMQ's individual dead-letter strategy keeps them).
    topic_dlq_prefix: str = "DLQ.Topic."
    queue_prefetch: int = DEFAULT_QUEUE_PREFETCH
    topic_prefetch: int = DEFAULT_TOPIC_PREFETCH
    durable_prefetch: int = DEFAULT_DURABLE_PREFETCH
    retention_bytes: int = 0
    retention_s: float = 0.0
    group_idle_timeout_s: float = 300.0
    stream_policy: StreamPolicy = StreamPolicy.RESUME
    stream_idle_timeout_s: float = 60.0


@dataclass(frozen=True)
class StoreConfig:
    """The message store and its journal."""

    kind: StoreKind = StoreKind.JOURNAL
    data_dir: Path = Path("data")
    journal_file_bytes: int = 32 * MiB
    sync: SyncPolicy = SyncPolicy.ALWAYS
    sync_interval_ms: int = 1000
    # With `sync = "always"`, removes nobody waits for (an ACK without a receipt, auto-ack, a
    # dead letter's original) and durable cursor moves are written at once but synced by the
    # next sync: a later synced batch, a rollover, a checkpoint, the close, or at the latest
    # `sync_interval_ms` after. After a power loss such a message may be delivered again, never
    # lost. True syncs every remove as it is written.
    sync_acks: bool = False
    checkpoint_interval_s: float = 5.0
    index_write_batch: int = 1000
    archive: bool = False
    compaction_live_ratio: float = 0.2
    gc_interval_s: float = 30.0
    concurrent_store_and_dispatch_queues: bool = True
    concurrent_store_and_dispatch_topics: bool = False
    repair: bool = False
    verify_journal: JournalVerify = JournalVerify.FULL
    lmdb_map_bytes: int = 64 * GiB
    # Disk as a bounded resource. `max_bytes`: what the store may hold (journal and index); 0 means
    # as much as the disk has free, less `reserve_bytes`. The reserve (0: two journal files) is
    # kept free in either case for what frees space: acks, checkpoints, compaction, the next
    # data file. At the limit, persistent producers meet `store_full`.
    max_bytes: int = 0
    reserve_bytes: int = 0
    store_full: StoreFullPolicy = StoreFullPolicy.BLOCK
    # The PostgreSQL store (`kind = "postgres"`): a libpq URI or key=value string, and the
    # PostgreSQL schema its tables go in (created and migrated at start). Kept out of the
    # dataclass's repr: the URL may carry a password. `data_dir` then holds only the temp store.
    url: str = field(default="", repr=False)
    schema: str = "sluice"
    # After losing its connection, how long the PostgreSQL store connects again while writes
    # wait (producers pause as they pile up) before it fails; 0 fails it at once.
    reconnect_s: float = 30.0
    # The PostgreSQL store's write connections: with 2, the next batch runs on one while a batch
    # commits on the other (kept in order by the database); 1 writes one batch at a time.
    write_connections: int = 2

    @property
    def disk_reserve_bytes(self) -> int:
        """The reserve in force: `reserve_bytes`, or two journal files when it is 0."""
        return self.reserve_bytes or 2 * self.journal_file_bytes


class ClientCertPolicy(enum.Enum):
    """Whether a TLS listener asks clients for a certificate: `none` never, `optional` asks and
    checks one if sent, `required` refuses the handshake without one. A certificate is checked
    against the listener's `ca`."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


@dataclass(frozen=True)
class TlsSettings:
    """A listener's (or `[http]`'s) `tls = {cert, key, ca, client_cert, crl}`: its certificate
    chain and private key (PEM, the key unencrypted), the CA bundle that client certificates must
    chain to, whether clients must present one, and the certificate revocation lists (PEM) a
    client certificate is checked against."""

    cert: Path
    key: Path
    ca: Path | None = None
    client_cert: ClientCertPolicy = ClientCertPolicy.NONE
    crl: Path | None = None


@dataclass(frozen=True)
class Listener:
    """A STOMP listener: its address, and TLS settings when it speaks TLS."""

    host: str = DEFAULT_STOMP_HOST
    port: int = DEFAULT_STOMP_PORT
    tls: TlsSettings | None = None

    def __str__(self) -> str:
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        return f"{address} (tls)" if self.tls is not None else address


@dataclass(frozen=True)
class HttpSettings:
    """`[http]`: the management API (`/api/`), Prometheus metrics (`/metrics`) and the health
    checks (`/healthz`, `/readyz`), served on the broker's event loop. On by default, on
    loopback; beyond loopback without users it is refused as a STOMP listener is.
    `metrics_max_destinations` bounds the destinations that get series of their own in
    `/metrics` (the busiest by depth first); the others are summed up and counted. With `tls`
    (the same table as a listener's) it serves HTTPS, and a verified client certificate logs
    its holder in as it does on a STOMP listener. `console` serves the web console at `/`;
    its logins are sessions, at most `console_max_sessions` at once (the least recently used
    goes first), each ending after `console_session_idle_s` unused or `console_session_max_s`
    in all (docs/console.md)."""

    enabled: bool = True
    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    metrics_max_destinations: int = DEFAULT_METRICS_MAX_DESTINATIONS
    tls: TlsSettings | None = None
    # STOMP over WebSocket at `/stomp`: the largest WebSocket message taken (0: the STOMP frame
    # limit, `limits.max_frame_bytes`), and the origins a browser page may connect from besides
    # the server's own (`*`: any).
    ws_max_message_bytes: int = 0
    ws_allowed_origins: tuple[str, ...] = ()
    console: bool = True
    console_max_sessions: int = DEFAULT_CONSOLE_MAX_SESSIONS
    console_session_idle_s: float = DEFAULT_CONSOLE_SESSION_IDLE_S
    console_session_max_s: float = DEFAULT_CONSOLE_SESSION_MAX_S


@dataclass(frozen=True)
class AuthSettings:
    """`[auth]`: who may connect. Without `users_file` every client is anonymous, which the broker
    allows on a loopback listener only, unless `allow_anonymous` is true. With `users_file`,
    `allow_anonymous` lets clients that send no `login` in as anonymous."""

    users_file: Path | None = None
    allow_anonymous: bool = False


# Who an `[[acl]]` rule names in `read`, `write` and `admin`: user or group names, or `*` for
# every client (anonymous ones too).
ACL_EVERYONE = "*"


@dataclass(frozen=True)
class AclRule:
    """One `[[acl]]` rule: the users and groups that may read, write or administer (create) the
    destinations `destination` matches (`/queue/...` or `/topic/...`, with the broker's
    wildcards). The first rule that matches a destination decides; once any rule exists, a
    destination no rule matches is refused to everyone."""

    destination: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()


@dataclass(frozen=True)
class DestinationOverride:
    """A policy for the destinations whose names match `pattern` (ActiveMQ wildcards, e.g.
    `/topic/events.>`). The first matching override wins; fields not given keep the defaults of
    `[policy]`."""

    pattern: str
    policy: DestinationPolicy


class HaRole(enum.Enum):
    """`[ha] role`: `off` (the default) runs as a plain broker, with no lease; `auto` takes the
    lease on the data directory before it opens the store, waiting while another broker holds
    it, and serves as master once it has it; `master-only` takes the lease if it is free and
    exits at once (non-zero) if another broker holds it, never waiting as a slave."""

    OFF = "off"
    AUTO = "auto"
    MASTER_ONLY = "master-only"


@dataclass(frozen=True)
class HaSettings:
    """`[ha]`: master/slave on a shared store (see docs/high-availability.md): the journal's
    data directory, or the PostgreSQL store's database, which then holds the lease. The master
    renews its lease every `lease_s / 3`; a waiting broker takes over once the lease has gone
    `lease_s` without a renewal (on a shared directory, at once when the master's process is
    gone from this machine)."""

    role: HaRole = HaRole.OFF
    lease_s: float = DEFAULT_LEASE_S


@dataclass(frozen=True)
class LatencySettings:
    """`[latency]`: measuring where a persistent SEND's time goes, hop by hop (`hops`), from its
    first byte read to its RECEIPT written; the histograms are logged when the broker stops (or
    on SIGUSR1) and written as JSON to `hops_file` when given. Needs the journal store."""

    hops: bool = False
    hops_file: Path | None = None


@dataclass(frozen=True)
class Config:
    """The whole broker configuration."""

    # The one-listener form; `listeners` (`[[listeners]]`), when given, replaces it.
    stomp: Listener = field(default_factory=Listener)
    listeners: tuple[Listener, ...] = ()
    limits: Limits = field(default_factory=Limits)
    heartbeat: HeartBeatSettings = field(default_factory=HeartBeatSettings)
    policy: DestinationPolicy = field(default_factory=DestinationPolicy)
    store: StoreConfig = field(default_factory=StoreConfig)
    destinations: tuple[DestinationOverride, ...] = ()
    auth: AuthSettings = field(default_factory=AuthSettings)
    acl: tuple[AclRule, ...] = ()
    http: HttpSettings = field(default_factory=HttpSettings)
    latency: LatencySettings = field(default_factory=LatencySettings)
    ha: HaSettings = field(default_factory=HaSettings)
    broker_name: str = "sluice"
    use_uvloop: bool = True

    @property
    def stomp_listeners(self) -> tuple[Listener, ...]:
        """The listeners the broker opens: `[[listeners]]`, or else `[stomp]`."""
        return self.listeners or (self.stomp,)

    @property
    def ws_max_message_bytes(self) -> int:
        """The largest WebSocket message `/stomp` takes: `[http] ws_max_message_bytes`, or else
        the STOMP frame limit (`limits.max_frame_bytes`)."""
        return self.http.ws_max_message_bytes or self.limits.max_frame_bytes

    def validate(self) -> Config:
        """Check cross-field rules; return self so calls chain."""
        lim = self.limits
        for f in dataclasses.fields(Limits):
            value = getattr(lim, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(f"limits.{f.name} must not be negative (got {value})")
        if lim.write_buffer_low_bytes > lim.write_buffer_high_bytes:
            raise ConfigError(
                "limits.write_buffer_low_bytes must not exceed write_buffer_high_bytes"
            )
        if lim.max_pending_receipts_per_connection < 1:
            raise ConfigError("limits.max_pending_receipts_per_connection must be at least 1")
        if lim.max_header_bytes > lim.max_frame_bytes:
            raise ConfigError("limits.max_header_bytes must not exceed max_frame_bytes")
        if lim.max_frame_bytes_unauthenticated < 1 * KiB:
            raise ConfigError("limits.max_frame_bytes_unauthenticated must be at least 1 KiB")
        if lim.max_inbound_buffered_bytes < lim.max_frame_bytes:
            raise ConfigError("limits.max_inbound_buffered_bytes must not be below max_frame_bytes")
        if lim.max_destination_name_bytes < 8:
            raise ConfigError("limits.max_destination_name_bytes must be at least 8")
        if not 0.0 < lim.memory_resume_ratio <= 1.0:
            raise ConfigError("limits.memory_resume_ratio must be in (0, 1]")
        store = self.store
        if store.journal_file_bytes < 1 * MiB:
            raise ConfigError("store.journal_file_bytes must be at least 1 MiB")
        if store.sync_interval_ms <= 0:
            raise ConfigError(
                f"store.sync_interval_ms must be positive (got {store.sync_interval_ms})"
            )
        for name in ("max_bytes", "reserve_bytes", "reconnect_s"):
            if getattr(store, name) < 0:
                raise ConfigError(f"store.{name} must not be negative (got {getattr(store, name)})")
        if not 1 <= store.write_connections <= MAX_WRITE_CONNECTIONS:
            raise ConfigError(
                f"store.write_connections must be 1 to {MAX_WRITE_CONNECTIONS} "
                f"(got {store.write_connections})"
            )
        if 0 < store.reserve_bytes < store.journal_file_bytes:
            raise ConfigError(
                f"store.reserve_bytes ({store.reserve_bytes}) must hold at least one journal file "
                f"(store.journal_file_bytes = {store.journal_file_bytes}), or be 0 for two"
            )
        _check_postgres(store)
        if not 0 <= self.stomp.port <= 65535:
            raise ConfigError(f"stomp.port out of range: {self.stomp.port}")
        if not 0 <= self.http.port <= 65535:
            raise ConfigError(f"http.port out of range: {self.http.port}")
        if self.http.metrics_max_destinations < 0:
            raise ConfigError("http.metrics_max_destinations must not be negative")
        if self.http.ws_max_message_bytes < 0:
            raise ConfigError("http.ws_max_message_bytes must not be negative")
        if self.http.enabled and self.http.tls is not None:
            _check_tls(self.http.tls, "[http]")
        self._check_console()
        self._check_listeners()
        if self.policy.max_redeliveries < 0:
            raise ConfigError("policy.max_redeliveries must not be negative")
        if lim.login_lockout_failures < 1:
            raise ConfigError("limits.login_lockout_failures must be at least 1")
        self._check_anonymous()
        self._check_latency()
        self._check_ha()
        return self

    def _check_console(self) -> None:
        http = self.http
        if http.console_max_sessions < 1:
            raise ConfigError("http.console_max_sessions must be at least 1")
        for name in ("console_session_idle_s", "console_session_max_s"):
            if getattr(http, name) <= 0:
                raise ConfigError(f"http.{name} must be positive (got {getattr(http, name)})")

    def _check_ha(self) -> None:
        ha = self.ha
        if not MIN_LEASE_S <= ha.lease_s <= MAX_LEASE_S:
            raise ConfigError(
                f"ha.lease_s must be between {MIN_LEASE_S:g} and {MAX_LEASE_S:g} s "
                f"(got {ha.lease_s:g})"
            )
        if ha.role is not HaRole.OFF and self.store.kind is StoreKind.MEMORY:
            raise ConfigError(
                f"ha.role = {ha.role.value!r} shares the store between brokers: it needs "
                "store.kind = 'journal' or 'postgres'"
            )

    def _check_latency(self) -> None:
        latency = self.latency
        if latency.hops_file is not None and not latency.hops:
            raise ConfigError("latency.hops_file is written only with latency.hops = true")
        if latency.hops and self.store.kind is not StoreKind.JOURNAL:
            raise ConfigError(
                "latency.hops times the journal writer's hops: it needs store.kind = 'journal'"
            )

    def _check_listeners(self) -> None:
        seen: set[tuple[str, int]] = set()
        for number, listener in enumerate(self.listeners, 1):
            where = f"[[listeners]] {number} ({listener})"
            if not 0 <= listener.port <= 65535:
                raise ConfigError(f"{where}: port out of range: {listener.port}")
            # Port 0 picks a free port each time, so it never collides.
            key = (listener.host, listener.port)
            if listener.port and key in seen:
                raise ConfigError(f"{where}: {listener.host}:{listener.port} is listed twice")
            seen.add(key)
            if listener.tls is not None:
                _check_tls(listener.tls, where)

    def _check_anonymous(self) -> None:
        # RabbitMQ's guest-on-loopback rule: without users, only this machine may connect.
        auth = self.auth
        if auth.users_file is not None or auth.allow_anonymous:
            return
        hosts = [
            ("stomp.host" if not self.listeners else "[[listeners]] host", listener.host)
            for listener in self.stomp_listeners
        ]
        if self.http.enabled:
            hosts.append(("http.host", self.http.host))
        for name, host in hosts:
            if is_loopback(host):
                continue
            raise ConfigError(
                f"{name} = {host!r} listens beyond loopback, and without [auth] "
                "users_file every client would connect anonymously: refusing to start. Set "
                "[auth] users_file (written by `sluice user add`), or set [auth] "
                "allow_anonymous = true to accept anonymous clients from the network"
            )


def _check_readable(path: Path, what: str, where: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the {what} {path}: {exc.strerror}") from None
    if not path.is_file():
        raise ConfigError(f"{where}: the {what} {path} is not a file")


_PG_SCHEMES = ("postgresql://", "postgres://")
_PG_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _check_postgres(store: StoreConfig) -> None:
    """`[store] url` and `schema` for the PostgreSQL store (the URL never appears in an error:
    it may carry a password)."""
    if not _PG_SCHEMA_NAME.fullmatch(store.schema):
        raise ConfigError(
            f"store.schema must be a lower-case PostgreSQL identifier of at most 63 characters "
            f"(letters, digits, _; got {store.schema!r})"
        )
    if store.kind is not StoreKind.POSTGRES:
        return
    url = store.url.strip()
    if not url:
        raise ConfigError(
            'store.kind = "postgres" needs store.url (e.g. "postgresql://sluice@127.0.0.1/sluice"'
            ", or --postgres-url)"
        )
    if "://" in url and not url.startswith(_PG_SCHEMES):
        scheme = url.split("://", 1)[0]
        raise ConfigError(
            f"store.url must be a postgresql:// URI or a key=value connection string "
            f"(got a {scheme}:// URL)"
        )
    if "://" not in url and "=" not in url:
        raise ConfigError("store.url must be a postgresql:// URI or a key=value connection string")


def _check_tls(tls: TlsSettings, where: str) -> None:
    """Files exist and can be read; what they hold is checked when the context is built."""
    if tls.client_cert is not ClientCertPolicy.NONE and tls.ca is None:
        raise ConfigError(
            f"{where}: tls.client_cert = {tls.client_cert.value!r} needs tls.ca, the CA "
            "certificates that client certificates must chain to"
        )
    _check_readable(tls.cert, "certificate (tls.cert)", where)
    _check_readable(tls.key, "private key (tls.key)", where)
    if tls.ca is not None:
        _check_readable(tls.ca, "CA file (tls.ca)", where)
    if tls.crl is not None:
        if tls.client_cert is ClientCertPolicy.NONE:
            raise ConfigError(
                f"{where}: tls.crl checks client certificates, which tls.client_cert = 'none' "
                "never asks for"
            )
        _check_readable(tls.crl, "revocation list (tls.crl)", where)


def is_loopback(host: str) -> bool:
    """Whether a listener bound to `host` is reachable from this machine only. Names other than
    `localhost` count as beyond loopback, and so does the empty host (every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
