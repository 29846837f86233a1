"""The brokers compared: install, start on an empty data directory, find the pid to measure, stop.

Sluice runs as `sluice broker --store journal --data DIR --stomp 127.0.0.1:0` (its default store
syncs every write batch) and is stopped with TERM, then KILL, by the pid started here. The peers
are driven through `benchmarks/peers/{activemq,rabbitmq}.sh install|start|stop`, which keep all
of an instance under its DATA_DIR and record its pids there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from compare.procs import TaskCap, deferred_interrupts, free_port, pid_alive, run_command

__all__ = ["BROKER_NAMES", "Broker", "BrokerError", "Running", "make_brokers"]

log = logging.getLogger(__name__)

BROKER_NAMES = ("sluice", "activemq", "rabbitmq")
_LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
_SLUICE_START_S = 60.0
_SLUICE_STOP_S = 30.0
_PEER_START_S = 300.0
_PEER_STOP_S = 180.0
_INSTALL_S = 1800.0
_POLL_S = 0.05
_TAIL_LINES = 15


class BrokerError(Exception):
    """A broker could not be installed, started or stopped; the message says why."""


@dataclass
class Running:
    """A started broker."""

    port: int
    pid: int  # the process whose memory is sampled (sluice, java, beam.smp)
    version: str
    start_s: float


def tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last lines of a text file ('' if it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Broker:
    """The interface every broker here implements."""

    name = ""
    label = ""

    def install(self, log_path: Path, *, stop_system_service: bool = False) -> str:
        """Make the broker runnable; return its version.

        A peer whose distribution service already runs is refused (BrokerError) unless
        `stop_system_service`, which has its install script stop and disable that service.
        """
        raise NotImplementedError

    def start(self, data_dir: Path, cap: TaskCap) -> Running:
        """Start with its data under `data_dir` (which does not exist yet)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the instance started last, if it still runs; never raises for a dead one."""
        raise NotImplementedError

    def bench_args(self) -> list[str]:
        """Extra `sluice bench` arguments this broker needs."""
        return []

    def log_tail(self) -> str:
        """The last lines of the running (or last) instance's log."""
        return ""


class SluiceBroker(Broker):
    """Sluice on its journal store."""

    name = "sluice"
    label = "Sluice"

    def __init__(
        self,
        executable: Path,
        python: Path,
        *,
        name: str = "sluice",
        label: str = "Sluice",
        settings: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.label = label
        # Settings as `SLUICE_SECTION__KEY` environment overrides, e.g. a variant's store policy.
        self.settings = settings or {}
        self.executable = executable
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    def install(self, log_path: Path, *, stop_system_service: bool = False) -> str:
        del log_path, stop_system_service
        result = subprocess.run(
            [str(self.python), "-c", "import sluice; print(sluice.__version__)"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode != 0 or not self.executable.exists():
            raise BrokerError(f"sluice is not installed in this venv: {result.stderr.strip()}")
        return f"Sluice {result.stdout.strip()}"

    def start(self, data_dir: Path, cap: TaskCap) -> Running:
        data_dir.mkdir(parents=True)
        self.log_path = data_dir.parent / f"{data_dir.name}.sluice.log"
        started = time.monotonic()
        args = [str(self.executable), "broker", *self.store_args(data_dir)]
        args += ["--stomp", "127.0.0.1:0"]
        with self.log_path.open("wb") as sink:
            self.proc = subprocess.Popen(
                cap.wrap(args),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                start_new_session=True,
                env={**os.environ, **self.settings},
            )
        deadline = started + _SLUICE_START_S
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log_path.read_text(errors="replace"))
            if match:
                return Running(int(match.group(1)), self.proc.pid, "", time.monotonic() - started)
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"sluice broker exited with {self.proc.returncode} before listening: "
                    + tail(self.log_path, 5)
                )
            time.sleep(_POLL_S)
        self.stop()
        raise BrokerError(f"sluice broker did not listen within {_SLUICE_START_S:g} s")

    def store_args(self, data_dir: Path) -> list[str]:
        """The store flags of `sluice broker` (the journal in `data_dir`)."""
        return ["--store", "journal", "--data", str(data_dir)]

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        with deferred_interrupts():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(_SLUICE_STOP_S)
                except subprocess.TimeoutExpired:
                    log.warning(
                        "sluice pid %d ignored TERM for %g s; KILL", proc.pid, _SLUICE_STOP_S
                    )
                    proc.kill()
                    proc.wait(_SLUICE_STOP_S)
            self.proc = None
        if proc.returncode not in (0, -signal.SIGTERM):
            log.warning("sluice broker exited with %s", proc.returncode)

    def log_tail(self) -> str:
        return tail(self.log_path) if self.log_path else ""


class PeerBroker(Broker):
    """ActiveMQ or RabbitMQ through its script in benchmarks/peers/."""

    def __init__(self, name: str, label: str, script: Path, bench_args: list[str]) -> None:
        self.name = name
        self.label = label
        self.script = script
        self._bench_args = bench_args
        self.data_dir: Path | None = None
        self.script_log: Path | None = None
        self.pids: list[int] = []

    def _env(self) -> dict[str, str]:
        # The readiness probe runs with the project's interpreter.
        return dict(os.environ, PEER_PYTHON=sys.executable)

    def install(self, log_path: Path, *, stop_system_service: bool = False) -> str:
        args = [str(self.script), "install"]
        if stop_system_service:
            args.append("--stop-system-service")
        done = run_command(args, timeout_s=_INSTALL_S, output=log_path, env=self._env())
        if done.timed_out or done.returncode != 0:
            raise BrokerError(f"{self.script.name} install failed: {tail(log_path, 5)}")
        lines = [ln for ln in tail(log_path, 40).splitlines() if ln.startswith(self.label)]
        return lines[-1].strip() if lines else self.label

    def start(self, data_dir: Path, cap: TaskCap) -> Running:
        self.data_dir = data_dir
        self.script_log = data_dir.parent / f"{data_dir.name}.{self.name}.script.log"
        self.pids = []
        started = time.monotonic()
        port = free_port()
        done = run_command(
            cap.wrap([str(self.script), "start", str(data_dir), str(port)]),
            timeout_s=_PEER_START_S,
            output=self.script_log,
            env=self._env(),
        )
        if done.timed_out or done.returncode != 0:
            why = "timed out" if done.timed_out else f"exit {done.returncode}"
            detail = tail(self.script_log, 5)
            self.stop()
            raise BrokerError(f"{self.script.name} start {why}: {detail}")
        version = ""
        for line in tail(self.script_log, 40).splitlines():
            if line.startswith(self.label):
                version = line.strip()
        pid = self._measured_pid(data_dir)
        if pid is None:
            self.stop()
            raise BrokerError(f"{self.name} started but its broker pid was not found")
        return Running(port, pid, version, time.monotonic() - started)

    def _measured_pid(self, data_dir: Path) -> int | None:
        """The java process (ActiveMQ) or beam.smp (RabbitMQ) of this instance."""
        for name in ("beam.pid", "pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int((data_dir / name).read_text().strip())
                if pid_alive(pid) and _comm(pid) in ("java", "beam.smp"):
                    self.pids.append(pid)
                    return pid
        with contextlib.suppress(OSError, ValueError):
            root = int((data_dir / "pid").read_text().strip())
            for pid in _descendants(root):
                if _comm(pid) == "beam.smp":
                    self.pids.append(pid)
                    return pid
        return None

    def stop(self) -> None:
        data_dir = self.data_dir
        if data_dir is None:
            return
        assert self.script_log is not None
        with deferred_interrupts():
            done = run_command(
                [str(self.script), "stop", str(data_dir)],
                timeout_s=_PEER_STOP_S,
                output=self.script_log,
                env=self._env(),
            )
            if done.timed_out or done.returncode != 0:
                log.warning("%s stop failed: %s", self.name, tail(self.script_log, 5))
            for pid in self.pids:
                if pid_alive(pid):
                    log.warning("%s pid %d survived stop; KILL", self.name, pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            self.data_dir = None

    def bench_args(self) -> list[str]:
        return list(self._bench_args)

    def log_tail(self) -> str:
        parts = []
        if self.script_log:
            parts.append(tail(self.script_log, 8))
        if self.data_dir:
            parts.append(tail(self.data_dir / "log", 8))
        return "\n".join(p for p in parts if p)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def make_brokers(names: list[str], repo: Path) -> list[Broker]:
    """The brokers named, in the order given."""
    bin_dir = Path(sys.executable).parent
    peers = repo / "benchmarks" / "peers"
    guest = ["--login", "guest", "--passcode", "guest"]
    table: dict[str, Broker] = {
        "sluice": SluiceBroker(bin_dir / "sluice", Path(sys.executable)),
        # The same with every acknowledgement synced on its own (`[store] sync_acks = true`).
        "sluice-sync-acks": SluiceBroker(
            bin_dir / "sluice",
            Path(sys.executable),
            name="sluice-sync-acks",
            label="Sluice (sync_acks)",
            settings={"SLUICE_STORE__SYNC_ACKS": "true"},
        ),
        "activemq": PeerBroker("activemq", "ActiveMQ", peers / "activemq.sh", guest),
        # RabbitMQ reads the CONNECT host header as the virtual host; "/" exists on every node.
        "rabbitmq": PeerBroker(
            "rabbitmq", "RabbitMQ", peers / "rabbitmq.sh", [*guest, "--host-header", "/"]
        ),
    }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown broker(s) {', '.join(unknown)}; known: {', '.join(table)}")
    return [table[n] for n in names]
