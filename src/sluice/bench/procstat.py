"""CPU time and memory of processes, from /proc: the broker's, and the load generator's own.

`read_cpu_s` is utime + stime of /proc/PID/stat: the whole process, every thread included (the
kernel adds up live threads and those that have ended). `CpuMeter` takes two readings of a set of
named processes around a window of the run and reports the CPU seconds each used in it, the wall
time, the utilisation (CPU seconds per wall second: 1.0 is one core busy) and, given a message
count, the CPU microseconds per message. A process that did not exist yet at the first reading
counts from zero; one that cannot be read at the end is reported without a figure.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

__all__ = ["CpuMeter", "read_cpu_s", "read_rss_kib"]

_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Fields after the parenthesised command name of /proc/PID/stat: state is the first, utime and
# stime (stat fields 14 and 15) the 12th and 13th.
_UTIME_FIELD = 11
_STIME_FIELD = 12
_US_PER_S = 1e6
_DIGITS = 6


def read_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds a process has used, None if it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    try:
        ticks = int(fields[_UTIME_FIELD]) + int(fields[_STIME_FIELD])
    except (IndexError, ValueError):
        return None
    return ticks / _CLOCK_TICKS_PER_S


def read_rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB from /proc/PID/status, or None if it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


class CpuMeter:
    """CPU seconds of named processes between `start` and `stop`."""

    def __init__(self) -> None:
        self._started = 0.0
        self._base: dict[int, float] = {}
        self._wall_s: float | None = None
        self._used: dict[int, float | None] = {}

    def start(self, pids: list[int]) -> None:
        """First reading; pids not given (or not readable) will count from zero."""
        self._started = time.monotonic()
        self._base = {pid: cpu for pid in pids if (cpu := read_cpu_s(pid)) is not None}

    def stop(self, pids: list[int]) -> None:
        """Second reading, of these pids."""
        self._wall_s = time.monotonic() - self._started
        used: dict[int, float | None] = {}
        for pid in pids:
            cpu = read_cpu_s(pid)
            used[pid] = None if cpu is None else max(0.0, cpu - self._base.get(pid, 0.0))
        self._used = used

    @property
    def stopped(self) -> bool:
        """True once `stop` has been called."""
        return self._wall_s is not None

    def figures(self, pid: int, messages: int) -> dict[str, Any] | None:
        """CPU seconds, utilisation and µs per message of one process; None if not measured."""
        cpu = self._used.get(pid)
        if cpu is None or self._wall_s is None:
            return None
        return {
            "pid": pid,
            "cpu_s": round(cpu, _DIGITS),
            "utilization": round(cpu / self._wall_s, 4) if self._wall_s > 0 else None,
            "us_per_msg": round(cpu * _US_PER_S / messages, 3) if messages else None,
        }

    def report(
        self, broker_pid: int | None, generator: dict[str, int], messages: int
    ) -> dict[str, Any] | None:
        """The window's figures: the broker, each generator process by name, and their sum."""
        if self._wall_s is None:
            return None
        processes = []
        total = 0.0
        complete = True
        for name, pid in generator.items():
            figures = self.figures(pid, messages)
            if figures is None:
                complete = False
            else:
                total += figures["cpu_s"]
            processes.append({"name": name, **(figures or {"pid": pid, "cpu_s": None})})
        wall_s = self._wall_s
        return {
            "wall_s": round(wall_s, _DIGITS),
            "messages": messages,
            "broker": self.figures(broker_pid, messages) if broker_pid is not None else None,
            "generator": {
                "cpu_s": round(total, _DIGITS) if complete else None,
                "utilization": round(total / wall_s, 4) if complete and wall_s > 0 else None,
                "us_per_msg": (
                    round(total * _US_PER_S / messages, 3) if complete and messages else None
                ),
                "processes": processes,
            },
        }
