"""The option names each data source knows, and the errors for every other name.

A misspelled option must not be ignored in favour of the default (a query that reads `latest`
instead of the `startingOffset` it was given reads nothing, silently). So every option name is
checked: an unknown one is an `OptionError` naming the closest known one (`difflib`), and a name
of Spark's Kafka source or sink that Sluice spells differently (`kafka.bootstrap.servers`,
`subscribe`, ...) is an error naming the Sluice equivalent. Kafka names whose meaning is the same
in Sluice (`startingOffsets`, `endingOffsets`, `maxOffsetsPerTrigger`, `minPartitions`,
`failOnDataLoss`) are simply Sluice's own names.

Names are compared in lower case, as Spark hands options over case-insensitively.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from sluice.errors import ConfigError

__all__ = [
    "JOURNAL_OPTIONS",
    "KAFKA_SINK_EQUIVALENTS",
    "KAFKA_SOURCE_EQUIVALENTS",
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "OptionError",
    "check_names",
]


class OptionError(ConfigError):
    """A data source option is missing, unknown or invalid."""


_CONNECTION = ("broker", "login", "passcode", "timeoutMs")
_TLS = ("tls", "tls.ca", "tls.cert", "tls.key", "tls.keyPassword")

SOURCE_OPTIONS = (
    *_CONNECTION,
    *_TLS,
    "topic",
    "subscription",
    "clientId",
    "startingOffsets",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "failOnUnknownTopic",
    "prefetch",
    "schema",
    "fetch",
)
SINK_OPTIONS = (
    *_CONNECTION,
    *_TLS,
    "destination",
    "persistent",
    "writeId",
    "dedupWindow",
    "send",
)
JOURNAL_OPTIONS = ("path", "failOnCorruption")

# Options Spark itself adds: `checkpointLocation` reaches a streaming sink's options.
_SPARK_OWN = frozenset({"checkpointlocation"})

_ONE_TOPIC = "a query reads one topic: use option topic (/topic/NAME)"
_NO_EQUIVALENT = "Sluice has no equivalent"

# Kafka source option (lower case) -> what to write instead.
KAFKA_SOURCE_EQUIVALENTS: dict[str, str] = {
    "kafka.bootstrap.servers": "use option broker (host:port[,host:port...])",
    "subscribe": _ONE_TOPIC,
    "subscribepattern": _ONE_TOPIC + "; offsets are per topic, so patterns are not read",
    "assign": _ONE_TOPIC + "; a Sluice topic has one partition, its offsets",
    "startingoffsetsbytimestamp": "use option startingOffsets with an offset",
    "startingtimestamp": "use option startingOffsets with an offset",
    "endingoffsetsbytimestamp": "use option endingOffsets with an offset",
    "endingtimestamp": "use option endingOffsets with an offset",
    "startingoffsetsbytimestampstrategy": "use option startingOffsets with an offset",
    "kafka.group.id": "use option subscription (a durable subscription kept at the "
    "query's committed offset)",
    "groupidprefix": "use option subscription",
    "kafkaconsumer.polltimeoutms": "use option timeoutMs",
    "fetchoffset.numretries": _NO_EQUIVALENT + " (offsets are asked once per batch)",
    "fetchoffset.retryintervalms": _NO_EQUIVALENT,
    "maxtriggerdelay": _NO_EQUIVALENT,
    "minoffsetspertrigger": _NO_EQUIVALENT,
    "maxrecordsperpartition": "use option minPartitions to cut a batch into more tasks",
    "includeheaders": "headers are always read: the headers column (option schema=kafka "
    "gives Kafka's array of (key, value) pairs)",
}
# Kafka sink option (lower case) -> what to write instead.
KAFKA_SINK_EQUIVALENTS: dict[str, str] = {
    "kafka.bootstrap.servers": "use option broker (host:port[,host:port...])",
    "topic": "use option destination (/topic/NAME or /queue/NAME)",
    "includeheaders": "the headers column is always written when present",
}


def _closest(name: str, known: Iterable[str]) -> str | None:
    by_lower = {k.lower(): k for k in known}
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def check_names(
    options: Mapping[str, str],
    known: Iterable[str],
    *,
    what: str,
    kafka: Mapping[str, str] | None = None,
) -> None:
    """Raise `OptionError` for the first option of `options` that `known` does not hold."""
    known = tuple(known)
    allowed = {k.lower() for k in known} | _SPARK_OWN
    for raw in options:
        name = str(raw).lower()
        if name in allowed:
            continue
        if kafka is not None and (name in kafka or name.startswith("kafka.")):
            hint = kafka.get(name, "Sluice takes no kafka.* settings; see docs/spark.md")
            raise OptionError(f"option {raw} is a Kafka option the {what} does not take: {hint}")
        if name == "path":
            raise OptionError(
                f"the {what} takes no path: give every setting as an option "
                '(e.g. .option("topic", "/topic/events")) and call load() without arguments'
            )
        closest = _closest(name, known)
        hint = f"; did you mean {closest}?" if closest else ""
        raise OptionError(
            f"unknown option {raw} for the {what}{hint} (known: {', '.join(sorted(known))})"
        )
