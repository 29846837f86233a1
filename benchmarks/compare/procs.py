"""Child processes that always end, and a pids cgroup that caps one broker's tasks.

Every child runs in a session of its own, so a Ctrl-C at the terminal reaches only this process,
which then stops its children deliberately: TERM to the child's process group, KILL after a
grace period. Nothing is ever signalled by name, only by the ids of what was started here.

`TaskCap` puts one broker (and everything it spawns) into a pids cgroup with a `pids.max`. A
broker with a thread per connection would otherwise use up the machine's pid space, which every
process on this shared machine needs; with the cap, that broker fails alone. After the broker is
stopped, anything still in its cgroup is ours and is killed by pid, so no broker outlives its
scenario.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

__all__ = [
    "Completed",
    "TaskCap",
    "deferred_interrupts",
    "free_port",
    "pid_alive",
    "remove_caps",
    "run_command",
    "stop_group",
]

log = logging.getLogger(__name__)

_GROUP_GRACE_S = 10.0
_KILL_WAIT_S = 10.0
_POLL_S = 0.1
_CGROUP_V1_PIDS = Path("/sys/fs/cgroup/pids")
_CGROUP_V2 = Path("/sys/fs/cgroup")


_DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_deferring = False


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ctrl-C, TERM and HUP wait until the block is done, then raise KeyboardInterrupt.

    For clean-up that must not be cut short. Nested blocks defer to the outermost one. The
    handler is a Python function, so children started meanwhile get default dispositions.
    """
    global _deferring
    if _deferring:
        yield
        return
    received: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        log.warning("signal %d: finishing the clean-up first", signum)

    old = {sig: signal.signal(sig, hold) for sig in _DEFERRED_SIGNALS}
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if received:
            raise KeyboardInterrupt(f"signal {received[0]}")


@dataclass
class Completed:
    """How a command ended."""

    returncode: int | None
    timed_out: bool
    seconds: float


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself contain spaces.
    return stat.rpartition(")")[2].split()[0] != "Z"


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = _GROUP_GRACE_S) -> None:
    """TERM the process group led by `proc` (started with a new session), KILL after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, _KILL_WAIT_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; workers it left in its group get the same signal once more.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        return
    log.warning("process group %d did not exit after KILL", proc.pid)


def run_command(
    args: list[str],
    *,
    timeout_s: float,
    output: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> Completed:
    """Run a command in its own session, stdout and stderr appended to `output`.

    On time-out the process group is stopped and `timed_out` is set; on KeyboardInterrupt (or any
    other exception) it is stopped and the exception goes on.
    """
    started = time.monotonic()
    with output.open("ab") as sink:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with deferred_interrupts():
                stop_group(proc)
            return Completed(proc.returncode, True, time.monotonic() - started)
        except BaseException:
            with deferred_interrupts():
                stop_group(proc)
            raise
    return Completed(returncode, False, time.monotonic() - started)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TaskCap:
    """A pids cgroup (v1 `pids` hierarchy, or v2 with the pids controller) for one broker."""

    def __init__(self, name: str, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self.path: Path | None = None
        root = self.root()
        if root is None or max_tasks <= 0:
            return
        path = root / name
        try:
            path.mkdir()
            (path / "pids.max").write_text(f"{max_tasks}\n")
        except OSError as exc:
            log.warning("no task cap (cannot create %s: %s)", path, exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return
        self.path = path

    @classmethod
    def adopt(cls, path: Path) -> TaskCap:
        """A cap for an existing cgroup directory (to clean it up)."""
        cap = cls("", 0)
        cap.path = path
        return cap

    @staticmethod
    def root() -> Path | None:
        """The directory new pids cgroups are made in, None if there is none."""
        if (_CGROUP_V1_PIDS / "cgroup.procs").exists():
            return _CGROUP_V1_PIDS
        controllers = _CGROUP_V2 / "cgroup.subtree_control"
        with contextlib.suppress(OSError):
            if "pids" in controllers.read_text().split():
                return _CGROUP_V2
        return None

    @staticmethod
    def available() -> bool:
        """True if a pids cgroup can probably be made here."""
        root = TaskCap.root()
        return root is not None and os.access(root, os.W_OK)

    def wrap(self, args: list[str]) -> list[str]:
        """The command, made to enter the cgroup before it executes (so its children do too)."""
        if self.path is None:
            return args
        procs = str(self.path / "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *args]

    def _read(self, name: str) -> str:
        if self.path is None:
            return ""
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        return [int(p) for p in self._read("cgroup.procs").split()]

    def peak(self) -> int | None:
        """The most tasks (processes and threads) the cgroup held at once, if the kernel says."""
        text = self._read("pids.peak").strip()
        return int(text) if text.isdigit() else None

    def refused(self) -> int:
        """How many forks or thread creations the cap refused."""
        for line in self._read("pids.events").splitlines():
            name, _, count = line.partition(" ")
            if name == "max" and count.strip().isdigit():
                return int(count)
        return 0

    def remove(self) -> list[int]:
        """Kill whatever is left in the cgroup (by pid) and remove it; return the pids killed."""
        if self.path is None:
            return []
        killed: list[int] = []
        deadline = time.monotonic() + _KILL_WAIT_S
        while True:
            left = self.pids()
            if not left:
                break
            if time.monotonic() > deadline:
                log.warning("processes %s survive in %s", left, self.path)
                break
            for pid in left:
                if pid not in killed:
                    log.warning(
                        "killing pid %d, left in %s after its broker stopped", pid, self.path
                    )
                    killed.append(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(_POLL_S)
        else:
            log.warning("could not remove %s", self.path)
        return killed


def remove_caps(prefix: str) -> None:
    """Remove every task cap whose name starts with `prefix`, killing what is left in each."""
    root = TaskCap.root()
    if root is None:
        return
    for path in root.glob(f"{prefix}*"):
        if path.is_dir():
            TaskCap.adopt(path).remove()
