"""What the process-level simulation drives: a broker subprocess (started, stopped, killed, its
offline tools run between lives), stomp.py clients with deadlines on everything they wait for,
and, where the machine allows it, a small tmpfs under the data directory that can be filled.

Nothing here knows the model; `process_sim` joins the two.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stomp

from brokerproc import BrokerProcess
from lifecycle.process_model import SimFailure
from sluice import cli

HOST = "127.0.0.1"
# Every wait for the broker has a deadline this long: reaching it is a failure, not a retry.
ANSWER_TIMEOUT_S = 20.0
START_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 30.0


class Inbox(stomp.ConnectionListener):  # type: ignore[misc]
    """Hands frames from stomp.py's receiver thread to the simulation, under one condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: deque[Any] = deque()
        self.receipts: set[str] = set()
        self.errors: list[Any] = []
        self.connected = False
        self.disconnected = False

    def on_connected(self, frame: Any) -> None:
        with self.cond:
            self.connected = True
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()


class BrokerGone(Exception):
    """The connection ended (the broker was killed, or closed it after an ERROR)."""


class SimClient:
    """A stomp.py STOMP 1.2 connection with deadlines: every frame that matters is receipted and
    every wait ends in an answer, a closed connection (`BrokerGone`) or a `SimFailure`."""

    def __init__(self, port: int, *, client_id: str | None = None) -> None:
        self.inbox = Inbox()
        self.conn = stomp.Connection12(
            [(HOST, port)], heartbeats=(0, 0), reconnect_attempts_max=1, timeout=10
        )
        self.conn.set_listener("sim", self.inbox)
        self._receipt_seq = 0
        headers = {"client-id": client_id} if client_id else {}
        try:
            self.conn.connect(wait=False, headers=headers)
        except stomp.exception.ConnectFailedException as exc:
            raise BrokerGone("cannot connect") from exc
        self._wait(lambda: self.inbox.connected, "CONNECTED")

    def _wait(self, ready: Any, what: str, timeout: float = ANSWER_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        with self.inbox.cond:
            while not ready():
                if self.inbox.errors:
                    raise BrokerGone(f"ERROR while waiting for {what}: {self.error_text()}")
                if self.inbox.disconnected:
                    raise BrokerGone(f"connection closed while waiting for {what}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SimFailure("hang", f"no {what} from the broker within {timeout:.0f} s")
                self.inbox.cond.wait(remaining)

    def error_text(self) -> str:
        """The first ERROR frame the broker sent, if any."""
        if not self.inbox.errors:
            return ""
        frame = self.inbox.errors[0]
        return f"{frame.headers.get('message', '')} {frame.body!r}"[:300]

    def next_receipt(self) -> str:
        """A fresh receipt id."""
        self._receipt_seq += 1
        return f"r{self._receipt_seq}"

    def send(self, destination: str, body: str, headers: dict[str, str]) -> str:
        """SEND with a receipt; returns the receipt id (wait for it with `wait_receipts`)."""
        receipt = self.next_receipt()
        try:
            self.conn.send(destination, body, headers=dict(headers, receipt=receipt))
        except (stomp.exception.NotConnectedException, OSError) as exc:
            raise BrokerGone("not connected") from exc
        return receipt

    def frame(self, command: str, **headers: str) -> str:
        """Any other frame, with a receipt (not waited for)."""
        receipt = self.next_receipt()
        try:
            self.conn.send_frame(command, dict(headers, receipt=receipt))
        except (stomp.exception.NotConnectedException, OSError) as exc:
            raise BrokerGone("not connected") from exc
        return receipt

    def call(self, command: str, **headers: str) -> None:
        """A frame and its receipt."""
        self.wait_receipts([self.frame(command, **headers)], command)

    def has_receipt(self, receipt: str) -> bool:
        """Has this receipt come?"""
        with self.inbox.cond:
            return receipt in self.inbox.receipts

    def wait_receipts(
        self, receipts: Iterable[str], what: str, timeout: float = ANSWER_TIMEOUT_S
    ) -> None:
        """Wait for every receipt (raises `BrokerGone` if the connection ends first)."""
        wanted = set(receipts)
        self._wait(lambda: wanted <= self.inbox.receipts, f"RECEIPT for {what}", timeout)

    def subscribe(self, destination: str, sub_id: str, *, prefetch: int, **extra: str) -> None:
        """SUBSCRIBE client-individual and wait for its receipt."""
        self.call(
            "SUBSCRIBE",
            destination=destination,
            id=sub_id,
            ack="client-individual",
            **{"activemq.prefetchSize": str(prefetch)},
            **extra,
        )

    def message(self, timeout: float = ANSWER_TIMEOUT_S) -> Any:
        """The next MESSAGE frame."""
        with self.inbox.cond:
            self._wait(lambda: bool(self.inbox.messages), "MESSAGE", timeout)
            return self.inbox.messages.popleft()

    def poll_message(self, timeout: float) -> Any | None:
        """The next MESSAGE frame, or None if none comes within `timeout` (no failure)."""
        deadline = time.monotonic() + timeout
        with self.inbox.cond:
            while not self.inbox.messages:
                if self.inbox.disconnected:
                    raise BrokerGone("connection closed while polling for a MESSAGE")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.inbox.cond.wait(remaining)
            return self.inbox.messages.popleft()

    def take_buffered(self) -> list[Any]:
        """Messages received but not yet taken."""
        with self.inbox.cond:
            out = list(self.inbox.messages)
            self.inbox.messages.clear()
            return out

    def close(self) -> None:
        """DISCONNECT with a receipt and wait until the broker has closed the connection, so
        what it does at close (requeue, abort) is done before the next client comes."""
        try:
            receipt = self.frame("DISCONNECT")
            self._wait(
                lambda: receipt in self.inbox.receipts and self.inbox.disconnected,
                "DISCONNECT",
                CLOSE_TIMEOUT_S,
            )
        except (BrokerGone, SimFailure):
            pass  # best effort: closing never hides what went wrong before it
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Drop the connection without a word (its socket and receiver thread)."""
        with contextlib.suppress(Exception):
            self.conn.transport.disconnect_socket()  # ends the receiver thread's recv()


class Broker:
    """The broker of one life: one subprocess at a time, restarted on the same data directory.
    Logs of every run are kept; every process it started is killed by `kill`."""

    def __init__(self, workdir: Path, config_toml: str) -> None:
        self.workdir = workdir
        self.config_toml = config_toml
        self.proc: BrokerProcess | None = None
        self.logs: list[str] = []
        self.starts = 0

    @property
    def port(self) -> int:
        """The port of the running broker."""
        assert self.proc is not None
        return self.proc.port

    @property
    def running(self) -> bool:
        """Is a broker process alive?"""
        return (
            self.proc is not None and self.proc.proc is not None and self.proc.proc.poll() is None
        )

    def log_text(self) -> str:
        """What the running (or last) broker logged so far."""
        return self.proc.log_text if self.proc is not None else ""

    def start(self, *, repair: bool = False) -> None:
        """Start a broker and wait until it listens; a failed start is a `SimFailure` with the
        broker's stderr."""
        assert not self.running
        extra = ("--repair",) if repair else ()
        proc = BrokerProcess(self.config_toml, self.workdir, *extra)
        self.proc = proc
        self.starts += 1
        problem: list[BaseException] = []

        def run() -> None:
            try:
                proc.start()
            except BaseException as exc:  # reported below
                problem.append(exc)

        thread = threading.Thread(target=run, name="sim-broker-start", daemon=True)
        thread.start()
        thread.join(START_TIMEOUT_S)
        if thread.is_alive():
            self.kill()
            thread.join(10)
            raise SimFailure(
                "broker-start",
                f"no listening line within {START_TIMEOUT_S:.0f} s:\n" + _tail(proc.log_text),
            )
        if problem:
            self.kill()
            raise SimFailure("broker-start", f"the broker did not start:\n{_tail(proc.log_text)}")

    def terminate(self) -> None:
        """SIGTERM without waiting: the broker starts its clean stop."""
        if self.proc is not None and self.proc.proc is not None:
            self.proc.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, as a crash (a no-op when no broker runs)."""
        proc = self.proc
        if proc is None:
            return
        proc.kill()
        proc.stop()  # reaps the process and reads the rest of its log
        self.logs.append(proc.log_text)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM; the broker must exit 0 within the deadline."""
        proc = self.proc
        assert proc is not None
        started = time.monotonic()
        code = proc.stop()
        self.logs.append(proc.log_text)
        self.proc = None
        if code != 0:
            raise SimFailure(
                "clean-stop",
                f"exit code {code} after SIGTERM ({time.monotonic() - started:.1f} s):\n"
                + _tail(proc.log_text),
            )

    def tool(self, action: str, data_dir: Path) -> ToolResult:
        """`sluice store ACTION DIR` (verify, rebuild-index, compact) on the stopped store,
        through the CLI's `main` in this process (an interpreter start less per call)."""
        assert not self.running
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(["store", action, str(data_dir)])
            except BaseException:  # a crash of the tool is a finding, reported with its trace
                code = -1
                err.write(traceback.format_exc())
        return ToolResult(code, out.getvalue(), err.getvalue())


@dataclass(frozen=True)
class ToolResult:
    """Exit code and output of an offline tool."""

    returncode: int
    stdout: str
    stderr: str


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


class SmallDisk:
    """A tmpfs of `size_bytes` mounted at `path`, which a ballast file fills to leave a chosen
    number of bytes free (real ENOSPC for the broker). Needs root and `mount`; `available` says
    whether it could be set up, and everything is a no-op without it."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes
        self.ballast = path / "ballast"
        self.available = False

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        mount = shutil.which("mount")
        if os.geteuid() == 0 and mount is not None and sys.platform.startswith("linux"):
            result = subprocess.run(
                [mount, "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs", str(self.path)],
                capture_output=True,
                check=False,
            )
            self.available = result.returncode == 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.available:
            umount = shutil.which("umount") or "umount"
            subprocess.run([umount, "-l", str(self.path)], capture_output=True, check=False)
            self.available = False

    def free_bytes(self) -> int:
        """Free space on the filesystem now."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int) -> int:
        """Grow the ballast until about `leave_bytes` are free; returns the free bytes left."""
        if not self.available:
            return -1
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            block = b"\0" * (64 * 1024)
            while self.free_bytes() - len(block) >= leave_bytes:
                try:
                    os.write(fd, block)
                except OSError:
                    break
        finally:
            os.close(fd)
        return self.free_bytes()

    def free(self) -> None:
        """Remove the ballast."""
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()


@functools.cache
def small_disk_available() -> bool:
    """Can this machine mount a tmpfs for `SmallDisk` (root, Linux, `mount`)?"""
    with (
        tempfile.TemporaryDirectory(prefix="sluice-probe-") as probe,
        SmallDisk(Path(probe) / "disk", 1024 * 1024) as disk,
    ):
        return disk.available
