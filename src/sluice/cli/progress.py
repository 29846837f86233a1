"""A one-line progress bar on stderr for `sluice put` and `sluice get` (standard library only).

It redraws at most every `REDRAW_INTERVAL_S`, shows bytes done (of the total when known), the
rate over the last `RATE_WINDOW_S`, and the time left when the total is known. It draws nothing
when disabled (not a terminal, or `--quiet`).
"""

from __future__ import annotations

import shutil
import time
from collections import deque
from typing import TextIO

__all__ = ["Progress", "format_bytes", "format_duration"]

REDRAW_INTERVAL_S = 0.2
RATE_WINDOW_S = 5.0
# Samples kept for the rate: one per redraw over the window, and a few more.
_MAX_SAMPLES = int(RATE_WINDOW_S / REDRAW_INTERVAL_S) + 4
_BAR_CHARS = 20
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """75 -> '1:15', 3725 -> '1:02:05'."""
    total = max(0, int(seconds + 0.5))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Progress of one transfer of `total` bytes (None if unknown), starting at `start`."""

    def __init__(
        self,
        label: str,
        total: int | None,
        out: TextIO,
        *,
        enabled: bool,
        start: int = 0,
    ) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self._out = out
        self.done = start
        self._started_s = time.monotonic()
        self._start = start
        self._last_draw_s = 0.0
        self._samples: deque[tuple[float, int]] = deque(maxlen=_MAX_SAMPLES)
        self._samples.append((self._started_s, start))
        self._drawn = False

    def update(self, done: int) -> None:
        """`done` bytes so far; redraws if it is time."""
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw_s < REDRAW_INTERVAL_S:
            return
        self._last_draw_s = now
        self._samples.append((now, done))
        self._draw(now)

    def rate(self, now: float | None = None) -> float:
        """Bytes per second over the last few seconds."""
        now = time.monotonic() if now is None else now
        samples = self._samples
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        first_s, first = samples[0]
        elapsed = now - first_s
        return (self.done - first) / elapsed if elapsed > 0 else 0.0

    def average_rate(self) -> float:
        """Bytes per second since the start."""
        elapsed = time.monotonic() - self._started_s
        return (self.done - self._start) / elapsed if elapsed > 0 else 0.0

    def elapsed_s(self) -> float:
        """Seconds since the start."""
        return time.monotonic() - self._started_s

    def _line(self, now: float, width: int) -> str:
        """The progress line, fitted to `width` columns: the bar goes first, then the label."""
        rate = self.rate(now)
        total = self.total
        if total:
            fraction = min(1.0, self.done / total)
            filled = int(fraction * _BAR_CHARS)
            bar = " [" + "#" * filled + "-" * (_BAR_CHARS - filled) + "]"
            left = (total - self.done) / rate if rate > 0 else None
            eta = format_duration(left) if left is not None else "?"
            numbers = (
                f" {fraction * 100:5.1f}%{{bar}} {format_bytes(self.done)}"
                f" / {format_bytes(total)}  {format_bytes(rate)}/s  ETA {eta}"
            )
        else:
            bar = ""
            numbers = f"{{bar}} {format_bytes(self.done)}  {format_bytes(rate)}/s"
        if len(self.label) + len(numbers.format(bar=bar)) > width:
            bar = ""
        tail = numbers.format(bar=bar)
        room = max(8, width - len(tail))
        label = self.label if len(self.label) <= room else self.label[: room - 1] + "~"
        return (label + tail)[:width]

    def _draw(self, now: float) -> None:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self._out.write("\r" + self._line(now, width).ljust(width))
        self._out.flush()
        self._drawn = True

    def close(self) -> None:
        """Draw the final state and end the line."""
        if not self.enabled:
            return
        self._samples.append((time.monotonic(), self.done))
        self._draw(time.monotonic())
        self._out.write("\n")
        self._out.flush()
        self._drawn = False
