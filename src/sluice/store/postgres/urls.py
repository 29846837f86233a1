"""PostgreSQL connection strings as they may be shown: never with their password."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

_HIDDEN = frozenset({"password", "sslpassword"})


def safe_url(url: str) -> str:
    """`url` (a URI or a key=value string) without its password, for logs and errors: the
    parameters that name where it goes, as `key=value` pairs."""
    try:
        params = conninfo_to_dict(url)
    except Exception:  # an unparsable string may hold anything: show none of it
        return "<unparsable PostgreSQL URL>"
    shown = [f"{key}={value}" for key, value in params.items() if key not in _HIDDEN]
    if any(key in _HIDDEN for key in params):
        shown.append("password=***")
    return " ".join(shown) or "<default PostgreSQL connection>"
