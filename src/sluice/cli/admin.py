"""`sluice admin --url http://HOST:PORT ...`: the management API's client, in the manner of
`rabbitmqadmin` and `activemq query|browse|purge`: `list
destinations|connections|subscriptions`, `show DEST`, `browse QUEUE`, `purge DEST`, `delete
DEST`, `close CONNECTION`. A table by default, `--json` for scripts. Speaks HTTP with the
standard library.

With `--user`, the password is read from the terminal, or with `--password-stdin` from the
first line of standard input (never a command-line argument, where `ps` would show it).
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from sluice.cli.common import Runner, UsageError
from sluice.cli.exitcodes import ExitCode
from sluice.config import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT
from sluice.errors import SluiceError

__all__ = ["AdminError", "add_parsers"]

DEFAULT_URL = f"http://{DEFAULT_HTTP_HOST}:{DEFAULT_HTTP_PORT}"
TIMEOUT_S = 60.0
# Items asked for per page when listing everything.
_PAGE = 1000

# Table columns: (heading, how to get the cell from an item).
Column = tuple[str, Callable[[dict[str, Any]], object]]
_TABLES: dict[str, list[Column]] = {
    "destinations": [
        ("NAME", lambda d: d["name"]),
        ("READY", lambda d: d["messages_ready"]),
        ("IN-FLIGHT", lambda d: d["messages_in_flight"]),
        ("CONSUMERS", lambda d: d["consumers"]),
        ("PAGED", lambda d: d["messages_paged"]),
        ("MEMORY", lambda d: d["memory_bytes"]),
        ("IN", lambda d: d["messages_in"]),
        ("DELIVERED", lambda d: d["delivered"]),
        ("ACKED", lambda d: d["acked"]),
        ("IN/S", lambda d: d["rates"]["messages_in"]),
        ("OUT/S", lambda d: d["rates"]["delivered"]),
    ],
    "connections": [
        ("ID", lambda c: c["id"]),
        ("USER", lambda c: c["user"]),
        ("ADDRESS", lambda c: c["address"]),
        ("CLIENT-ID", lambda c: c["client_id"] or "-"),
        ("VERSION", lambda c: c["version"]),
        ("HEART-BEAT", lambda c: f"{c['heartbeat_ms']['send']},{c['heartbeat_ms']['receive']}"),
        ("BYTES-IN", lambda c: c["bytes_in"]),
        ("BYTES-OUT", lambda c: c["bytes_out"]),
        ("SUBS", lambda c: c["subscriptions"]),
    ],
    "messages": [
        ("SEQ", lambda m: m["seq"]),
        ("MESSAGE-ID", lambda m: m["message_id"]),
        ("PRIORITY", lambda m: m["priority"]),
        ("DELIVERIES", lambda m: m["delivery_count"]),
        ("IN-FLIGHT", lambda m: "yes" if m["in_flight"] else "no"),
        ("BYTES", lambda m: m["body_bytes"]),
        ("BODY", lambda m: _preview(m["body_preview"])),
    ],
    "subscriptions": [
        ("TOPIC", lambda s: s["destination"]),
        ("CLIENT-ID", lambda s: s["client_id"]),
        ("NAME", lambda s: s["name"]),
        ("CURSOR", lambda s: s["cursor"]),
        ("LAG", lambda s: s["lag"]),
        ("ACTIVE", lambda s: "yes" if s["active"] else "no"),
    ],
}


def _preview(text: str, width: int = 40) -> str:
    """A body's first characters on one line."""
    flat = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", " ")
    return flat if len(flat) <= width else flat[: width - 3] + "..."


class AdminError(SluiceError):
    """The management API refused a request, or could not be reached; the message says why."""


class _Api:
    """Requests to one management server."""

    def __init__(self, url: str, user: str | None, password: str | None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(f"--url must be http://HOST:PORT, got {url!r}")
        self.base = url.rstrip("/")
        self._auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self._auth = f"Basic {token}"

    def call(self, method: str, path: str) -> Any:
        """The JSON answer of a request; raises `AdminError` with the API's message."""
        # The scheme was checked to be http(s) in __init__.
        request = urllib.request.Request(self.base + path, method=method)  # noqa: S310
        if self._auth is not None:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:  # noqa: S310
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            raise AdminError(_error_text(exc)) from None
        except urllib.error.URLError as exc:
            reason = getattr(exc.reason, "strerror", None) or str(exc.reason)
            raise AdminError(f"cannot reach {self.base}: {reason}") from None
        except (OSError, ValueError) as exc:
            raise AdminError(f"bad answer from {self.base}: {exc}") from None

    def all_items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a paged list."""
        items: list[dict[str, Any]] = []
        while True:
            page = self.call("GET", f"{path}?offset={len(items)}&limit={_PAGE}")
            items.extend(page["items"])
            if not page["items"] or len(items) >= page["total"]:
                return items


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(exc.read())["error"]
        return f"{error['message']} ({error['code']}, HTTP {exc.code})"
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"


def _destination_path(name: str) -> str:
    for kind in ("queue", "topic"):
        prefix = f"/{kind}/"
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"/api/destinations/{kind}/" + urllib.parse.quote(name[len(prefix) :], safe="")
    raise UsageError(f"a destination is /queue/NAME or /topic/NAME, got {name!r}")


def _table(columns: Sequence[Column], items: Sequence[dict[str, Any]]) -> str:
    rows = [[heading for heading, _ in columns]]
    rows += [[str(cell(item)) for _, cell in columns] for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _password(args: argparse.Namespace) -> str | None:
    if args.user is None:
        if args.password_stdin:
            raise UsageError("--password-stdin needs --user")
        return None
    if args.password_stdin:
        line = sys.stdin.readline()
        return line[:-1] if line.endswith("\n") else line
    return getpass.getpass(f"Password for {args.user}: ")


def _print(args: argparse.Namespace, value: Any, text: str) -> None:
    print(json.dumps(value, indent=2) if args.json else text)


def _run_admin(args: argparse.Namespace) -> int:
    api = _Api(args.url, args.user, _password(args))
    action: str = args.action
    if action == "list":
        what: str = args.what
        items = api.all_items(f"/api/{what}")
        _print(args, items, _table(_TABLES[what], items))
    elif action == "browse":
        path = _destination_path(args.destination) + "/messages"
        page = api.call("GET", f"{path}?after={args.after}&limit={args.limit}&preview=256")
        _print(args, page, _table(_TABLES["messages"], page["items"]))
    elif action == "show":
        shown = api.call("GET", _destination_path(args.destination))
        _print(args, shown, "\n".join(f"{key}: {value}" for key, value in shown.items()))
    elif action == "purge":
        purged = api.call("DELETE", _destination_path(args.destination) + "/messages")
        _print(args, purged, f"purged {purged['purged']} messages from {args.destination}")
    elif action == "delete":
        deleted = api.call("DELETE", _destination_path(args.destination))
        _print(args, deleted, f"deleted {deleted['deleted']} ({deleted['messages']} messages)")
    elif action == "close":
        closed = api.call("DELETE", f"/api/connections/{args.connection}")
        _print(args, closed, f"closed connection {closed['closed']}")
    return ExitCode.OK


def _count(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}")
    return int(value)


def _connection_id(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"a connection id is a number, got {value!r}")
    return int(value)


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `admin` to the subcommand parsers; return its runner by name."""
    a = sub.add_parser("admin", help="operate a running broker through its management API")
    a.add_argument("--url", default=DEFAULT_URL, help="the management API (default %(default)s)")
    a.add_argument("--user", default=None, help="log in as this user (HTTP basic auth)")
    a.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of standard input",
    )
    a.add_argument("--json", action="store_true", help="print the API's JSON, for scripts")
    actions = a.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="list destinations, connections or subscriptions")
    listing.add_argument("what", choices=["connections", "destinations", "subscriptions"])
    browse = actions.add_parser("browse", help="show a queue's messages without consuming them")
    browse.add_argument("destination", help="/queue/NAME")
    browse.add_argument("--limit", type=_count, default=20, help="messages (1-100, default 20)")
    browse.add_argument("--after", type=_count, default=0, help="after this sequence number")
    for name, text in (
        ("show", "show one destination"),
        ("purge", "remove the messages of a queue that wait for a consumer"),
        ("delete", "delete a destination and its messages"),
    ):
        actions.add_parser(name, help=text).add_argument(
            "destination", help="/queue/NAME or /topic/NAME"
        )
    close = actions.add_parser("close", help="close a client connection")
    close.add_argument("connection", type=_connection_id, help="its id (see list connections)")
    return {"admin": _run_admin}
