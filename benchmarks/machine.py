#!/usr/bin/env python3
"""Measure the physical limits of this machine that bound a persistent broker.

Run before and after a benchmark run, so its results can be read against what the disk and the
CPU could do at the time (these machines are shared; numbers drift).

Measures, in one run:

- sync rate: append RECORD-byte records to a file preallocated with zeros (so the appends change
  no file size or extent metadata), calling fsync (then, separately, fdatasync) after each one,
  for SECONDS each; prints syncs/s and the p50/p90/p99/max latency of one write+sync.
  With --growing, the same on a file that grows with every append.
- sequential write: SIZE bytes in BLOCK-byte writes to a new file, one fsync at the end;
  prints MB/s (10^6 bytes) including the fsync, and the page-cache-only rate.
- the machine: CPU model and cores, memory, kernel, Python, load average, the filesystem of the
  measured directory.

Stdlib only. Human-readable lines by default, one JSON document with --json.

    python benchmarks/machine.py [--dir DIR] [--sync-seconds 3] [--record-bytes 1024]
                                 [--seq-bytes 1GiB] [--growing] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(text: str) -> int:
    """'1GiB' -> 1073741824, '64MiB', '500MB', '4096' (bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4096, 64MiB, 1GiB, 500MB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


@dataclasses.dataclass
class SyncResult:
    call: str  # fsync or fdatasync
    file: str  # preallocated or growing
    record_bytes: int
    seconds: float
    syncs: int
    syncs_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


@dataclasses.dataclass
class SeqResult:
    bytes: int
    block_bytes: int
    write_s: float
    fsync_s: float
    total_s: float
    mb_per_s: float  # including the final fsync
    cache_mb_per_s: float  # write() calls only, i.e. into the page cache


def _sync_fn(call: str) -> Callable[[int], None]:
    if call == "fdatasync":
        return os.fdatasync
    return os.fsync


def measure_sync(
    directory: Path,
    call: str,
    *,
    preallocated: bool,
    record_bytes: int,
    seconds: float,
    prealloc_bytes: int,
) -> SyncResult:
    """Append records for `seconds`, syncing after each; wraps around a preallocated file."""
    path = directory / f"machine-sync-{call}-{os.getpid()}.dat"
    sync = _sync_fn(call)
    record = (b"sluice-machine-probe\n" * (record_bytes // 21 + 1))[:record_bytes]
    latencies: list[float] = []
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        slots = max(1, prealloc_bytes // record_bytes)
        if preallocated:
            zeros = bytes(MIB)
            remaining = slots * record_bytes
            while remaining > 0:
                remaining -= os.write(fd, zeros[: min(MIB, remaining)])
            os.fsync(fd)
        with contextlib.suppress(OSError):  # a directory fsync is not possible everywhere
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        offset = 0
        start = time.perf_counter()
        deadline = start + seconds
        now = start
        while now < deadline:
            t0 = now
            if preallocated:
                os.pwrite(fd, record, (offset % slots) * record_bytes)
                offset += 1
            else:
                os.write(fd, record)
            sync(fd)
            now = time.perf_counter()
            latencies.append(now - t0)
        elapsed = now - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    latencies.sort()
    return SyncResult(
        call=call,
        file="preallocated" if preallocated else "growing",
        record_bytes=record_bytes,
        seconds=round(elapsed, 3),
        syncs=len(latencies),
        syncs_per_s=round(len(latencies) / elapsed, 1),
        p50_ms=round(percentile(latencies, 50) * 1000, 3),
        p90_ms=round(percentile(latencies, 90) * 1000, 3),
        p99_ms=round(percentile(latencies, 99) * 1000, 3),
        max_ms=round(latencies[-1] * 1000, 3),
    )


def measure_sequential(directory: Path, total_bytes: int, block_bytes: int) -> SeqResult:
    """Write `total_bytes` to a new file in `block_bytes` writes, fsync once, delete it."""
    path = directory / f"machine-seq-{os.getpid()}.dat"
    # Incompressible data, in case the virtual disk compresses or deduplicates.
    block = os.urandom(block_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        t0 = time.perf_counter()
        while written < total_bytes:
            view = memoryview(block)[: min(block_bytes, total_bytes - written)]
            while view:
                n = os.write(fd, view)
                view = view[n:]
                written += n
        t1 = time.perf_counter()
        os.fsync(fd)
        t2 = time.perf_counter()
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return SeqResult(
        bytes=written,
        block_bytes=block_bytes,
        write_s=round(t1 - t0, 3),
        fsync_s=round(t2 - t1, 3),
        total_s=round(t2 - t0, 3),
        mb_per_s=round(written / (t2 - t0) / 1e6, 1),
        cache_mb_per_s=round(written / (t1 - t0) / 1e6, 1),
    )


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _meminfo() -> dict[str, int]:
    info: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            info[key] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return info


def _filesystem(directory: Path) -> dict[str, Any]:
    """The mount holding `directory` (longest mount-point prefix) and its free space."""
    real = str(directory.resolve())
    best: tuple[str, str, str, str] = ("", "?", "?", "")
    for line in _read("/proc/self/mounts").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[0], fields[2], fields[3])
    usage = shutil.disk_usage(real)
    return {
        "path": real,
        "mount_point": best[0],
        "device": best[1],
        "type": best[2],
        "options": best[3],
        "free_bytes": usage.free,
        "total_bytes": usage.total,
    }


def machine_info() -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    mem = _meminfo()
    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable_cpus = os.cpu_count() or 0
    uname = platform.uname()
    return {
        "hostname": socket.gethostname(),
        "cpu_model": model.group(1).strip() if model else (uname.processor or uname.machine),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable_cpus,
        "memory_total_bytes": mem.get("MemTotal"),
        "memory_available_bytes": mem.get("MemAvailable"),
        "kernel": f"{uname.system} {uname.release} {uname.version}",
        "arch": uname.machine,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "python_executable": sys.executable,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


@contextlib.contextmanager
def _work_dir(requested: str | None) -> Iterator[Path]:
    if requested:
        path = Path(requested)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="sluice-machine-") as tmp:
        yield Path(tmp)


def run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    started = dt.datetime.now(dt.UTC)
    result: dict[str, Any] = {
        "timestamp": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
    }
    with _work_dir(args.dir) as directory:
        result["filesystem"] = _filesystem(directory)
        syncs: list[dict[str, Any]] = []
        if args.sync_seconds > 0:
            files = [True, False] if args.growing else [True]
            for preallocated in files:
                for call in ("fsync", "fdatasync"):
                    kind = "preallocated" if preallocated else "growing"
                    progress(f"{call} after each {args.record_bytes}-byte append ({kind} file)")
                    sync_result = measure_sync(
                        directory,
                        call,
                        preallocated=preallocated,
                        record_bytes=args.record_bytes,
                        seconds=args.sync_seconds,
                        prealloc_bytes=args.prealloc_bytes,
                    )
                    syncs.append(dataclasses.asdict(sync_result))
        result["sync"] = syncs
        result["sequential"] = None
        if args.seq_bytes > 0:
            free = shutil.disk_usage(directory).free
            if free < args.seq_bytes + 256 * MIB:
                progress(f"skipping the sequential write: only {free // MIB} MiB free")
                result["sequential_skipped"] = f"only {free} bytes free"
            else:
                progress(f"sequential write of {args.seq_bytes // MIB} MiB, one fsync")
                seq = measure_sequential(directory, args.seq_bytes, args.block_bytes)
                result["sequential"] = dataclasses.asdict(seq)
    result["duration_s"] = round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1)
    return result


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024**3:.1f} GiB"


def format_human(result: dict[str, Any]) -> str:
    m = result["machine"]
    fs = result["filesystem"]
    lines = [
        f"machine     {m['hostname']} at {result['timestamp']}",
        f"cpu         {m['cpu_model']} ({m['cpu_count']} logical, {m['cpus_usable']} usable)",
        f"memory      {_gib(m['memory_total_bytes'])} total, "
        f"{_gib(m['memory_available_bytes'])} available",
        f"kernel      {m['kernel']} ({m['arch']})",
        f"python      {m['python']} ({m['python_executable']})",
        f"load        {' '.join(str(x) for x in m['loadavg'])}",
        f"disk        {fs['path']}: {fs['type']} on {fs['device']} ({fs['mount_point']}), "
        f"{_gib(fs['free_bytes'])} free",
    ]
    for s in result["sync"]:
        lines.append(
            f"{s['call']:<11} {s['syncs_per_s']:>8.0f}/s  {s['record_bytes']} B appends, "
            f"{s['file']} file, {s['syncs']} in {s['seconds']:.1f} s; write+sync ms "
            f"p50 {s['p50_ms']:.3f} p90 {s['p90_ms']:.3f} p99 {s['p99_ms']:.3f} "
            f"max {s['max_ms']:.3f}"
        )
    seq = result.get("sequential")
    if seq:
        lines.append(
            f"seq write   {seq['mb_per_s']:>8.1f} MB/s  {seq['bytes'] // MIB} MiB in "
            f"{seq['block_bytes'] // 1024} KiB writes + one fsync: {seq['total_s']:.2f} s "
            f"(writes {seq['write_s']:.2f} s = {seq['cache_mb_per_s']:.0f} MB/s to the page "
            f"cache, fsync {seq['fsync_s']:.2f} s)"
        )
    elif "sequential_skipped" in result:
        lines.append(f"seq write   skipped: {result['sequential_skipped']}")
    lines.append(f"took        {result['duration_s']} s")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure sync rate, sequential write rate and machine facts.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--dir", help="directory to measure (default: a new temporary directory, removed after)"
    )
    parser.add_argument(
        "--sync-seconds",
        type=float,
        default=3.0,
        help="seconds per sync test (0 skips them)",
    )
    parser.add_argument(
        "--record-bytes", type=parse_size, default=1024, help="bytes appended before each sync"
    )
    parser.add_argument(
        "--prealloc-bytes",
        type=parse_size,
        default=64 * MIB,
        help="size of the zero-filled file the sync test appends into (wraps around)",
    )
    parser.add_argument(
        "--growing",
        action="store_true",
        help="also run the sync tests on a file that grows with each append",
    )
    parser.add_argument(
        "--seq-bytes",
        type=parse_size,
        default=1024 * MIB,
        help="bytes for the sequential write test (0 skips it)",
    )
    parser.add_argument(
        "--block-bytes", type=parse_size, default=1 * MIB, help="write size, sequential test"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document only")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.record_bytes <= 0 or args.block_bytes <= 0:
        parser.error("--record-bytes and --block-bytes must be positive")
    if args.prealloc_bytes < args.record_bytes:
        parser.error("--prealloc-bytes must be at least --record-bytes")

    def progress(message: str) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr, flush=True)

    result = run(args, progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_human(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
