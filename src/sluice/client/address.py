"""Broker addresses (`host:port`, lists of them) and the reconnect backoff."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.config import DEFAULT_STOMP_HOST, DEFAULT_STOMP_PORT
from sluice.errors import ClientError

__all__ = ["BrokerAddress", "backoff_delay_s", "parse_brokers"]

_SCHEMES = ("stomp://", "tcp://")


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """One broker to dial."""

    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def _parse_one(text: str) -> BrokerAddress:
    spec = text.strip()
    for scheme in _SCHEMES:
        if spec.startswith(scheme):
            spec = spec[len(scheme) :]
    if not spec:
        raise ClientError(f"empty broker address in {text!r}")
    if spec.startswith("["):
        host, bracket, rest = spec[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ClientError(f"invalid broker address {text!r}")
        port_text = rest[1:] if rest else ""
    elif spec.count(":") > 1:
        host, port_text = spec, ""  # a bare IPv6 address
    else:
        host, _, port_text = spec.partition(":")
    host = host or DEFAULT_STOMP_HOST
    if not port_text:
        return BrokerAddress(host, DEFAULT_STOMP_PORT)
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise ClientError(f"invalid port in broker address {text!r}")
    return BrokerAddress(host, int(port_text))


def parse_brokers(brokers: str | Sequence[str]) -> tuple[BrokerAddress, ...]:
    """Parse `"host:port"`, `"h1:p1,h2:p2"` or a list of such strings, keeping their order.

    A missing port is 61613; `[::1]:61613` spells an IPv6 address. Raises `ClientError`.
    """
    parts = [brokers] if isinstance(brokers, str) else list(brokers)
    addresses = [_parse_one(item) for part in parts for item in part.split(",") if item.strip()]
    if not addresses:
        raise ClientError("no broker address given")
    return tuple(addresses)


def backoff_delay_s(round_number: int, initial_s: float, maximum_s: float) -> float:
    """Delay before reconnect round `round_number` (1 for the first retry round).

    Doubles each round from `initial_s` up to `maximum_s`, then takes a random point in its upper
    half so that many clients cut off at once do not come back in step.
    """
    if round_number <= 0:
        return 0.0
    ceiling = min(maximum_s, initial_s * 2.0 ** min(round_number - 1, 60))
    return random.uniform(ceiling / 2.0, ceiling)
