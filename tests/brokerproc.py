"""Run `sluice broker` in a subprocess (for memory measurements and crash tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

_LISTENING = re.compile(r"listening on [\d.]+:(\d+)")


class BrokerProcess:
    """A broker subprocess on a port chosen by the OS."""

    def __init__(self, config_toml: str, workdir: Path, *extra_args: str) -> None:
        self.workdir = workdir
        self.config_path = workdir / "sluice.toml"
        self.config_path.write_text(config_toml)
        self.args = [
            sys.executable,
            "-m",
            "sluice",
            "-v",
            "broker",
            "--config",
            str(self.config_path),
            "--stomp",
            "127.0.0.1:0",
            *extra_args,
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.stderr_lines: list[str] = []
        self._drain = threading.Thread()
        self._lines_changed = threading.Condition()
        self._stderr_closed = False

    def start(self, timeout: float | None = None) -> BrokerProcess:
        """Start and wait for the line that names the port (without a bound by default: a
        start with a large store takes long, and the broker's exit ends the wait)."""
        self.launch()
        self.wait_listening(timeout)
        return self

    def launch(self) -> BrokerProcess:
        """Start without waiting; stderr is read on a thread from the first line on."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.args,
            cwd=self.workdir,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        # Keep draining stderr so the broker never blocks on a full pipe.
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        return self

    def wait_listening(self, timeout: float | None = 30.0) -> int:
        """Wait for the line that names the port; return the port."""
        self.wait_log(_LISTENING.pattern, timeout)
        return self.port

    def wait_log(self, pattern: str, timeout: float | None = 30.0, *, nth: int = 1) -> str:
        """Wait for the `nth` stderr line matching the regular expression `pattern`; return the
        line. Raises RuntimeError if the broker exits first, TimeoutError after `timeout`."""
        regex = re.compile(pattern)

        def matching() -> list[str]:
            return [line for line in self.stderr_lines if regex.search(line)]

        with self._lines_changed:
            ok = self._lines_changed.wait_for(
                lambda: len(matching()) >= nth or self._stderr_closed, timeout
            )
            found = matching()
            if len(found) >= nth:
                return found[nth - 1]
        if not ok:
            raise TimeoutError(f"no line matching {pattern!r} in {timeout} s:\n{self.log_text}")
        raise RuntimeError(f"broker exited before {pattern!r}:\n{self.log_text}")

    def _read_stderr(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lines_changed:
                self.stderr_lines.append(line)
                match = _LISTENING.search(line)
                if match and not self.port:
                    self.port = int(match.group(1))
                self._lines_changed.notify_all()
        with self._lines_changed:
            self._stderr_closed = True
            self._lines_changed.notify_all()

    @property
    def log_text(self) -> str:
        """Everything the broker logged so far."""
        return "".join(self.stderr_lines)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_bytes(self) -> int:
        """Resident set size of the broker process now."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self._drain.ident is not None:
            self._drain.join(30)
        return self.proc.returncode
