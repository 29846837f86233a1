"""The options of the `sluice` and `sluice-journal` data sources, parsed and checked once.

Spark hands options over as a case-insensitive mapping of strings; these functions turn them into
frozen dataclasses (names as in Spark's Kafka source where one exists) and raise `OptionError`
naming the option at fault. The dataclasses are small and picklable: Spark ships them to
executors inside the reader and writer objects.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.config import DEFAULT_DEDUP_WINDOW, DEFAULT_STOMP_HOST, DEFAULT_STOMP_PORT
from sluice.spark.names import (
    JOURNAL_OPTIONS,
    KAFKA_SINK_EQUIVALENTS,
    KAFKA_SOURCE_EQUIVALENTS,
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    OptionError,
    check_names,
)

__all__ = [
    "DEFAULT_BROKER",
    "DEFAULT_CLIENT_ID",
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_PREFETCH",
    "DEFAULT_TIMEOUT_MS",
    "EARLIEST",
    "FETCH_BLOCKS",
    "FETCH_FRAMES",
    "LATEST",
    "SCHEMA_KAFKA",
    "SCHEMA_SLUICE",
    "SEND_BLOCKS",
    "SEND_FRAMES",
    "JournalOptions",
    "OptionError",
    "SinkOptions",
    "SourceOptions",
    "TlsOptions",
    "journal_options",
    "sink_options",
    "source_options",
]

DEFAULT_BROKER = f"{DEFAULT_STOMP_HOST}:{DEFAULT_STOMP_PORT}"
DEFAULT_CLIENT_ID = "sluice-spark"
# Messages the broker may send a reading task ahead of its acknowledgements.
DEFAULT_PREFETCH = 1000
DEFAULT_TIMEOUT_MS = 30_000
EARLIEST = "earliest"
LATEST = "latest"
# Values of the source's `schema` option: Sluice's columns, or Kafka's (key, value, ...).
SCHEMA_SLUICE = "sluice"
SCHEMA_KAFKA = "kafka"
# Values of the source's `fetch` option: range blocks (many messages per frame), or one MESSAGE
# frame per message through a subscription (for brokers without range reads).
FETCH_BLOCKS = "blocks"
FETCH_FRAMES = "frames"
# Values of the sink's `send` option: records blocks (many rows per SEND), or one SEND per row.
SEND_BLOCKS = "blocks"
SEND_FRAMES = "frames"
_TOPIC_PREFIX = "/topic/"
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


@dataclass(frozen=True)
class TlsOptions:
    """Options `tls` (true), `tls.ca`, `tls.cert`, `tls.key` and `tls.keyPassword`: how to dial a
    TLS listener (see `sluice.client.tls.client_context`). Files are read where the connection
    is made, driver or executor, so they must be at the same path on every node. The key password
    stays out of `repr`."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    key_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class SourceOptions:
    """Options of `spark.read[Stream].format("sluice")`.

    `starting` and `ending` are `earliest`, `latest` or a sequence number as text; `ending` is
    exclusive (the first offset not read), as Kafka's `endingOffsets`.
    """

    broker: str
    topic: str
    subscription: str | None = None
    client_id: str = DEFAULT_CLIENT_ID
    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    tls: TlsOptions | None = None
    starting: str = LATEST
    ending: str = LATEST
    max_offsets_per_trigger: int | None = None
    min_partitions: int = 1
    fail_on_data_loss: bool = True
    fail_on_unknown_topic: bool = True
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    prefetch: int = DEFAULT_PREFETCH
    schema: str = SCHEMA_SLUICE
    fetch: str = FETCH_BLOCKS

    @property
    def timeout_s(self) -> float:
        """`timeout_ms` in seconds."""
        return self.timeout_ms / 1000.0


@dataclass(frozen=True)
class SinkOptions:
    """Options of `df.write[Stream].format("sluice")`."""

    broker: str
    destination: str | None = None
    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    tls: TlsOptions | None = None
    persistent: bool = True
    write_id: str | None = None
    dedup_window: int = DEFAULT_DEDUP_WINDOW
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    send: str = SEND_BLOCKS

    @property
    def timeout_s(self) -> float:
        """`timeout_ms` in seconds."""
        return self.timeout_ms / 1000.0


@dataclass(frozen=True)
class JournalOptions:
    """Options of `spark.read.format("sluice-journal").load(path)`.

    `path` is absolute: a relative one is resolved against the working directory of the process
    that plans the read (next to the driver), as executors run elsewhere, in directories of their
    own.
    """

    path: str
    fail_on_corruption: bool = False


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _int(options: dict[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw[:40]!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be at least {minimum}, got {value}")
    return value


def _bool(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise OptionError(f"option {name} must be true or false, got {raw[:40]!r}")


def _offset_spec(options: dict[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in allowed:
        return text
    if text.isdigit():
        return str(int(text))
    raise OptionError(
        f"option {name} must be {' or '.join(allowed)} or a sequence number, got {raw[:40]!r}"
    )


def _choice(options: dict[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text not in allowed:
        raise OptionError(f"option {name} must be {' or '.join(allowed)}, got {raw[:40]!r}")
    return text


def _text(options: dict[str, str], name: str) -> str | None:
    raw = options.get(name.lower())
    if raw is None or not raw.strip():
        return None
    return raw.strip()


def _tls(options: dict[str, str]) -> TlsOptions | None:
    files = {name: _text(options, f"tls.{name}") for name in ("ca", "cert", "key")}
    key_password = options.get("tls.keypassword")
    if not _bool(options, "tls", False) and not any(files.values()):
        if key_password is not None:
            raise OptionError("option tls.keyPassword needs tls.cert and tls.key")
        return None
    if files["key"] is not None and files["cert"] is None:
        raise OptionError("option tls.key needs tls.cert, the client certificate")
    return TlsOptions(key_password=key_password, **files)


def topic_name(raw: str) -> str:
    """`/topic/NAME` for `NAME` or `/topic/NAME`; queues cannot be read as logs."""
    name = raw.strip()
    if name.startswith("/queue/"):
        raise OptionError(f"option topic must name a topic, got the queue {name!r}")
    if not name.startswith(_TOPIC_PREFIX):
        name = _TOPIC_PREFIX + name.lstrip("/")
    if len(name) == len(_TOPIC_PREFIX):
        raise OptionError("option topic is empty")
    if "*" in name or ">" in name:
        raise OptionError(f"option topic must name one topic (offsets are per topic): {name}")
    return name


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse the options of the `sluice` source. `startingOffsets` defaults to `latest` for a
    stream and `earliest` for a batch, as with Kafka."""
    opts = _lower(options)
    kind = "streaming source" if streaming else "batch source"
    check_names(options, SOURCE_OPTIONS, what=f"sluice {kind}", kafka=KAFKA_SOURCE_EQUIVALENTS)
    for name, value in opts.items():
        if name in ("startingoffsets", "endingoffsets") and value.strip().startswith("{"):
            raise OptionError(
                f"option {name} takes earliest, latest or one offset, not Kafka's JSON of "
                'offsets per partition: a Sluice topic is one log (e.g. "1000")'
            )
    raw_topic = _text(opts, "topic")
    if raw_topic is None:
        raise OptionError('option topic is required, e.g. .option("topic", "/topic/events")')
    schema = (_text(opts, "schema") or SCHEMA_SLUICE).lower()
    if schema not in (SCHEMA_SLUICE, SCHEMA_KAFKA):
        raise OptionError(
            f"option schema must be {SCHEMA_SLUICE} or {SCHEMA_KAFKA}, got {schema!r}"
        )
    starting = _offset_spec(
        opts, "startingOffsets", LATEST if streaming else EARLIEST, (EARLIEST, LATEST)
    )
    ending = _offset_spec(opts, "endingOffsets", LATEST, (LATEST,))
    if streaming and "endingoffsets" in opts:
        raise OptionError("option endingOffsets is for batch reads only")
    if not streaming and "maxoffsetspertrigger" in opts:
        raise OptionError("option maxOffsetsPerTrigger is for streaming reads only")
    if ending != LATEST and starting.isdigit() and int(ending) < int(starting):
        raise OptionError(f"endingOffsets {ending} is before startingOffsets {starting}")
    return SourceOptions(
        broker=_text(opts, "broker") or DEFAULT_BROKER,
        topic=topic_name(raw_topic),
        subscription=_text(opts, "subscription"),
        client_id=_text(opts, "clientId") or DEFAULT_CLIENT_ID,
        login=_text(opts, "login"),
        passcode=opts.get("passcode"),
        tls=_tls(opts),
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, 1),
        min_partitions=_int(opts, "minPartitions", 1, 1) or 1,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        fail_on_unknown_topic=_bool(opts, "failOnUnknownTopic", True),
        timeout_ms=_int(opts, "timeoutMs", DEFAULT_TIMEOUT_MS, 1) or DEFAULT_TIMEOUT_MS,
        prefetch=_int(opts, "prefetch", DEFAULT_PREFETCH, 2) or DEFAULT_PREFETCH,
        schema=schema,
        fetch=_choice(opts, "fetch", FETCH_BLOCKS, (FETCH_BLOCKS, FETCH_FRAMES)),
    )


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse the options of the `sluice` sink."""
    opts = _lower(options)
    check_names(options, SINK_OPTIONS, what="sluice sink", kafka=KAFKA_SINK_EQUIVALENTS)
    destination = _text(opts, "destination")
    if destination is not None and not destination.startswith(("/queue/", "/topic/")):
        raise OptionError(f"option destination must start with /queue/ or /topic/: {destination}")
    return SinkOptions(
        broker=_text(opts, "broker") or DEFAULT_BROKER,
        destination=destination,
        login=_text(opts, "login"),
        passcode=opts.get("passcode"),
        tls=_tls(opts),
        persistent=_bool(opts, "persistent", True),
        write_id=_text(opts, "writeId"),
        dedup_window=_int(opts, "dedupWindow", DEFAULT_DEDUP_WINDOW, 1) or DEFAULT_DEDUP_WINDOW,
        timeout_ms=_int(opts, "timeoutMs", DEFAULT_TIMEOUT_MS, 1) or DEFAULT_TIMEOUT_MS,
        send=_choice(opts, "send", SEND_BLOCKS, (SEND_BLOCKS, SEND_FRAMES)),
    )


def journal_options(options: Mapping[str, str]) -> JournalOptions:
    """Parse the options of the `sluice-journal` source (`load(path)` sets `path`)."""
    opts = _lower(options)
    check_names(options, JOURNAL_OPTIONS, what="sluice-journal source")
    path = _text(opts, "path")
    if path is None:
        raise OptionError('the journal reader needs a path: .load("/var/lib/sluice/data")')
    return JournalOptions(
        path=_local_path(path), fail_on_corruption=_bool(opts, "failOnCorruption", False)
    )


def _local_path(raw: str) -> str:
    """The absolute file system path of `raw`: a path, or a `file:` URI."""
    if raw.startswith("file:"):
        raw = urllib.parse.unquote(urllib.parse.urlparse(raw).path)
    elif _URI_SCHEME.match(raw):
        raise OptionError(
            f"the journal reader reads files, not {raw.split(':', 1)[0]}: URIs: give a path that "
            "every node sees (a shared file system), got " + repr(raw[:80])
        )
    return os.path.abspath(raw)
