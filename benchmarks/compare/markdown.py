"""The generated section of docs/benchmarks.md, and replacing it between its markers.

Only the text between `<!-- compare:begin -->` and `<!-- compare:end -->` is ours; the rest of
the file belongs to others and is kept byte for byte. A missing file is created with a title and
the markers; a file without the markers gets them appended.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from compare.brokers import make_brokers
from compare.matrix import bench_command, revision_label
from compare.scenarios import Scenario
from compare.summary import DASH, TIMES, fmt_value

__all__ = ["BEGIN", "END", "render_section", "replace_section"]

BEGIN = "<!-- compare:begin -->"
END = "<!-- compare:end -->"
_GIB = 1024**3
_REASON_CHARS = 240


def _cell(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _stat_text(stats: dict[str, Any] | None, scenario: Scenario, key: str) -> str:
    if stats is None:
        return DASH
    metric = scenario.metric(key)
    text = fmt_value(stats["median"], metric)
    if len(stats["values"]) > 1:
        text += f" ({fmt_value(stats['min'], metric)}{DASH}{fmt_value(stats['max'], metric)})"
    return text


def _sync_numbers(machine: dict[str, Any] | None) -> dict[str, str]:
    numbers = {"fsync": "?", "fdatasync": "?", "seq": "?", "load": "?"}
    if not machine or "sync" not in machine:
        return numbers
    for sync in machine.get("sync", []):
        if sync.get("file") == "preallocated":
            numbers[sync["call"]] = f"{sync['syncs_per_s']:,.0f}/s (p99 {sync['p99_ms']:.2f} ms)"
    seq = machine.get("sequential")
    if seq:
        numbers["seq"] = f"{seq['mb_per_s']:,.0f} MB/s"
    load = machine.get("machine", {}).get("loadavg")
    if load:
        numbers["load"] = " ".join(f"{x:.2f}" for x in load)
    return numbers


def _machine_lines(doc: dict[str, Any]) -> list[str]:
    before = doc.get("machine_before") or {}
    after = doc.get("machine_after") or {}
    m = before.get("machine") or after.get("machine") or {}
    fs = before.get("filesystem") or {}
    nb, na = _sync_numbers(before), _sync_numbers(after)
    memory = m.get("memory_total_bytes")
    rows = [
        ["CPU", f"{m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} logical CPUs"],
        ["memory", f"{memory / _GIB:.1f} GiB" if memory else "?"],
        ["kernel", _cell(m.get("kernel", "?"))],
        ["Python", _cell(m.get("python", "?"))],
        ["Java", _cell(doc.get("java", "?"))],
    ]
    for name, version in doc.get("versions", {}).items():
        rows.append([doc["labels"].get(name, name), _cell(version)])
    rows += [
        [
            "disk",
            _cell(f"{fs.get('type', '?')} on {fs.get('device', '?')} ({fs.get('path', '?')})"),
        ],
        ["fsync after each 1 KiB write", f"{nb['fsync']} before, {na['fsync']} after"],
        ["fdatasync after each 1 KiB write", f"{nb['fdatasync']} before, {na['fdatasync']} after"],
        ["sequential write, 1 fsync", f"{nb['seq']} before, {na['seq']} after"],
        ["load average (1, 5, 15 min)", f"{nb['load']} before, {na['load']} after"],
    ]
    return _table(["", ""], rows)


def _revision_lines(doc: dict[str, Any]) -> list[str]:
    used: dict[str, list[str]] = {}
    for record in doc.get("records", []):
        if "sluice_revision" not in record:
            continue
        label = revision_label(record["sluice_revision"])
        attempt = f"run {record['run']} {record['scenario']}"
        attempts = used.setdefault(label, [])
        if attempt not in attempts:
            attempts.append(attempt)
    if not used:
        return []
    lines = [
        "The Sluice commit (HEAD of the checkout the Sluice broker and `sluice bench`, the load "
        "generator of every attempt, ran from) as each attempt started:",
        "",
    ]
    for label, attempts in used.items():
        lines.append(f"- `{label}`: {', '.join(attempts)}")
    return [*lines, ""]


def _ratio_text(ratio: dict[str, Any], labels: dict[str, str]) -> str:
    if ratio.get("ratio") is None:
        return DASH
    return f"{ratio['ratio']:.2f} {TIMES} {labels.get(ratio['best_peer'], '?')}"


def _summary_lines(doc: dict[str, Any], scenarios: list[Scenario]) -> list[str]:
    names = doc["settings"]["brokers"]
    labels = doc["labels"]
    header = ["scenario", "metric", *[labels[n] for n in names], "Sluice / best peer", "target", ""]
    rows = []
    for scenario in scenarios:
        data = doc["summary"].get(scenario.name)
        if data is None:
            continue
        target = data.get("target")
        for index, key in enumerate(scenario.summary):
            metric = scenario.metric(key)
            first = index == 0
            cells = [f"[{scenario.name}](#{scenario.name})" if first else "", metric.label]
            for name in names:
                broker = data["brokers"].get(name)
                if broker is None:
                    cells.append(DASH)
                    continue
                text = _stat_text(broker["metrics"].get(key), scenario, key)
                if first and broker["ok"] < broker["runs"]:
                    text += f" ({broker['runs'] - broker['ok']} of {broker['runs']} runs failed)"
                cells.append(text)
            cells.append(_ratio_text(data["ratios"].get(key, {}), labels))
            if target is None or target["metric"] != key:
                cells += ["", ""]
            else:
                verdict = {True: "**met**", False: "**missed**", None: "?"}[target["met"]]
                if target.get("note"):
                    verdict += f" ({_cell(target['note'])})"
                cells += [target["text"], verdict]
            rows.append(cells)
    return _table(header, rows)


def _scenario_lines(
    doc: dict[str, Any], scenario: Scenario, chart: str | None, sluice: str
) -> list[str]:
    data = doc["summary"][scenario.name]
    names = doc["settings"]["brokers"]
    labels = doc["labels"]
    quick = doc["settings"]["quick"]
    lines = [f"### {scenario.name}", "", f"{scenario.title}.", ""]
    for broker in make_brokers(names, Path(doc["repo"])):
        command = bench_command(Path(sluice), scenario, broker, quick=quick, port="PORT", pid="PID")
        lines.append(f"- {labels[broker.name]}: `{' '.join(command)} --json FILE`")
    lines.append("")
    header = ["broker", "runs ok", *[m.label for m in scenario.metrics]]
    rows = []
    for name in names:
        broker_data = data["brokers"].get(name)
        if broker_data is None:
            continue
        row = [labels[name], f"{broker_data['ok']}/{broker_data['runs']}"]
        row += [
            _stat_text(broker_data["metrics"].get(m.key), scenario, m.key) for m in scenario.metrics
        ]
        rows.append(row)
    ratio_row = ["Sluice / best peer", ""]
    ratio_row += [_ratio_text(data["ratios"].get(m.key, {}), labels) for m in scenario.metrics]
    rows.append(ratio_row)
    lines += _table(header, rows)
    target = data.get("target")
    if target is not None:
        verdict = {True: "met", False: "missed", None: "not judged"}[target["met"]]
        note = f" ({target['note']})" if target.get("note") else ""
        lines += ["", f"Target: {target['text']} — **{verdict}**{note}."]
    failures = [
        (labels[name], f)
        for name in names
        if name in data["brokers"]
        for f in data["brokers"][name]["failures"]
    ]
    if failures:
        lines += ["", "Failed runs:", ""]
        lines += [f"- {who}, run {f['run']}: {_cell(f['failure'])}" for who, f in failures]
    if chart:
        lines += ["", f"![{scenario.name}]({chart})"]
    return [*lines, ""]


def render_section(
    doc: dict[str, Any], scenarios: list[Scenario], charts: dict[str, str], chart_note: str | None
) -> str:
    """The Markdown between the markers (markers excluded)."""
    settings = doc["settings"]
    names = settings["brokers"]
    labels = doc["labels"]
    state = " (interrupted: partial results)" if doc.get("interrupted") else ""
    lines = [
        "## Sluice, ActiveMQ and RabbitMQ side by side",
        "",
        f"Generated by `benchmarks/compare.py` on {doc['finished']}{state}; everything between "
        "the `compare:begin` and `compare:end` markers is rewritten by the next run. Raw results: "
        "`docs/benchmarks-compare.json`.",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"{settings['runs']} run(s){' in quick mode (small counts)' if settings['quick'] else ''}"
        f", {', '.join(labels[n] for n in names)}, interleaved: for each run, for each scenario, "
        "each broker in turn (the order rotates from one scenario and run to the next), each "
        "started fresh on an empty data directory and stopped afterwards. Every number is the "
        "median over the runs, with the minimum and maximum in brackets. A run counts only if "
        "`sluice bench` verified that every message arrived exactly once (the `held` count of the "
        "connection scenarios counts failed runs too): after the last expected message each "
        "producer sends an end marker, the run waits until the markers arrived and goes on "
        "receiving for a grace period to count late duplicates, and on a queue it then drains "
        "whatever the broker still holds up to a marker of its own (a late duplicate, or a "
        "message never delivered). The ratio is Sluice's median over the median of the best peer "
        "for that metric.",
        "",
        "Brokers: Sluice on its journal store, which syncs every write batch to disk; ActiveMQ "
        "with KahaDB and journal disk syncs on, on its NIO STOMP transport (`stomp+nio`, a shared "
        "thread pool) with its default pooled task runners; RabbitMQ with the STOMP plugin "
        "(classic queues). Persistent scenarios send `persistent:true`. Memory per connection is "
        "the broker's resident memory (`sluice`, `java` or `beam.smp` process) once all "
        "connections were established, minus before the first, divided by the connections. "
        "CPU figures are user plus system time of that process (all its threads) from "
        "/proc/PID/stat over the measured window (the connection scenarios: the hold), in "
        "clock ticks of 10 ms: broker CPU µs/msg is that time per message received, broker CPU "
        "% its CPU seconds per wall second (100 % is one core of the machine's two), generator "
        "CPU % the same summed over every `sluice bench` process. "
        + (
            f"Each broker ran in a pids cgroup capped at {settings['max_broker_tasks']:,} tasks "
            "(processes and threads), so that a broker with a thread per connection cannot use "
            "up the shared machine's pid space."
            if settings.get("max_broker_tasks")
            else ""
        ),
        "",
        "### Summary",
        "",
        *_summary_lines(doc, scenarios),
        "",
    ]
    if "ratios" in charts:
        lines += [f"![Sluice / best peer]({charts['ratios']})", ""]
    if chart_note:
        lines += [f"({chart_note})", ""]
    lines += ["### Machine", "", *_machine_lines(doc), "", *_revision_lines(doc)]
    sluice = "sluice"
    for scenario in scenarios:
        if scenario.name in doc["summary"]:
            lines += _scenario_lines(doc, scenario, charts.get(scenario.name), sluice)
    return "\n".join(lines).rstrip() + "\n"


def relative_charts(paths: dict[str, Path], doc_path: Path) -> dict[str, str]:
    """Chart paths as links relative to the document."""
    base = doc_path.resolve().parent
    return {k: os.path.relpath(p.resolve(), base) for k, p in paths.items()}


def replace_section(doc_path: Path, section: str) -> None:
    """Put `section` between the markers of `doc_path`, creating the file or markers if needed."""
    if doc_path.exists():
        text = doc_path.read_text()
    else:
        text = f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
        begin, end = text.find(BEGIN), text.find(END)
    new = text[: begin + len(BEGIN)] + "\n" + section + text[end:]
    tmp = doc_path.with_name(doc_path.name + ".tmp")
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(new)
    tmp.replace(doc_path)
