"""`/metrics` beyond the counts of traffic: messages that expired (on a queue and on a topic,
counted against what the test sent), the journal's sync durations as a Prometheus histogram
(its count the store's syncs), and the Grafana dashboard in docs/, whose every query names
metrics the broker exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

from prometheus_client.parser import text_string_to_metric_families

from server.test_interop_stomppy import _connect, _subscribe

from .conftest import Managed, start_managed
from .test_metrics import _q, _scrape

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"


def test_expired_messages_are_counted(managed: Managed) -> None:
    conn, col = _connect(managed.broker.port)
    _subscribe(conn, col, "/queue/e", "q", "auto")
    _subscribe(conn, col, "/topic/e", "t", "auto")
    for i in range(3):
        conn.send("/queue/e", f"old {i}", headers={"persistent": "true", "expires": "1"})
    conn.send("/queue/e", "fresh", headers={"persistent": "true"})
    conn.send("/topic/e", "old", headers={"expires": "1"})
    conn.send("/topic/e", "fresh", receipt="sent")
    col.receipt("sent")
    assert sorted(col.message().body for _ in range(2)) == ["fresh", "fresh"]
    assert col.no_message()
    m = _scrape(managed)
    assert m[("sluice_messages_expired_total", ())] == 4
    assert m[("sluice_destination_messages_expired_total", _q("/queue/e"))] == 3
    topic = (("destination", "/topic/e"), ("kind", "topic"))
    assert m[("sluice_destination_messages_expired_total", topic)] == 1
    # The persistent ones went to the DLQ; the topic's, not persistent, were dropped.
    assert m[("sluice_destination_messages_dead_lettered_total", _q("/queue/e"))] == 3
    overview = managed.http.get("/api/overview").json
    assert overview["totals"]["expired"] == 4
    assert managed.http.get("/api/destinations/queue/e").json["expired"] == 3
    conn.disconnect()


def test_sync_durations_are_a_histogram(tmp_path: Path) -> None:
    managed = start_managed(store={"kind": "journal", "data_dir": str(tmp_path / "data")})
    try:
        conn, col = _connect(managed.broker.port)
        for i in range(20):
            conn.send("/queue/s", str(i), receipt=f"r{i}", headers={"persistent": "true"})
            col.receipt(f"r{i}")
        text = managed.http.get("/metrics").text
        (family,) = [
            f for f in text_string_to_metric_families(text) if f.name == "sluice_store_sync_seconds"
        ]
        assert family.type == "histogram"
        buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")]
        values = [value for _, value in buckets]
        assert values == sorted(values)
        assert buckets[-1][0] == "+Inf"
        count = next(s.value for s in family.samples if s.name.endswith("_count"))
        total = next(s.value for s in family.samples if s.name.endswith("_sum"))
        assert count == buckets[-1][1]
        # Every receipted persistent SEND waited for a sync of its own here.
        assert count >= 20
        assert count == _scrape(managed)[("sluice_store_syncs_total", ())]
        assert 0 < total < count * 2.5
        conn.disconnect()
    finally:
        managed.stop()


def _dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]
    exprs += [var["query"]["query"] for var in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in re.findall(r"\bsluice_[a-z_]+", expr)}


def test_the_dashboard_queries_metrics_the_broker_exports(tmp_path: Path) -> None:
    managed = start_managed(store={"kind": "journal", "data_dir": str(tmp_path / "data")})
    try:
        conn, col = _connect(managed.broker.port)
        conn.send("/queue/d", "x", receipt="sent", headers={"persistent": "true"})
        col.receipt("sent")
        exported = set()
        for family in text_string_to_metric_families(managed.http.get("/metrics").text):
            # A labelled family without samples yet (no limit hit so far) is exported too.
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            exported.update(family.name + s for s in suffixes.get(family.type, [""]))
            exported.update(sample.name for sample in family.samples)
        used = _dashboard_metrics()
        assert len(used) > 25
        assert used <= exported, sorted(used - exported)
        conn.disconnect()
    finally:
        managed.stop()


def test_destination_names_are_escaped_in_labels(managed: Managed) -> None:
    odd = '/queue/a"b\\c\nd'
    assert managed.http.put("/api/destinations/queue/" + quote(odd[7:], safe="")).status == 201
    m = _scrape(managed)
    assert m[("sluice_destination_messages_ready", _q(odd))] == 0
    assert m[("sluice_destination_messages_in_total", _q(odd))] == 0
