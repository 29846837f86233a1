"""`sluice admin --url http://HOST:PORT ...`: the management API's client, in the manner of
`rabbitmqadmin` and `activemq query|browse|purge`: `list
destinations|connections|consumers|subscriptions|streams|files`, `show DEST`, `store`, `purge
DEST`, `delete DEST`, `close CONNECTION`, `export [FILE]`, `import FILE`; on a queue's messages
`browse` (a search with `--selector`, `--header`, `--id`), `count`, `move`, `copy`,
`delete-messages`, `retry` (`--all` or a filter, `--dry-run`), `send`, and `download` (a
message's body by `--id`, or a whole stream by `--stream`, to `-o FILE` or standard output). A
table by default, `--json` for scripts. Speaks HTTP with the standard library (`adminapi`).

With `--user`, the password is read from the terminal, or with `--password-stdin` from the
first line of standard input (never a command-line argument, where `ps` would show it). An
`https://` URL is dialled with TLS: `--ca` names the CA certificates to trust (else the
system's), `--cert` and `--key` a client certificate, which logs its holder in where the server
asks for one (the flags of the other client commands).
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sluice.cli.adminapi import AdminApi, AdminError, Downloaded, destination_path
from sluice.cli.common import Runner, UsageError
from sluice.cli.exitcodes import ExitCode
from sluice.config import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT

__all__ = ["AdminError", "add_parsers"]

DEFAULT_URL = f"http://{DEFAULT_HTTP_HOST}:{DEFAULT_HTTP_PORT}"
# A body `send` reads from a file: what fits a request of the API (64 KiB), as base64.
MAX_SEND_BYTES = 45 * 1024


def _dash(value: object) -> object:
    return "-" if value is None else value


def _sending(stream: dict[str, Any]) -> str:
    if not stream["sending"]:
        return "no"
    return "yes" if stream["producer_connected"] else "waiting"


def _reader(stream: dict[str, Any]) -> str:
    if stream["reader_connection"] is None:
        return "-"
    return f"{stream['reader_connection']}/{stream['reader_subscription']}"


def _resume(stream: dict[str, Any]) -> str:
    if stream["resume_chunk"] is None:
        return "-"
    return f"{stream['resume_chunk']}@{_dash(stream['resume_offset'])}"


def _pinned_by(file: dict[str, Any]) -> str:
    """Who keeps a file: destinations with live messages (count, oldest sequence), state."""
    oldest = file["oldest_by_destination"]
    parts = [
        f"{name} ({count}, from #{oldest.get(name, '?')})"
        for name, count in sorted(file["live_by_destination"].items())
    ]
    if file["state_of"]:
        parts.append(f"state of {len(file['state_of'])}")
    if file["transaction_pins"]:
        parts.append(f"{file['transaction_pins']} in open transactions")
    return ", ".join(parts) or "-"


# Table columns: (heading, how to get the cell from an item).
Column = tuple[str, Callable[[dict[str, Any]], object]]
_TABLES: dict[str, list[Column]] = {
    "destinations": [
        ("NAME", lambda d: d["name"]),
        ("READY", lambda d: d["messages_ready"]),
        ("IN-FLIGHT", lambda d: d["messages_in_flight"]),
        ("CONSUMERS", lambda d: d["consumers"]),
        ("PRODUCERS", lambda d: d["producers"]),
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
        ("PROTOCOL", lambda c: c["protocol"]),
        ("CLIENT-ID", lambda c: c["client_id"] or "-"),
        ("VERSION", lambda c: c["version"]),
        ("HEART-BEAT", lambda c: f"{c['heartbeat_ms']['send']},{c['heartbeat_ms']['receive']}"),
        ("BYTES-IN", lambda c: c["bytes_in"]),
        ("BYTES-OUT", lambda c: c["bytes_out"]),
        ("SUBS", lambda c: c["subscriptions"]),
        ("IN-FLIGHT", lambda c: c["messages_in_flight"]),
        ("CREDIT", lambda c: c["credit"]["messages"]),
        ("CREDIT-BYTES", lambda c: _dash(c["credit"]["bytes"])),
        ("AUTO-ACK", lambda c: c["credit"]["auto_ack_subscriptions"]),
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
    "streams": [
        ("DESTINATION", lambda s: s["destination"]),
        ("STREAM", lambda s: s["stream_id"]),
        ("SENDING", _sending),
        ("READING", lambda s: s["reading"]),
        ("READER", _reader),
        ("IN-FLIGHT", lambda s: s["chunks_in_flight"]),
        ("DELIVERED", lambda s: _dash(s["delivered_chunk"])),
        ("RESUME-AT", _resume),
    ],
    "files": [
        ("FILE", lambda f: f["name"]),
        ("SIZE", lambda f: f["size_bytes"]),
        ("LIVE", lambda f: f["live_messages"]),
        ("LIVE-BYTES", lambda f: f["live_bytes"]),
        ("PINS", lambda f: f["pins"]),
        ("HEAD", lambda f: "yes" if f["head"] else "no"),
        ("PINNED-BY", _pinned_by),
    ],
    "consumers": [
        ("DESTINATION", lambda c: c["destination"]),
        ("CONNECTION", lambda c: c["connection_id"]),
        ("SUB-ID", lambda c: c["subscription_id"]),
        ("ACK", lambda c: c["ack_mode"]),
        ("PREFETCH", lambda c: c["prefetch"]),
        ("IN-FLIGHT", lambda c: c["messages_in_flight"]),
        ("CREDIT", lambda c: _dash(c["credit"])),
        ("CREDIT-BYTES", lambda c: _dash(c["credit_bytes"])),
        ("WRITABLE", lambda c: "yes" if c["writable"] else "no"),
        ("SELECTOR", lambda c: _dash(c["selector"])),
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


def _headers(items: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name:
            raise UsageError(f"a header is NAME:VALUE, got {item!r}")
        headers.setdefault(name, value)
    return headers


def _search_query(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The search parameters of `browse` and `count`."""
    query = [("id", message_id) for message_id in args.ids]
    query += [("header", f"{n}:{v}") for n, v in _headers(args.header).items()]
    if args.selector is not None:
        query.append(("selector", args.selector))
    return query


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    """The request body of an operation: which messages, and whether to only count them."""
    body: dict[str, Any] = {"dry_run": args.dry_run}
    if args.ids:
        body["ids"] = args.ids
    if args.header:
        body["headers"] = _headers(args.header)
    if args.selector is not None:
        body["selector"] = args.selector
    chosen = len(body) > 1
    if args.all == chosen:
        raise UsageError("choose the messages: --selector, --header or --id, or --all alone")
    if args.all:
        body["all"] = True
    return body


_DONE = {"delete": "deleted", "move": "moved", "copy": "copied", "retry": "retried"}


def _operation_text(result: dict[str, Any], source: str) -> str:
    action = result["action"]
    done = result[_DONE[action]]
    lines = [
        f"{'would ' + action if result['dry_run'] else _DONE[action]} {done} of "
        f"{result['matched']} matching messages of {source}"
    ]
    lines += [f"  {count} to {target}" for target, count in sorted(result["targets"].items())]
    lines += [f"  {count} skipped: {reason}" for reason, count in sorted(result["skipped"].items())]
    return "\n".join(lines)


def _send_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        "headers": _headers(args.header),
        "persistent": args.persistent,
        "priority": args.priority,
        "expires_ms": args.expires_ms,
    }
    if args.file is not None:
        if args.body is not None:
            raise UsageError("give a BODY or --file, not both")
        try:
            with open(args.file, "rb") as source:
                payload = source.read(MAX_SEND_BYTES + 1)
        except OSError as exc:
            raise AdminError(f"cannot read {args.file}: {exc.strerror or exc}") from None
        if len(payload) > MAX_SEND_BYTES:
            raise AdminError(f"{args.file} is over {MAX_SEND_BYTES} bytes: use sluice send")
        body["body_base64"] = base64.b64encode(payload).decode()
    else:
        body["body"] = args.body or ""
    return body


def _run_messages(api: AdminApi, args: argparse.Namespace) -> bool:
    """The commands on messages; False if `args.action` is not one of them."""
    action: str = args.action
    if action == "browse":
        path = destination_path(args.destination) + "/messages"
        query = [("after", str(args.after)), ("limit", str(args.limit)), ("preview", "256")]
        query += _search_query(args)
        page = api.call("GET", f"{path}?{urllib.parse.urlencode(query)}")
        _print(args, page, _table(_TABLES["messages"], page["items"]))
    elif action == "count":
        path = destination_path(args.destination) + "/messages/count"
        search = urllib.parse.urlencode(_search_query(args))
        counted = api.call("GET", f"{path}?{search}" if search else path)
        text = (
            f"{counted['count']} messages of {args.destination} match "
            f"({counted['waiting']} waiting, {counted['in_flight']} in flight)"
        )
        _print(args, counted, text)
    elif action in ("move", "copy", "delete-messages", "retry"):
        operation = "delete" if action == "delete-messages" else action
        body = _selection(args)
        if operation in ("move", "copy"):
            destination_path(args.target)  # checked like the source
            body["to"] = args.target
        path = f"{destination_path(args.destination)}/messages/{operation}"
        result = api.call("POST", path, body)
        _print(args, result, _operation_text(result, args.destination))
    elif action == "send":
        path = destination_path(args.destination) + "/messages"
        sent = api.call("POST", path, _send_body(args))
        text = (
            f"dropped as a duplicate: {args.destination} saw its x-dedup-id"
            if sent["duplicate"]
            else f"sent {sent['message_id']} to {args.destination}"
        )
        _print(args, sent, text)
    else:
        return False
    return True


def _read_definitions(path: str) -> Any:
    try:
        with open(path, "rb") as source:
            return json.loads(source.read())
    except OSError as exc:
        raise AdminError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise AdminError(f"{path} is not JSON: {exc}") from None


def _write_definitions(path: str, exported: Any) -> None:
    try:
        with open(path, "w", encoding="utf-8") as target:
            json.dump(exported, target, indent=2)
            target.write("\n")
    except OSError as exc:
        raise AdminError(f"cannot write {path}: {exc.strerror or exc}") from None


def _import_text(imported: dict[str, Any]) -> str:
    created, existing = imported["created"], imported["existing"]
    verb = "would create" if imported["dry_run"] else "created"
    lines = [
        f"{verb} {len(created['destinations'])} destinations and "
        f"{len(created['durable_subscriptions'])} durable subscriptions "
        f"({existing['destinations']} destinations and {existing['durable_subscriptions']} "
        f"durable subscriptions were there)"
    ]
    lines += [f"  not applied: {line}" for line in imported["policy_differences"]]
    return "\n".join(lines)


def _download(api: AdminApi, args: argparse.Namespace) -> None:
    """A message's body or a whole stream, to `-o FILE` (whole or not at all: written beside
    it, renamed once complete and checked) or to standard output."""
    base = destination_path(args.destination)
    if args.id is not None:
        path = f"{base}/messages/{urllib.parse.quote(args.id, safe='')}/body"
        what = f"message {args.id}"
    else:
        path = f"{base}/streams/{urllib.parse.quote(args.stream, safe='')}/body"
        what = f"stream {args.stream}"
    if args.output in (None, "-"):
        sys.stdout.flush()
        _checked(api.download(path, sys.stdout.buffer), what)
        sys.stdout.buffer.flush()
        return
    target = Path(args.output)
    partial = target.with_name(f".{target.name}.part")
    try:
        with partial.open("wb") as sink:
            got = _checked(api.download(path, sink), what)
        partial.replace(target)
    except OSError as exc:
        raise AdminError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    done = {
        "destination": args.destination,
        "message_id": args.id,
        "stream_id": args.stream,
        "file": str(target),
        "bytes": got.length,
        "sha256": got.sha256,
    }
    text = f"wrote {what} of {args.destination} to {target} ({got.length} bytes"
    _print(args, done, text + (", SHA-256 checked)" if args.stream else ")"))


def _checked(got: Downloaded, what: str) -> Downloaded:
    """A stream's bytes against the SHA-256 its end chunk gives."""
    expected = got.headers.get("X-Stream-Sha256")
    if expected is not None and expected.lower() != got.sha256:
        raise AdminError(f"{what}: its SHA-256 is {got.sha256}, its end chunk says {expected}")
    return got


def _run_admin(args: argparse.Namespace) -> int:
    tls = {"ca": args.ca, "cert": args.cert, "key": args.key}
    api = AdminApi(args.url, args.user, _password(args), tls)
    action: str = args.action
    if _run_messages(api, args):
        return ExitCode.OK
    if action == "list":
        what: str = args.what
        items = api.all_items("/api/store/files" if what == "files" else f"/api/{what}")
        _print(args, items, _table(_TABLES[what], items))
    elif action == "export":
        exported = api.call("GET", "/api/definitions")
        if args.file is None:
            print(json.dumps(exported, indent=2))
        else:
            _write_definitions(args.file, exported)
            print(
                f"exported {len(exported['destinations'])} destinations and "
                f"{len(exported['durable_subscriptions'])} durable subscriptions to {args.file}"
            )
    elif action == "import":
        path = "/api/definitions" + ("?dry_run=true" if args.dry_run else "")
        imported = api.call("POST", path, _read_definitions(args.file))
        _print(args, imported, _import_text(imported))
    elif action == "store":
        shown = api.call("GET", "/api/store")
        _print(args, shown, "\n".join(f"{key}: {value}" for key, value in shown.items()))
    elif action == "show":
        shown = api.call("GET", destination_path(args.destination))
        _print(args, shown, "\n".join(f"{key}: {value}" for key, value in shown.items()))
    elif action == "purge":
        purged = api.call("DELETE", destination_path(args.destination) + "/messages")
        _print(args, purged, f"purged {purged['purged']} messages from {args.destination}")
    elif action == "delete":
        deleted = api.call("DELETE", destination_path(args.destination))
        _print(args, deleted, f"deleted {deleted['deleted']} ({deleted['messages']} messages)")
    elif action == "download":
        _download(api, args)
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


def _add_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--selector", help="a JMS selector the messages pass")
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a header the messages have with this value (repeatable: all of them)",
    )
    parser.add_argument(
        "--id",
        action="append",
        default=[],
        dest="ids",
        metavar="MESSAGE-ID",
        help="a message id (repeatable: any of them)",
    )


def _add_operations(actions: Any) -> None:
    for name, text, target in (
        ("move", "move a queue's messages to another destination", True),
        ("copy", "copy a queue's messages to another destination", True),
        ("delete-messages", "delete a queue's messages", False),
        ("retry", "send dead letters back to the destination each came from", False),
    ):
        parser = actions.add_parser(name, help=text)
        parser.add_argument("destination", help="/queue/NAME")
        if target:
            parser.add_argument("target", help="/queue/NAME or /topic/NAME")
        _add_filter(parser)
        parser.add_argument("--all", action="store_true", help="every message (never the default)")
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be done, change nothing"
        )
    send = actions.add_parser("send", help="send a message through the management API")
    send.add_argument("destination", help="/queue/NAME or /topic/NAME")
    send.add_argument("body", nargs="?", help="the body (text)")
    send.add_argument("--file", help=f"the body from this file (at most {MAX_SEND_BYTES} bytes)")
    send.add_argument(
        "-H", "--header", action="append", default=[], metavar="NAME:VALUE", help="a header"
    )
    send.add_argument("--persistent", action="store_true", help="stored before it is answered")
    send.add_argument("--priority", type=_priority, default=4, help="0-9 (default 4)")
    send.add_argument(
        "--expires-ms", type=_count, default=0, help="expiry, ms since the epoch (0: never)"
    )


def _priority(value: str) -> int:
    number = _count(value)
    if number > 9:
        raise argparse.ArgumentTypeError(f"a priority is 0 to 9, got {value!r}")
    return number


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
    tls = a.add_argument_group("TLS (an https:// URL)")
    tls.add_argument("--ca", default=None, metavar="FILE", help="CA certificates (PEM) to trust")
    tls.add_argument(
        "--cert", default=None, metavar="FILE", help="client certificate (PEM) to present"
    )
    tls.add_argument("--key", default=None, metavar="FILE", help="its private key (PEM)")
    actions = a.add_subparsers(dest="action", required=True)
    listing = actions.add_parser(
        "list",
        help="list destinations, connections, consumers, durable subscriptions, streams in "
        "progress, or the store's data files",
    )
    listing.add_argument(
        "what",
        choices=["connections", "consumers", "destinations", "files", "streams", "subscriptions"],
    )
    actions.add_parser("store", help="show where the message store stands")
    export = actions.add_parser(
        "export", help="export the destinations and durable subscriptions as JSON"
    )
    export.add_argument("file", nargs="?", help="write it here (default: standard output)")
    load = actions.add_parser(
        "import", help="import definitions exported from a broker, all or nothing"
    )
    load.add_argument("file", help="the definitions (JSON)")
    load.add_argument("--dry-run", action="store_true", help="check them, change nothing")
    browse = actions.add_parser(
        "browse", help="show a queue's messages without consuming them, or search them"
    )
    browse.add_argument("destination", help="/queue/NAME")
    browse.add_argument("--limit", type=_count, default=20, help="messages (1-100, default 20)")
    browse.add_argument("--after", type=_count, default=0, help="after this sequence number")
    _add_filter(browse)
    download = actions.add_parser(
        "download", help="a message's whole body, or a whole stream, without consuming them"
    )
    download.add_argument("destination", help="/queue/NAME")
    chosen = download.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--id", metavar="MESSAGE-ID", help="the message (see browse)")
    chosen.add_argument(
        "--stream", metavar="STREAM-ID", help="the stream (x-stream-id; see list streams)"
    )
    download.add_argument(
        "-o", "--output", metavar="FILE", help="write it here (default: standard output)"
    )
    count = actions.add_parser("count", help="count a queue's messages (that a filter matches)")
    count.add_argument("destination", help="/queue/NAME")
    _add_filter(count)
    _add_operations(actions)
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
