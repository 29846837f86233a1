"""From attempt records to medians with min-max per broker, ratios to the best peer, targets.

A run counts for a metric only if it completed and verified every message arrived exactly once,
except for metrics marked `from_failed_runs` (how many connections were held). The best peer is
the peer with the best median (highest, or lowest for a lower-is-better metric); the ratio is
Sluice's median over that median.
"""

from __future__ import annotations

import statistics
from typing import Any

from compare.scenarios import Metric, Scenario

__all__ = ["DASH", "TIMES", "fmt_value", "summarize"]

SLUICE = "sluice"
DASH = "\u2013"  # en dash: ranges, and no value
TIMES = "\u00d7"  # multiplication sign: ratios


def fmt_value(value: float | None, metric: Metric) -> str:
    """The value in the metric's format, a dash for None."""
    return DASH if value is None else f"{value:{metric.fmt}}"


def _stats(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def _broker_summary(scenario: Scenario, records: list[dict[str, Any]]) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for metric in scenario.metrics:
        values = [
            float(r["metrics"][metric.key])
            for r in records
            if r.get("metrics", {}).get(metric.key) is not None
            and (r["ok"] or metric.from_failed_runs)
        ]
        metrics[metric.key] = _stats(values)
    return {
        "runs": len(records),
        "ok": sum(1 for r in records if r["ok"]),
        "failures": [{"run": r["run"], "failure": r["failure"]} for r in records if not r["ok"]],
        "metrics": metrics,
    }


def _median(summary: dict[str, Any] | None, key: str) -> float | None:
    if summary is None:
        return None
    stats = summary["metrics"].get(key)
    return None if stats is None else float(stats["median"])


def _ratio(
    metric: Metric, brokers: dict[str, dict[str, Any]]
) -> tuple[str | None, float | None, float | None]:
    """(best peer, its median, Sluice / best peer) for one metric."""
    if not metric.compared:
        return None, None, None
    peers = [
        (name, value)
        for name, summary in brokers.items()
        if name != SLUICE and (value := _median(summary, metric.key)) is not None
    ]
    if not peers:
        return None, None, None
    pick = max if metric.higher_is_better else min
    best, best_value = pick(peers, key=lambda item: item[1])
    mine = _median(brokers.get(SLUICE), metric.key)
    if mine is None or best_value == 0:
        return best, best_value, None
    return best, best_value, mine / best_value


def _target(scenario: Scenario, brokers: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    target = scenario.target
    if target is None:
        return None
    mine = brokers.get(SLUICE)
    result: dict[str, Any] = {
        "text": target.text,
        "metric": target.metric,
        "min_ratio": target.min_ratio,
        "max_ratio": target.max_ratio,
        "met": None,
    }
    if mine is None:
        result["note"] = "Sluice was not run"
        return result
    if target.every_run_ok:
        result["met"] = mine["runs"] > 0 and mine["ok"] == mine["runs"]
        result["note"] = f"{mine['ok']} of {mine['runs']} Sluice runs completed"
        return result
    metric = scenario.metric(target.metric)
    best, best_value, ratio = _ratio(metric, brokers)
    result.update(best_peer=best, best_peer_value=best_value, ratio=ratio)
    result["sluice"] = _median(mine, metric.key)
    if result["sluice"] is None:
        result["met"] = False
        result["note"] = "no Sluice run completed"
    elif best is None:
        result["met"] = True
        result["note"] = "no peer run completed"
    elif ratio is not None:
        if target.min_ratio is not None:
            result["met"] = ratio >= target.min_ratio
        else:
            assert target.max_ratio is not None
            result["met"] = ratio <= target.max_ratio
    if mine["ok"] < mine["runs"]:
        result["note"] = f"only {mine['ok']} of {mine['runs']} Sluice runs completed"
    return result


def summarize(
    records: list[dict[str, Any]], scenarios: list[Scenario], broker_names: list[str]
) -> dict[str, Any]:
    """Per scenario: per-broker statistics, ratios of every metric, and the target."""
    summary: dict[str, Any] = {}
    for scenario in scenarios:
        brokers: dict[str, dict[str, Any]] = {}
        for name in broker_names:
            mine = [r for r in records if r["scenario"] == scenario.name and r["broker"] == name]
            if mine:
                brokers[name] = _broker_summary(scenario, mine)
        if not brokers:
            continue
        ratios = {}
        for metric in scenario.metrics:
            best, best_value, ratio = _ratio(metric, brokers)
            ratios[metric.key] = {"best_peer": best, "best_peer_value": best_value, "ratio": ratio}
        summary[scenario.name] = {
            "title": scenario.title,
            "brokers": brokers,
            "ratios": ratios,
            "target": _target(scenario, brokers),
        }
    return summary
