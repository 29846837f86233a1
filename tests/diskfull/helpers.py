"""Small real filesystems for the disk-full tests, and the broker, producers and consumers they use.

`small_fs(size_mib, kind)` mounts a tmpfs (`kind="tmpfs"`) or a loop-mounted ext4 image
(`kind="ext4"`, which reserves blocks and syncs for real) and unmounts it after the test. Tests
that need one are skipped, with the reason, where mounting is not allowed (not root, no mount
permission in the container, no mkfs.ext4).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import stomp

from brokerproc import BrokerProcess
from sluice.client import BlockingClient
from sluice.client.errors import ReceiptTimeout
from sluice.errors import ClientError

MiB = 1024 * 1024
BODY_BYTES = 64 * 1024
QUEUE = "/queue/disk"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:  # no such program
        return subprocess.CompletedProcess(args, 127, "", str(exc))


def _mount(stack: ExitStack, size_mib: int, kind: str) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    base = Path(tempfile.mkdtemp(prefix=f"sluice-{kind}-"))
    stack.callback(shutil.rmtree, base, ignore_errors=True)
    point = base / "mnt"
    point.mkdir()
    if kind == "tmpfs":
        done = _run("mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(point))
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 is not installed")
        image = base / "disk.img"
        with open(image, "wb") as f:
            f.truncate(size_mib * MiB)
        made = _run("mkfs.ext4", "-q", "-F", str(image))
        if made.returncode:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
        done = _run("mount", "-o", "loop", str(image), str(point))
    if done.returncode:
        pytest.skip(f"cannot mount a {kind} here: {done.stderr.strip()}")

    def unmount() -> None:
        if _run("umount", str(point)).returncode:
            _run("umount", "-l", str(point))

    stack.callback(unmount)
    return point


@pytest.fixture
def small_fs() -> Iterator[Callable[..., Path]]:
    """Mount small filesystems for the test: `small_fs(size_mib, kind="tmpfs")` -> mount point."""
    with ExitStack() as stack:

        def mount(size_mib: int, kind: str = "tmpfs") -> Path:
            return _mount(stack, size_mib, kind)

        yield mount


def broker_config(data: Path, store: str = "") -> str:
    """A journal broker on `data`, checkpointing and collecting often so tests stay short."""
    return f"""
[store]
kind = "journal"
data_dir = "{data}"
checkpoint_interval_s = 0.2
gc_interval_s = 0.5
{store}
"""


def start_broker(workdir: Path, data: Path, store: str = "") -> BrokerProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    return BrokerProcess(broker_config(data, store), workdir).start()


def body(i: int) -> bytes:
    """A message body that names its index."""
    return b"%08d" % i + b"x" * (BODY_BYTES - 8)


def index_of(data: bytes) -> int:
    return int(data[:8])


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def stop_within(broker: BrokerProcess, seconds: float) -> tuple[int, float]:
    """SIGTERM the broker; returns its exit code and how long it took (killed past `seconds`)."""
    assert broker.proc is not None
    started = time.monotonic()
    broker.proc.terminate()
    try:
        code = broker.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        broker.proc.kill()
        broker.proc.wait(30)
        pytest.fail(f"the broker ignored SIGTERM for {seconds} s:\n{broker.log_text[-3000:]}")
    return code, time.monotonic() - started


def wait_for_log(broker: BrokerProcess, text: str, timeout: float = 30.0) -> None:
    """Wait until the broker has logged `text` (its log is read by a thread)."""
    deadline = time.monotonic() + timeout
    while text not in broker.log_text:
        if time.monotonic() > deadline:
            pytest.fail(f"the broker never logged {text!r}:\n{broker.log_text[-3000:]}")
        time.sleep(0.05)


# -- producers ------------------------------------------------------------------------------------


@dataclass
class Produced:
    """What a producer sent: the indexes the broker receipted, and how the sending ended."""

    receipted: list[int] = field(default_factory=list)
    stalled_at: int | None = None
    error: str | None = None


def produce_sluice(
    port: int, count: int, *, stall_s: float, start: int = 0, dest: str = QUEUE
) -> Produced:
    """Persistent 64 KiB sends with receipts through our client, one at a time, until `count`
    are receipted, an ERROR comes back, or a receipt takes longer than `stall_s` (paused)."""
    out = Produced()
    client = BlockingClient(f"127.0.0.1:{port}", receipt_timeout_s=stall_s, reconnect=False)
    client.connect()
    try:
        for i in range(start, start + count):
            try:
                client.send(dest, body(i), persistent=True)
            except ReceiptTimeout:
                out.stalled_at = i
                return out
            except ClientError as exc:
                out.error = str(exc)
                return out
            out.receipted.append(i)
    finally:
        threading.Thread(target=client.close, daemon=True).start()
    return out


class _Receipts(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.receipts: set[str] = set()
        self.errors: list[str] = []

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: stomp.utils.Frame) -> None:
        with self.cond:
            self.errors.append(frame.headers.get("message", ""))
            self.cond.notify_all()


def produce_stomppy(
    port: int, count: int, *, stall_s: float, start: int = 0, dest: str = QUEUE
) -> Produced:
    """As `produce_sluice`, with stomp.py (a client we did not write)."""
    out = Produced()
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    listener = _Receipts()
    conn.set_listener("receipts", listener)
    conn.connect(wait=True)
    try:
        for i in range(start, start + count):
            receipt = f"r{i}"
            conn.send(dest, body(i), headers={"persistent": "true"}, receipt=receipt)
            with listener.cond:
                listener.cond.wait_for(
                    lambda r=receipt: r in listener.receipts or bool(listener.errors), stall_s
                )
                if listener.errors:
                    out.error = listener.errors[0]
                    return out
                if receipt not in listener.receipts:
                    out.stalled_at = i
                    return out
            out.receipted.append(i)
    finally:
        threading.Thread(target=_close_quietly, args=(conn,), daemon=True).start()
    return out


def _close_quietly(conn: stomp.Connection12) -> None:
    try:
        conn.disconnect()
    except Exception:  # the broker may be gone or not reading: nothing to do
        conn.transport.stop()


PRODUCERS: dict[str, Callable[..., Produced]] = {
    "sluice": produce_sluice,
    "stomp.py": produce_stomppy,
}


# -- consumers ------------------------------------------------------------------------------------


def drain(
    port: int, *, idle_s: float = 3.0, expect: int | None = None, dest: str = QUEUE
) -> list[int]:
    """Consume and acknowledge (receipted) everything on the queue, until nothing comes for
    `idle_s` (for half a second once `expect` messages came); indexes in arrival order."""
    seen: list[int] = []
    with BlockingClient(f"127.0.0.1:{port}", receipt_timeout_s=30) as client:
        sub = client.subscribe(dest, ack="client-individual", prefetch=64)
        while True:
            wait = idle_s if expect is None or len(seen) < expect else min(idle_s, 0.5)
            message = sub.receive(timeout=wait)
            if message is None:
                return seen
            seen.append(index_of(message.body))
            client.ack(message, receipt=len(seen) % 32 == 0)
