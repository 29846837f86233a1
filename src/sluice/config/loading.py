"""Building a `Config`: defaults, then a TOML file, then environment variables
(`SLUICE_<SECTION>__<NAME>`, for example `SLUICE_LIMITS__MEMORY_LIMIT_BYTES=1073741824`), then
command-line flags; validated once at the end. Each section is parsed here, with errors that
name the file (or variable) and the setting.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sluice.config.settings import (
    DEFAULT_STOMP_HOST,
    AclRule,
    ClientCertPolicy,
    Config,
    DestinationOverride,
    DestinationPolicy,
    HaSettings,
    HeartBeatSettings,
    HttpSettings,
    LatencySettings,
    Limits,
    Listener,
    StoreConfig,
    StoreFullPolicy,
    TlsSettings,
)
from sluice.errors import ConfigError

_SECTIONS: dict[str, type[Any]] = {
    "stomp": Listener,
    "limits": Limits,
    "heartbeat": HeartBeatSettings,
    "policy": DestinationPolicy,
    "store": StoreConfig,
    "http": HttpSettings,
    "latency": LatencySettings,
    "ha": HaSettings,
}


def _parse_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    return int(raw)


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, str):
        if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(raw)
        return raw.lower() in ("true", "1", "yes")
    if not isinstance(raw, bool):
        raise ValueError(raw)
    return raw


# Settings that moved, still read under their old names (documented as aliases):
# (section, old name) -> (section, new name, parse of the raw value into the new setting's).
_ALIASES: dict[tuple[str, str], tuple[str, str, Callable[[Any], Any]]] = {
    # ActiveMQ's storeUsage limit and sendFailIfNoSpace, as Sluice first named them.
    ("limits", "store_limit_bytes"): ("store", "max_bytes", _parse_int),
    ("limits", "send_fail_if_no_space"): (
        "store",
        "store_full",
        lambda raw: StoreFullPolicy.ERROR if _parse_bool(raw) else StoreFullPolicy.BLOCK,
    ),
}


def _parse_strings(raw: Any) -> tuple[str, ...]:
    """A list of strings: a TOML array, or a comma-separated string (the environment)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError("not a list of strings")
    return tuple(item.strip() for item in items if item.strip())


def _coerce(cls: type[Any], name: str, raw: Any, where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ConfigError(f"{where}: unknown setting {name!r}")
    default = getattr(cls(), name)
    try:
        if default is None and fields[name].type == "Path | None":
            return Path(raw)
        if isinstance(default, bool):
            return _parse_bool(raw)
        if isinstance(default, enum.Enum):
            return type(default)(raw)
        if isinstance(default, Path):
            return Path(raw)
        if isinstance(default, int):
            return _parse_int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, tuple):
            return _parse_strings(raw)
        return str(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: invalid value {raw!r} for {name}") from exc


def _apply_destinations(config: Config, tables: Any, where: str) -> Config:
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}: [[destination]] must be an array of tables")
    overrides = list(config.destinations)
    for table in tables:
        values = dict(table)
        pattern = values.pop("pattern", None)
        if not isinstance(pattern, str) or not pattern.startswith(("/queue/", "/topic/")):
            raise ConfigError(
                f'{where}: [[destination]] needs pattern = "/queue/..." or "/topic/..."'
            )
        changes = {
            k: _coerce(DestinationPolicy, k, v, f"{where} [[destination]] {pattern}")
            for k, v in values.items()
        }
        policy = dataclasses.replace(config.policy, **changes)
        overrides.append(DestinationOverride(pattern, policy))
    return dataclasses.replace(config, destinations=tuple(overrides))


def _apply_auth(config: Config, values: Any, where: str, base: Path | None) -> Config:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: [auth] must be a table")
    auth = config.auth
    for name, raw in values.items():
        if name == "users_file":
            if not isinstance(raw, str) or not raw:
                raise ConfigError(f"{where} [auth]: users_file must be a file name")
            path = Path(raw)
            # A relative name is relative to the configuration file that gives it.
            if base is not None and not path.is_absolute():
                path = base / path
            auth = dataclasses.replace(auth, users_file=path)
        elif name == "allow_anonymous":
            try:
                auth = dataclasses.replace(auth, allow_anonymous=_parse_bool(raw))
            except ValueError:
                raise ConfigError(
                    f"{where} [auth]: allow_anonymous must be true or false (got {raw!r})"
                ) from None
        else:
            raise ConfigError(f"{where} [auth]: unknown setting {name!r}")
    return dataclasses.replace(config, auth=auth)


def _acl_names(raw: Any, field_name: str, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise ConfigError(f"{where}: {field_name} must be a list of user or group names")
    return tuple(raw)


def _acl_destination(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or not raw.startswith(("/queue/", "/topic/")):
        raise ConfigError(f'{where}: needs destination = "/queue/..." or "/topic/..."')
    words = raw.split("/", 2)[2].split(".")
    if ">" in words[:-1]:
        raise ConfigError(f"{where}: destination {raw!r}: '>' may only be the last word")
    return raw


def _apply_acl(config: Config, tables: Any, where: str) -> Config:
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ConfigError(f"{where}: [[acl]] must be an array of tables")
    rules = list(config.acl)
    for number, table in enumerate(tables, len(rules) + 1):
        here = f"{where} [[acl]] rule {number}"
        unknown = set(table) - {"destination", "read", "write", "admin"}
        if unknown:
            raise ConfigError(f"{here}: unknown setting {sorted(unknown)[0]!r}")
        rules.append(
            AclRule(
                destination=_acl_destination(table.get("destination"), here),
                read=_acl_names(table.get("read", []), "read", here),
                write=_acl_names(table.get("write", []), "write", here),
                admin=_acl_names(table.get("admin", []), "admin", here),
            )
        )
    return dataclasses.replace(config, acl=tuple(rules))


_TLS_KEYS = ("cert", "key", "ca", "client_cert", "crl")


def _tls_path(raw: Any, name: str, where: str, base: Path | None) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{where}: tls.{name} must be a file name")
    path = Path(raw)
    # A relative name is relative to the configuration file that gives it.
    if base is not None and not path.is_absolute():
        path = base / path
    return path


def _parse_tls(raw: Any, where: str, base: Path | None) -> TlsSettings:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: tls must be a table: {{ cert = ..., key = ... }}")
    unknown = set(raw) - set(_TLS_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown tls setting {sorted(unknown)[0]!r}")
    for name in ("cert", "key"):
        if name not in raw:
            raise ConfigError(f"{where}: tls needs {name} (a PEM file)")
    policy = raw.get("client_cert", ClientCertPolicy.NONE.value)
    try:
        client_cert = ClientCertPolicy(policy)
    except ValueError:
        raise ConfigError(
            f"{where}: tls.client_cert must be none, optional or required (got {policy!r})"
        ) from None
    return TlsSettings(
        cert=_tls_path(raw["cert"], "cert", where, base),
        key=_tls_path(raw["key"], "key", where, base),
        ca=_tls_path(raw["ca"], "ca", where, base) if "ca" in raw else None,
        client_cert=client_cert,
        crl=_tls_path(raw["crl"], "crl", where, base) if "crl" in raw else None,
    )


def _apply_listeners(config: Config, tables: Any, where: str, base: Path | None) -> Config:
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ConfigError(f"{where}: [[listeners]] must be an array of tables")
    listeners = list(config.listeners)
    for number, table in enumerate(tables, len(listeners) + 1):
        here = f"{where} [[listeners]] {number}"
        unknown = set(table) - {"host", "port", "tls"}
        if unknown:
            raise ConfigError(f"{here}: unknown setting {sorted(unknown)[0]!r}")
        if "port" not in table:
            raise ConfigError(f"{here}: needs port")
        listeners.append(
            Listener(
                host=_coerce(Listener, "host", table.get("host", DEFAULT_STOMP_HOST), here),
                port=_coerce(Listener, "port", table["port"], here),
                tls=_parse_tls(table["tls"], here, base) if "tls" in table else None,
            )
        )
    return dataclasses.replace(config, listeners=tuple(listeners))


def _apply(
    config: Config,
    section: str,
    values: Mapping[str, Any],
    where: str,
    base: Path | None = None,
) -> Config:
    if section == "destination":
        return _apply_destinations(config, values, where)
    if section == "auth":
        return _apply_auth(config, values, where, base)
    if section == "acl":
        return _apply_acl(config, values, where)
    if section == "listeners":
        return _apply_listeners(config, values, where, base)
    if section == "stomp" and "tls" in values:
        raise ConfigError(f"{where} [stomp]: tls goes in a [[listeners]] table")
    if section == "http" and "tls" in values:
        values = dict(values)
        tls = _parse_tls(values.pop("tls"), f"{where} [http]", base)
        config = dataclasses.replace(config, http=dataclasses.replace(config.http, tls=tls))
    if section not in _SECTIONS:
        if section in ("broker_name", "use_uvloop"):
            return dataclasses.replace(config, **{section: _coerce(Config, section, values, where)})
        raise ConfigError(f"{where}: unknown section [{section}]")
    cls = _SECTIONS[section]
    values = dict(values)
    for (alias_section, old_name), (new_section, new_name, parse) in _ALIASES.items():
        if alias_section == section and old_name in values:
            raw = values.pop(old_name)
            try:
                value = parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{where}: invalid value {raw!r} for {old_name}") from exc
            moved = dataclasses.replace(getattr(config, new_section), **{new_name: value})
            config = dataclasses.replace(config, **{new_section: moved})
    current = getattr(config, section)
    changes = {k: _coerce(cls, k, v, f"{where} [{section}]") for k, v in values.items()}
    return dataclasses.replace(config, **{section: dataclasses.replace(current, **changes)})


def load(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build a validated `Config` from defaults, a TOML file, the environment and overrides."""
    config = Config()
    # Where [stomp] was given: it cannot be combined with [[listeners]].
    stomp_from: list[str] = []
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        # [policy] first, so [[destination]] overrides start from the configured defaults.
        for section in sorted(data, key=lambda name: name == "destination"):
            config = _apply(config, section, data[section], str(path), path.parent)
        if "stomp" in data:
            stomp_from.append(f"[stomp] in {path}")
    environ = os.environ if env is None else env
    for key, value in environ.items():
        if not key.startswith("SLUICE_") or "__" not in key:
            continue
        section, _, name = key[len("SLUICE_") :].lower().partition("__")
        config = _apply(config, section, {name: value}, f"environment {key}")
        if section == "stomp":
            stomp_from.append(f"environment {key}")
    for section, values in (overrides or {}).items():
        config = _apply(config, section, values, "command line")
        if section == "stomp":
            stomp_from.append("the command line (--stomp)")
    if config.listeners and stomp_from:
        raise ConfigError(
            f"[[listeners]] replaces [stomp], but {stomp_from[0]} sets it too: give the "
            "listeners in one place"
        )
    return config.validate()
