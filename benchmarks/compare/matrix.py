"""The run matrix: for each run, each scenario, each broker in a rotated order, one attempt.

An attempt starts its broker on an empty data directory, runs `sluice bench ... --json FILE`
against it, stops the broker and removes the data. Whatever goes wrong in one attempt (the
broker does not start, the bench fails or times out, verification fails) is recorded in that
attempt's record with its reason; the matrix goes on. Only KeyboardInterrupt ends it early, and
then the broker of the attempt in progress is still stopped on the way out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare.brokers import Broker, BrokerError
from compare.procs import TaskCap, deferred_interrupts, run_command
from compare.scenarios import Scenario, metric_value

__all__ = [
    "MatrixSettings",
    "bench_command",
    "revision_label",
    "run_matrix",
    "sluice_revision",
    "sluice_source",
]

log = logging.getLogger(__name__)

# How long a bench may run past its own --timeout before it is stopped from outside.
_BENCH_SLACK_S = 180.0
_SETTLE_S = 2.0
_REASON_CHARS = 400


@dataclass(frozen=True)
class MatrixSettings:
    """What the matrix runs and where."""

    runs: int
    quick: bool
    work_dir: Path
    repo: Path  # the checkout the Sluice broker runs from (see sluice_source)
    max_broker_tasks: int  # 0: no cap


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "--no-optional-locks", "-C", str(repo), *args],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return result.stdout.decode(errors="replace")


def sluice_source(python: Path) -> Path:
    """The checkout (git top level) that `python` imports sluice from, as the broker will."""
    done = subprocess.run(
        [
            str(python),
            "-c",
            "import pathlib, sluice; print(pathlib.Path(sluice.__file__).resolve().parent)",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    package = Path(done.stdout.strip() or ".")
    top = _git(package, "rev-parse", "--show-toplevel").strip()
    return Path(top) if top else package


def sluice_revision(repo: Path) -> dict[str, Any]:
    """The commit (HEAD) of a tree, and what differs from it.

    `changes` counts tracked files that differ anywhere plus untracked files under src/;
    `src_changes` those under src/, which is the code that runs.
    """
    commit = _git(repo, "rev-parse", "HEAD").strip()
    tracked = _git(repo, "status", "--porcelain", "--untracked-files=no").splitlines()
    untracked = [
        line
        for line in _git(
            repo, "status", "--porcelain", "--untracked-files=all", "--", "src"
        ).splitlines()
        if line.startswith("??")
    ]
    changed = sorted(set(tracked) | set(untracked))
    in_src = [line for line in changed if line[3:].startswith("src/")]
    revision: dict[str, Any] = {
        "commit": commit,
        "changes": len(changed),
        "src_changes": len(in_src),
    }
    if changed:
        digest = hashlib.sha256(_git(repo, "diff", "HEAD").encode())
        digest.update("\n".join(changed).encode())
        revision["diff_sha256"] = digest.hexdigest()[:12]
        revision["changed_files"] = [line[3:] for line in changed][:20]
    return revision


def revision_label(revision: dict[str, Any]) -> str:
    """'abc123def456' or 'abc123def456 + 3 uncommitted change(s) (diff 0123abcd)'."""
    label = str(revision.get("commit", "?"))[:12]
    changes = revision.get("changes", revision.get("src_changes"))
    if changes:
        digest = revision.get("diff_sha256", revision.get("src_diff_sha256", "?"))
        label += f" + {changes} uncommitted change(s) (diff {digest})"
    return label


def bench_command(
    sluice: Path, scenario: Scenario, broker: Broker, *, quick: bool, port: str, pid: str
) -> list[str]:
    """The `sluice bench` command line of one attempt (without --json)."""
    args = [str(sluice), "bench", *scenario.bench_args(quick=quick)]
    args += ["--broker", f"127.0.0.1:{port}", *broker.bench_args(), "--broker-pid", pid]
    return args


def _rotated(brokers: list[Broker], by: int) -> list[Broker]:
    by %= len(brokers)
    return brokers[by:] + brokers[:by]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _read_results(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    results = document.get("results") if isinstance(document, dict) else None
    return results if isinstance(results, dict) else None


def _last_error_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("sluice bench") and ": " in line:
            return line
    for line in reversed(lines):
        if line.strip():
            return line
    return ""


def _run_bench(
    settings: MatrixSettings,
    scenario: Scenario,
    broker: Broker,
    port: int,
    pid: int,
    attempt_dir: Path,
    record: dict[str, Any],
) -> None:
    json_path = attempt_dir / "bench.json"
    output = attempt_dir / "bench.log"
    sluice = Path(sys.executable).parent / "sluice"
    args = bench_command(
        sluice, scenario, broker, quick=settings.quick, port=str(port), pid=str(pid)
    )
    args += ["--json", str(json_path)]
    record["bench_command"] = " ".join(args)
    done = run_command(args, timeout_s=scenario.timeout_s + _BENCH_SLACK_S, output=output)
    record["bench_s"] = round(done.seconds, 1)
    record["exit_code"] = done.returncode
    results = _read_results(json_path)
    record["results"] = results
    if done.timed_out:
        record["failure"] = f"sluice bench did not end within {scenario.timeout_s:g} s + slack"
    elif results is None:
        record["failure"] = _short(
            f"sluice bench exited {done.returncode} without results: {_last_error_line(output)}"
        )
    elif done.returncode != 0 or not results.get("ok"):
        record["failure"] = _short(str(results.get("failure") or _last_error_line(output)))
    else:
        record["ok"] = True
    record["metrics"] = {
        m.key: metric_value(results, m)
        for m in scenario.metrics
        if results is not None and (record["ok"] or m.from_failed_runs)
    }
    if not record["ok"]:
        record["bench_output_tail"] = "\n".join(
            output.read_text(errors="replace").splitlines()[-12:]
        )


def run_attempt(
    settings: MatrixSettings, run: int, scenario: Scenario, broker: Broker
) -> dict[str, Any]:
    """One scenario against one fresh broker; the record of what happened."""
    attempt_dir = settings.work_dir / f"run{run}-{scenario.name}-{broker.name}"
    attempt_dir.mkdir(parents=True)
    record: dict[str, Any] = {
        "run": run,
        "scenario": scenario.name,
        "broker": broker.name,
        "ok": False,
        "failure": None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    # The code every side of the attempt runs: the broker, and `sluice bench` itself.
    revision = sluice_revision(settings.repo)
    record["sluice_commit"] = revision["commit"]
    record["sluice_revision"] = revision
    cap_name = f"sluice-compare-{os.getpid()}-{run}-{scenario.name}-{broker.name}"
    cap = TaskCap(cap_name, settings.max_broker_tasks)
    record["task_cap"] = settings.max_broker_tasks if cap.path else None
    started = time.monotonic()
    try:
        try:
            running = broker.start(attempt_dir / "data", cap)
        except BrokerError as exc:
            record["failure"] = _short(f"broker did not start: {exc}")
            record["broker_log_tail"] = broker.log_tail()
            return record
        record["broker_start_s"] = round(running.start_s, 1)
        record["broker_version"] = running.version or None
        record["broker_pid"] = running.pid
        _run_bench(settings, scenario, broker, running.port, running.pid, attempt_dir, record)
        if not record["ok"]:
            record["broker_log_tail"] = broker.log_tail()
    finally:
        with deferred_interrupts():
            broker.stop()
            record["tasks_peak"] = cap.peak()
            refused = cap.refused()
            record["tasks_refused"] = refused
            leftovers = cap.remove()
            if leftovers:
                record["killed_leftovers"] = leftovers
            if refused and record["failure"]:
                record["failure"] = _short(
                    f"{record['failure']} (the broker reached the cap of "
                    f"{settings.max_broker_tasks:,} tasks: {refused:,} thread/process "
                    "creations refused)"
                )
            shutil.rmtree(attempt_dir / "data", ignore_errors=True)
            record["attempt_s"] = round(time.monotonic() - started, 1)
            # Dirty pages of this broker's writes are not left for the next one to flush.
            os.sync()
    return record


def run_matrix(
    settings: MatrixSettings,
    scenarios: list[Scenario],
    brokers: list[Broker],
    record: Callable[[dict[str, Any]], None],
    progress: Callable[[str], None],
) -> None:
    """Every attempt, interleaved; `record` gets each attempt's record as soon as it is done."""
    total = settings.runs * len(scenarios) * len(brokers)
    done = 0
    for run in range(1, settings.runs + 1):
        for index, scenario in enumerate(scenarios):
            for broker in _rotated(brokers, run - 1 + index):
                done += 1
                progress(f"[{done}/{total}] run {run} {scenario.name} {broker.name}")
                attempt = run_attempt(settings, run, scenario, broker)
                progress(_describe(scenario, attempt))
                record(attempt)
                time.sleep(_SETTLE_S)


def _describe(scenario: Scenario, attempt: dict[str, Any]) -> str:
    if not attempt["ok"] and not attempt.get("metrics"):
        return f"    FAILED: {attempt['failure']}"
    parts = []
    for metric in scenario.metrics:
        value = attempt.get("metrics", {}).get(metric.key)
        if value is not None:
            parts.append(f"{metric.label} {value:{metric.fmt}}")
    line = "    " + ", ".join(parts) + f" ({attempt.get('attempt_s', 0):.0f} s)"
    if not attempt["ok"]:
        line += f"  FAILED: {attempt['failure']}"
    return line
