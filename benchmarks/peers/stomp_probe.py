#!/usr/bin/env python3
"""Readiness probe and smoke test for the peer brokers' STOMP listeners.

`connect` uses raw sockets (stdlib only): it sends a STOMP 1.2 CONNECT and succeeds when the
broker answers CONNECTED; it prints the broker's `server` header.

`roundtrip` uses stomp.py: it sends one persistent message to a fresh queue, awaiting the
RECEIPT, then subscribes and receives it back (client-individual ack, RECEIPT awaited).
`send` and `receive` do one half each on a given --queue (to check that a message survives a
broker restart).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading
import time
import uuid


class StompRefusedError(Exception):
    """The broker answered, but with an ERROR: retrying will not help."""


def _read_frame(sock: socket.socket, deadline: float) -> bytes:
    buf = b""
    while b"\0" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete frame before the deadline")
        sock.settimeout(remaining)
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"connection closed by the broker after {buf[:200]!r}")
        buf += chunk
    return buf.split(b"\0", 1)[0].lstrip(b"\r\n")


def _headers(frame: bytes) -> tuple[str, dict[str, str]]:
    head = frame.split(b"\n\n", 1)[0].decode("utf-8", "replace")
    lines = head.replace("\r\n", "\n").split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers.setdefault(key, value)
    return lines[0], headers


def probe_connect(
    host: str, port: int, login: str, passcode: str, vhost: str | None, timeout: float
) -> str:
    """One CONNECT attempt; returns the `server` header, raises on any failure."""
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        frame = (
            f"CONNECT\naccept-version:1.2\nhost:{vhost or host}\n"
            f"login:{login}\npasscode:{passcode}\nheart-beat:0,0\n\n\0"
        )
        sock.sendall(frame.encode())
        command, headers = _headers(_read_frame(sock, deadline))
        if command == "ERROR":
            raise StompRefusedError(f"CONNECT refused with ERROR: {headers}")
        if command != "CONNECTED":
            raise ConnectionError(f"expected CONNECTED, got {command}: {headers}")
        sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            _read_frame(sock, deadline)
        return headers.get("server", "unknown")


def wait_connect(
    host: str, port: int, login: str, passcode: str, vhost: str | None, timeout: float
) -> int:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            server = probe_connect(host, port, login, passcode, vhost, 5.0)
        except StompRefusedError as exc:
            print(f"{host}:{port}: {exc}", file=sys.stderr)
            return 1
        except (OSError, TimeoutError, ConnectionError) as exc:
            last = exc
            time.sleep(0.25)
            continue
        print(f"STOMP CONNECTED on {host}:{port} server={server}")
        return 0
    print(
        f"no STOMP CONNECTED on {host}:{port} within {timeout:.0f}s (last error: {last})",
        file=sys.stderr,
    )
    return 1


def exchange(
    host: str,
    port: int,
    login: str,
    passcode: str,
    vhost: str | None,
    timeout: float,
    *,
    queue: str | None,
    send: bool,
    receive: bool,
) -> int:
    """Send one persistent message (RECEIPT awaited) and/or receive and ack one."""
    import stomp  # noqa: PLC0415  (only these modes need stomp.py)

    queue = queue or f"/queue/peer-smoke-{uuid.uuid4().hex[:12]}"
    body = f"persistent hello to {queue}"
    got = threading.Event()
    receipts: set[str] = set()
    receipt_cv = threading.Condition()
    received: list[tuple[dict[str, str], str]] = []
    errors: list[str] = []

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            with receipt_cv:
                receipts.add(frame.headers.get("receipt-id", ""))
                receipt_cv.notify_all()

        def on_message(self, frame: stomp.utils.Frame) -> None:
            received.append((dict(frame.headers), frame.body))
            got.set()

        def on_error(self, frame: stomp.utils.Frame) -> None:
            errors.append(f"{frame.headers} {frame.body}")

    def await_receipt(rid: str) -> None:
        with receipt_cv:
            if not receipt_cv.wait_for(lambda: rid in receipts, timeout):
                raise TimeoutError(f"no RECEIPT {rid} within {timeout}s; errors={errors}")

    conn = stomp.Connection12([(host, port)], vhost=vhost, heartbeats=(0, 0))
    conn.set_listener("smoke", Listener())
    conn.connect(login, passcode, wait=True)
    notes = [f"queue={queue}"]
    if send:
        t0 = time.perf_counter()
        conn.send(queue, body, headers={"persistent": "true"}, receipt="send-1")
        await_receipt("send-1")
        notes.append(f"sent (receipt after {(time.perf_counter() - t0) * 1000:.1f} ms)")
    if receive:
        conn.subscribe(queue, id="s1", ack="client-individual")
        if not got.wait(timeout):
            raise TimeoutError(f"message not received within {timeout}s; errors={errors}")
        headers, got_body = received[0]
        if got_body != body:
            raise AssertionError(f"body mismatch: {got_body!r} != {body!r}")
        conn.ack(headers["ack"], receipt="ack-1")
        await_receipt("ack-1")
        conn.unsubscribe("s1")
        notes.append(
            f"received and acked (persistent={headers.get('persistent', '?')} "
            f"message-id={headers.get('message-id')})"
        )
    conn.disconnect(receipt="bye")
    if errors:
        raise ConnectionError(f"broker sent ERROR frames: {errors}")
    print(f"ok on {host}:{port}: " + ", ".join(notes))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["connect", "roundtrip", "send", "receive"])
    parser.add_argument("--queue", help="destination for send/receive (default: a fresh queue)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--login", default="guest")
    parser.add_argument("--passcode", default="guest")
    parser.add_argument(
        "--vhost", default=None, help="CONNECT host header (default: the address dialled)"
    )
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.mode == "connect":
        return wait_connect(
            args.host, args.port, args.login, args.passcode, args.vhost, args.timeout
        )
    if args.mode != "roundtrip" and not args.queue:
        parser.error(f"{args.mode} needs --queue")
    return exchange(
        args.host,
        args.port,
        args.login,
        args.passcode,
        args.vhost,
        args.timeout,
        queue=args.queue,
        send=args.mode in ("roundtrip", "send"),
        receive=args.mode in ("roundtrip", "receive"),
    )


if __name__ == "__main__":
    sys.exit(main())
