"""The command line of `benchmarks/compare.py`: options, the whole session, the outputs.

A session refuses to start when the Sluice checkout the broker runs from (or the harness's own)
has uncommitted changes, unless `--allow-dirty`: a result must name the commit that made it, and
every attempt records that commit (HEAD) as it starts.

A session: install the peers (their scripts are idempotent), measure the machine
(`benchmarks/machine.py`), run the matrix, measure the machine again, then write the raw JSON,
the charts and the generated section of the Markdown document. While the matrix runs, the records
so far are kept in `<json>.partial`; it is removed once the final JSON is written, and kept
(with the section left untouched) when the session is interrupted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from compare.brokers import BROKER_NAMES, Broker, BrokerError, make_brokers
from compare.charts import draw_charts
from compare.markdown import relative_charts, render_section, replace_section
from compare.matrix import MatrixSettings, run_matrix, sluice_revision, sluice_source
from compare.procs import TaskCap, deferred_interrupts, remove_caps, run_command
from compare.scenarios import SCENARIOS, Scenario, by_name
from compare.summary import summarize

__all__ = ["main"]

log = logging.getLogger("compare")

REPO = Path(__file__).resolve().parents[2]
LABELS = {"sluice": "Sluice", "activemq": "ActiveMQ", "rabbitmq": "RabbitMQ"}
DEFAULT_RUNS = 3
# Enough for any broker with a thread or two per connection at 1,000 connections, and far below
# this machine's pid_max (32,768), which every process on it shares.
DEFAULT_MAX_BROKER_TASKS = 16_384
_MACHINE_TIMEOUT_S = 600.0
EXIT_INTERRUPTED = 130
EXIT_DIRTY = 2


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The options of benchmarks/compare.py."""
    quick_dir = Path(tempfile.gettempdir()) / "sluice-compare-quick"
    parser = argparse.ArgumentParser(
        prog="benchmarks/compare.py",
        description=(
            "Run every scenario against Sluice, ActiveMQ and RabbitMQ, interleaved, several runs "
            "each; write the raw results as JSON, PNG charts and a generated section of "
            "docs/benchmarks.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help=f"runs of every scenario (default {DEFAULT_RUNS}, quick 1)",
    )
    parser.add_argument(
        "--scenarios",
        type=_csv,
        default=None,
        help=f"comma-separated subset of: {','.join(s.name for s in SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--brokers", type=_csv, default=list(BROKER_NAMES), help="comma-separated, sluice first"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test of the harness: small counts, 1 run (unless --runs), outputs under "
        f"{quick_dir} unless --json/--doc/--img-dir say otherwise",
    )
    parser.add_argument("--json", type=Path, default=None, help="raw results (default docs/...)")
    parser.add_argument("--doc", type=Path, default=None, help="Markdown document to update")
    parser.add_argument("--img-dir", type=Path, default=None, help="where the PNG charts go")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="broker data and logs (default: a temp dir)"
    )
    parser.add_argument(
        "--max-broker-tasks",
        type=int,
        default=DEFAULT_MAX_BROKER_TASKS,
        help="pids cgroup cap on each broker's processes and threads (0: none)",
    )
    parser.add_argument("--no-install", action="store_true", help="skip the peers' install step")
    parser.add_argument(
        "--stop-system-services",
        action="store_true",
        help="let the peers' install step stop (and disable at boot) a system ActiveMQ or "
        "RabbitMQ service it finds running; without it, such a service makes that peer "
        "unavailable",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run although the Sluice checkout has uncommitted changes (the results then "
        "cannot be reproduced from a commit)",
    )
    parser.add_argument("--no-machine", action="store_true", help="skip benchmarks/machine.py")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.set_defaults(quick_dir=quick_dir)
    return parser


def _outputs(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    base = args.quick_dir if args.quick else REPO / "docs"
    json_path = args.json or base / "benchmarks-compare.json"
    doc_path = args.doc or base / "benchmarks.md"
    img_dir = args.img_dir or base / "img"
    return json_path, doc_path, img_dir


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _java_version() -> str:
    try:
        result = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = (result.stderr or result.stdout).splitlines()
    return " / ".join(line.strip() for line in lines[:2]) or "unknown"


def _measure_machine(work_dir: Path, quick: bool) -> dict[str, Any]:
    """benchmarks/machine.py --json on the file system the brokers write to."""
    directory = work_dir / "machine"
    directory.mkdir(exist_ok=True)
    output = work_dir / f"machine-{time.monotonic_ns()}.json"
    args = [
        sys.executable,
        str(REPO / "benchmarks" / "machine.py"),
        "--json",
        "--dir",
        str(directory),
    ]
    args += ["--sync-seconds", "1" if quick else "3", "--seq-bytes", "256MiB" if quick else "1GiB"]
    done = run_command(args, timeout_s=_MACHINE_TIMEOUT_S, output=output)
    text = output.read_text(errors="replace")
    try:
        return dict(json.loads(text[text.index("{") : text.rindex("}") + 1]))
    except ValueError:
        return {"error": f"machine.py exit {done.returncode}: {text[-300:]}"}


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _install(
    brokers: list[Broker], work_dir: Path, skip: bool, stop_system_services: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """Install every broker; return their versions and why some are unavailable."""
    versions: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    for broker in brokers:
        if skip and broker.name != "sluice":
            continue
        log.info("install %s", broker.name)
        try:
            versions[broker.name] = broker.install(
                work_dir / f"install-{broker.name}.log", stop_system_service=stop_system_services
            )
        except BrokerError as exc:
            log.error("%s is unavailable: %s", broker.name, exc)
            unavailable[broker.name] = str(exc)
    return versions, unavailable


def _unavailable_records(
    runs: int, scenarios: list[Scenario], unavailable: dict[str, str]
) -> list[dict[str, Any]]:
    return [
        {
            "run": run,
            "scenario": scenario.name,
            "broker": name,
            "ok": False,
            "failure": f"broker unavailable: {reason}",
            "metrics": {},
        }
        for run in range(1, runs + 1)
        for scenario in scenarios
        for name, reason in unavailable.items()
    ]


def _finish(
    document: dict[str, Any],
    scenarios: list[Scenario],
    json_path: Path,
    doc_path: Path,
    img_dir: Path,
) -> None:
    document["summary"] = summarize(document["records"], scenarios, document["settings"]["brokers"])
    paths, note = draw_charts(document["summary"], scenarios, LABELS, img_dir)
    charts = relative_charts(paths, doc_path)
    document["charts"] = charts
    if note:
        log.warning("%s", note)
    _write_json(json_path, document)
    replace_section(doc_path, render_section(document, scenarios, charts, note))
    log.info("wrote %s, %s and %d chart(s) in %s", json_path, doc_path, len(paths), img_dir)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when it completed (failed attempts are results, not errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        scenarios = by_name(args.scenarios)
        brokers = make_brokers(args.brokers, REPO)
    except ValueError as exc:
        parser.error(str(exc))
    runs = args.runs or (1 if args.quick else DEFAULT_RUNS)
    if runs < 1:
        parser.error("--runs must be at least 1")
    json_path, doc_path, img_dir = _outputs(args)
    partial_path = json_path.with_name(json_path.name + ".partial")
    source = sluice_source(Path(sys.executable))
    trees = {"sluice": sluice_revision(source)}
    if source.resolve() != REPO.resolve():
        trees["harness"] = sluice_revision(REPO)
    dirty = {name: rev for name, rev in trees.items() if rev["changes"]}
    if dirty and not args.allow_dirty:
        for name, rev in dirty.items():
            where = source if name == "sluice" else REPO
            log.error(
                "the %s checkout %s has %d uncommitted change(s) against %s: %s",
                name,
                where,
                rev["changes"],
                rev["commit"][:12],
                ", ".join(rev.get("changed_files", [])),
            )
        log.error(
            "results must be reproducible from a commit: commit or stash the changes, "
            "or pass --allow-dirty"
        )
        return EXIT_DIRTY
    if args.max_broker_tasks > 0 and not TaskCap.available():
        log.warning("no pids cgroup here: brokers run without a task cap")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)

    own_work_dir = args.work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="sluice-compare-")) if own_work_dir else args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join([".venv/bin/python", "benchmarks/compare.py", *(argv or sys.argv[1:])])
    document: dict[str, Any] = {
        "tool": "benchmarks/compare.py",
        "command": command,
        "repo": str(REPO),
        "sluice_source": str(source),
        "revisions_at_start": trees,
        "allow_dirty": args.allow_dirty,
        "started": _now(),
        "finished": None,
        "interrupted": False,
        "settings": {
            "runs": runs,
            "quick": args.quick,
            "scenarios": [s.name for s in scenarios],
            "brokers": [b.name for b in brokers],
            "max_broker_tasks": args.max_broker_tasks if TaskCap.available() else 0,
            "bench_args": {s.name: list(s.bench_args(quick=args.quick)) for s in scenarios},
        },
        "labels": {b.name: LABELS.get(b.name, b.name) for b in brokers},
        "java": _java_version(),
        "versions": {},
        "machine_before": None,
        "machine_after": None,
        "records": [],
    }
    log.info("work dir %s; results to %s", work_dir, json_path)

    def record(attempt: dict[str, Any]) -> None:
        document["records"].append(attempt)
        _write_json(partial_path, document)

    try:
        _session(args, document, brokers, scenarios, work_dir, record)
    except KeyboardInterrupt:
        document["interrupted"] = True
        log.warning("interrupted; every broker was stopped")
    finally:
        if own_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    document["finished"] = _now()
    if document["interrupted"]:
        _write_json(partial_path, document)
        log.warning("partial results in %s; %s left as it was", partial_path, doc_path)
        return EXIT_INTERRUPTED
    _finish(document, scenarios, json_path, doc_path, img_dir)
    partial_path.unlink(missing_ok=True)
    failed = [r for r in document["records"] if not r["ok"]]
    log.info("%d attempt(s), %d failed", len(document["records"]), len(failed))
    return 0


def _session(
    args: argparse.Namespace,
    document: dict[str, Any],
    brokers: list[Broker],
    scenarios: list[Scenario],
    work_dir: Path,
    record: Callable[[dict[str, Any]], None],
) -> None:
    """Install, measure, run the matrix, measure; every broker is stopped however it ends."""
    runs = document["settings"]["runs"]
    try:
        versions, unavailable = _install(
            brokers, work_dir, args.no_install, args.stop_system_services
        )
        document["versions"] = versions
        document["records"] += _unavailable_records(runs, scenarios, unavailable)
        available = [b for b in brokers if b.name not in unavailable]
        if not args.no_machine:
            log.info("measuring the machine (before)")
            document["machine_before"] = _measure_machine(work_dir, args.quick)
        settings = MatrixSettings(
            runs=runs,
            quick=args.quick,
            work_dir=work_dir,
            repo=Path(document["sluice_source"]),
            max_broker_tasks=document["settings"]["max_broker_tasks"],
        )
        run_matrix(settings, scenarios, available, record, lambda line: log.info("%s", line))
        if not args.no_machine:
            log.info("measuring the machine (after)")
            document["machine_after"] = _measure_machine(work_dir, args.quick)
    finally:
        with deferred_interrupts():
            for broker in brokers:
                try:
                    broker.stop()
                except Exception:
                    log.exception("stopping %s", broker.name)
            remove_caps(f"sluice-compare-{os.getpid()}-")
