"""The broker's definitions as one JSON document: `GET /api/definitions` exports its
destinations and durable subscriptions, with the destination policies of its configuration;
`POST /api/definitions` imports such a document, all or nothing (`sluice.core.definitions`:
every definition checked first, then all applied, or none), `?dry_run=true` to only check it.

The policies are settings of the configuration file, not of the running broker: an import does
not change them; it names where the document's differ from the broker's (`policy_differences`),
so that two brokers meant to be alike can be seen not to be. Users and `[[acl]]` rules are not
part of the document.

Exporting concerns every destination: it needs `read` on `/queue/>` and `/topic/>`. Importing
needs `admin` on every destination the document names, as creating each would.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from typing import Any

from aiohttp import web

from sluice import __version__
from sluice.auth.identity import Permission
from sluice.config import Config, DestinationPolicy
from sluice.core.definitions import (
    Definitions,
    DefinitionsError,
    DurableDefinition,
    apply_import,
    export_definitions,
    plan_import,
)
from sluice.http.context import Serving
from sluice.http.errors import ApiError, ErrorCode
from sluice.http.gate import caller_of

__all__ = ["MAX_DEFINITIONS_BYTES", "routes"]

log = logging.getLogger(__name__)

FORMAT = 1
# A definitions document is read up to this size.
MAX_DEFINITIONS_BYTES = 16 * 1024 * 1024
_READ_CHUNK = 64 * 1024


def _policy(policy: DestinationPolicy) -> dict[str, Any]:
    return {
        key: value.value if isinstance(value, enum.Enum) else value
        for key, value in dataclasses.asdict(policy).items()
    }


def policies(config: Config) -> dict[str, Any]:
    """The configuration's destination policies: `[policy]` and the `[[destinations]]`."""
    return {
        "default": _policy(config.policy),
        "overrides": [
            {"pattern": override.pattern, "policy": _policy(override.policy)}
            for override in config.destinations
        ],
    }


def document(definitions: Definitions, config: Config, now_ms: int) -> dict[str, Any]:
    """The JSON document of definitions."""
    return {
        "format": FORMAT,
        "sluice_version": __version__,
        "exported_at_ms": now_ms,
        "destinations": [{"name": name} for name in definitions.destinations],
        "durable_subscriptions": [
            {
                "destination": d.destination,
                "client_id": d.client_id,
                "name": d.name,
                "selector": d.selector,
            }
            for d in definitions.durables
        ],
        "policies": policies(config),
    }


def _bad(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_DEFINITIONS, message)


def _str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}: {key} must be a string")
    return value


def _optional_str(item: dict[str, Any], key: str, where: str) -> str | None:
    return None if item.get(key) is None else _str(item, key, where)


def parse_document(body: Any) -> tuple[Definitions, dict[str, Any] | None]:
    """Definitions and policies from a document; raises 400 when its shape is wrong."""
    if not isinstance(body, dict):
        raise _bad("a definitions document is a JSON object")
    if body.get("format", FORMAT) != FORMAT:
        raise _bad(f"unknown definitions format {body.get('format')!r} (this broker reads 1)")
    destinations = body.get("destinations", [])
    durables = body.get("durable_subscriptions", [])
    if not isinstance(destinations, list) or not isinstance(durables, list):
        raise _bad("destinations and durable_subscriptions must be lists")
    names = []
    for i, item in enumerate(destinations):
        if not isinstance(item, dict):
            raise _bad(f"destinations[{i}] must be an object")
        names.append(_str(item, "name", f"destinations[{i}]"))
    subs = []
    for i, item in enumerate(durables):
        where = f"durable_subscriptions[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object")
        subs.append(
            DurableDefinition(
                _str(item, "destination", where),
                _str(item, "client_id", where),
                _str(item, "name", where),
                _optional_str(item, "selector", where),
            )
        )
    found = body.get("policies")
    if found is not None and not isinstance(found, dict):
        raise _bad("policies must be an object")
    return Definitions(tuple(names), tuple(subs)), found


def policy_differences(found: dict[str, Any] | None, config: Config) -> list[str]:
    """Where a document's policies differ from the configuration's (not applied by an
    import: they are set in the configuration file)."""
    if found is None:
        return []
    ours = policies(config)
    out = []
    theirs_default = found.get("default") or {}
    if isinstance(theirs_default, dict):
        for key, value in sorted(ours["default"].items()):
            if key in theirs_default and theirs_default[key] != value:
                out.append(f"[policy] {key}: {theirs_default[key]!r} here {value!r}")
    if found.get("overrides", []) != ours["overrides"]:
        out.append("[[destinations]] policy overrides differ")
    return out


async def _read_body(request: web.Request) -> Any:
    """The request's JSON, read within `MAX_DEFINITIONS_BYTES`."""
    chunks = []
    total = 0
    while True:
        chunk = await request.content.read(_READ_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > MAX_DEFINITIONS_BYTES:
            raise ApiError(
                ErrorCode.PAYLOAD_TOO_LARGE, f"request body over {MAX_DEFINITIONS_BYTES} bytes"
            )
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        raise _bad("the request body is not JSON") from None


class DefinitionsApi:
    """The handlers of the definitions."""

    def __init__(self, server: Serving) -> None:
        self.broker = server.managed.broker
        self.config = server.managed.config

    async def export(self, request: web.Request) -> web.Response:
        """The broker's definitions."""
        caller_of(request).require_broker(Permission.READ)
        definitions = export_definitions(self.broker)
        return web.json_response(document(definitions, self.config, self.broker.now_ms()))

    async def load(self, request: web.Request) -> web.Response:
        """Import a definitions document, all or nothing (`dry_run=true`: check it only)."""
        caller = caller_of(request)
        dry_run = request.query.get("dry_run", "false")
        if dry_run not in ("true", "false"):
            raise ApiError(ErrorCode.BAD_REQUEST, "dry_run must be true or false")
        definitions, found = parse_document(await _read_body(request))
        named = dict.fromkeys(definitions.destinations)
        named.update(dict.fromkeys(d.destination for d in definitions.durables))
        for name in named:
            caller.require(name, Permission.ADMIN)
        try:
            plan = plan_import(self.broker, definitions)
            if dry_run == "false":
                apply_import(self.broker, plan)
        except DefinitionsError as exc:
            raise ApiError(
                ErrorCode.INVALID_DEFINITIONS,
                f"nothing imported: {exc}",
                problems=exc.problems,
            ) from None
        answer = {
            "dry_run": dry_run == "true",
            "created": {
                "destinations": plan.new_destinations,
                "durable_subscriptions": [dataclasses.asdict(d) for d in plan.new_durables],
            },
            "existing": {
                "destinations": plan.existing_destinations,
                "durable_subscriptions": plan.existing_durables,
            },
            "policy_differences": policy_differences(found, self.config),
        }
        if dry_run == "false" and (plan.new_destinations or plan.new_durables):
            log.warning(
                "management API: user %s from %s imported definitions (%d destinations, "
                "%d durable subscriptions created)",
                caller.user,
                caller.address,
                len(plan.new_destinations),
                len(plan.new_durables),
                extra=caller.log_extra,
            )
        return web.json_response(answer)


def routes(server: Serving) -> list[web.RouteDef]:
    """The routes of the definitions."""
    handlers = DefinitionsApi(server)
    return [
        web.get("/api/definitions", handlers.export, allow_head=False),
        web.post("/api/definitions", handlers.load),
    ]
