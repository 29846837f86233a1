"""PNG charts of a comparison: one per scenario, and one of Sluice's ratios against the targets.

Each scenario chart has a panel per charted metric: a bar per broker at its median, a line from
its minimum to its maximum, and a dot per run. Needs matplotlib (the project's `bench` extra);
without it no chart is drawn and the caller is told why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compare.scenarios import Scenario
from compare.summary import TIMES

__all__ = ["draw_charts"]

_COLORS = {"sluice": "#2a7ab0", "activemq": "#c0504d", "rabbitmq": "#f39c12"}
_DPI = 100


def _panel(
    ax: Any, scenario: Scenario, key: str, data: dict[str, Any], labels: dict[str, str]
) -> None:
    metric = scenario.metric(key)
    names = [n for n, b in data["brokers"].items() if b["metrics"].get(key)]
    for x, name in enumerate(names):
        stats = data["brokers"][name]["metrics"][key]
        color = _COLORS.get(name, "#777777")
        ax.bar(x, stats["median"], color=color, alpha=0.85, width=0.6)
        ax.vlines(x, stats["min"], stats["max"], color="black", linewidth=1.2)
        ax.scatter([x] * len(stats["values"]), stats["values"], color="black", s=10, zorder=3)
        ax.annotate(
            f"{stats['median']:{metric.fmt}}",
            (x, stats["max"]),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(range(len(names)), [labels.get(n, n) for n in names])
    ax.set_title(
        metric.label + (" (higher is better)" if metric.higher_is_better else ""), fontsize=9
    )
    ax.margins(y=0.15)
    missing = [labels.get(n, n) for n in data["brokers"] if n not in names]
    if missing:
        ax.set_xlabel("no completed run: " + ", ".join(missing), fontsize=8)
    if not names:
        ax.text(0.5, 0.5, "no completed run", ha="center", va="center", transform=ax.transAxes)


def _ratios_chart(plt: Any, summary: dict[str, Any], labels: dict[str, str], path: Path) -> bool:
    rows = [
        (name, data["target"])
        for name, data in summary.items()
        if data.get("target") and data["target"].get("ratio") is not None
    ]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.2))
    for y, (_name, target) in enumerate(rows):
        color = "#3c9a3c" if target["met"] else "#c0392b"
        ax.barh(y, target["ratio"], color=color, alpha=0.8, height=0.6)
        bound = target.get("min_ratio") or target.get("max_ratio")
        ax.annotate(
            f"{target['ratio']:.2f}{TIMES} {labels.get(target.get('best_peer') or '', '')}",
            (target["ratio"], y),
            textcoords="offset points",
            xytext=(4, -3),
            fontsize=8,
        )
        if bound:
            ax.vlines(bound, y - 0.4, y + 0.4, color="black", linewidth=2)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)), [f"{n}\n{t['text']}" for n, t in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Sluice median / best peer median (black mark: target; latency: lower is better)")
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return True


def draw_charts(
    summary: dict[str, Any],
    scenarios: list[Scenario],
    labels: dict[str, str],
    img_dir: Path,
    prefix: str = "compare-",
) -> tuple[dict[str, Path], str | None]:
    """Draw every chart; return {scenario or 'ratios': png path} and why charts are missing."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        return {}, f"no charts: matplotlib is not installed ({exc}); install the `bench` extra"
    img_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for scenario in scenarios:
        data = summary.get(scenario.name)
        if data is None:
            continue
        fig, axes = plt.subplots(1, len(scenario.chart), figsize=(3.4 * len(scenario.chart), 3.1))
        axes = axes if len(scenario.chart) > 1 else [axes]
        for ax, key in zip(axes, scenario.chart, strict=True):
            _panel(ax, scenario, key, data, labels)
        fig.suptitle(scenario.name, fontsize=10)
        fig.tight_layout()
        path = img_dir / f"{prefix}{scenario.name}.png"
        fig.savefig(path, dpi=_DPI)
        plt.close(fig)
        paths[scenario.name] = path
    ratios = img_dir / f"{prefix}ratios.png"
    if _ratios_chart(plt, summary, labels, ratios):
        paths["ratios"] = ratios
    return paths, None
