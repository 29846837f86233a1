"""`/metrics` parses with Prometheus' own text parser, its values match the STOMP traffic the
test sent, its counters never go back when a destination or a connection goes, and the
per-destination series stop at `http.metrics_max_destinations`, saying how many were left out."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rawstomp import RawStomp
from server.test_interop_stomppy import Collector, _connect, _subscribe
from waiting import wait_until

from .conftest import Managed, start_managed


def _scrape(managed: Managed) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = managed.http.get("/metrics")
    assert reply.status == 200, reply.text
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        assert family.name.startswith("sluice_"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _send(conn: Any, col: Collector, dest: str, count: int) -> None:
    for i in range(count - 1):
        conn.send(dest, f"m{i}", headers={"persistent": "true"})
    conn.send(dest, "last", receipt=f"r-{dest}", headers={"persistent": "true"})
    col.receipt(f"r-{dest}")


def _q(name: str) -> tuple[tuple[str, str], ...]:
    return (("destination", name), ("kind", "queue"))


def test_metrics_match_the_traffic(managed: Managed) -> None:
    producer, pcol = _connect(managed.broker.port)
    _send(producer, pcol, "/queue/m1", 12)
    _send(producer, pcol, "/queue/m2", 3)
    consumer, ccol = _connect(managed.broker.port)
    _subscribe(
        consumer, ccol, "/queue/m1", "s1", "client-individual", **{"activemq.prefetchSize": "5"}
    )
    frames = [ccol.message() for _ in range(5)]
    consumer.ack(frames[0].headers["ack"])
    consumer.ack(frames[1].headers["ack"])
    wait_until(lambda: _scrape(managed)[("sluice_messages_acked_total", ())] == 2, what="2 acked")
    wait_until(
        lambda: _scrape(managed)[("sluice_destination_messages_unacked", _q("/queue/m1"))] == 5,
        what="credit refilled",
    )
    m = _scrape(managed)
    assert m[("sluice_messages_in_total", ())] == 15
    assert m[("sluice_messages_delivered_total", ())] == 7
    assert m[("sluice_destination_messages_ready", _q("/queue/m1"))] == 5
    assert m[("sluice_destination_messages_ready", _q("/queue/m2"))] == 3
    assert m[("sluice_destination_messages_in_total", _q("/queue/m1"))] == 12
    assert m[("sluice_destination_consumers", _q("/queue/m1"))] == 1
    assert m[("sluice_destination_producers", _q("/queue/m1"))] == 1
    assert m[("sluice_destination_producers", _q("/queue/m2"))] == 1
    assert m[("sluice_messages_ready", ())] == 8
    assert m[("sluice_messages_unacked", ())] == 5
    assert m[("sluice_destinations", (("kind", "queue"),))] == 2
    assert m[("sluice_connections", ())] == 2
    assert m[("sluice_alarm", (("alarm", "memory"),))] == 0
    assert m[("sluice_alarm", (("alarm", "store_failed"),))] == 0
    assert m[("sluice_alarm", (("alarm", "store_unavailable"),))] == 0
    assert m[("sluice_store_reconnects_total", ())] == 0
    assert any(name == "sluice_build_info" for name, _labels in m)
    assert m[("sluice_memory_limit_bytes", ())] > 0
    assert m[("sluice_metrics_destinations_omitted", ())] == 0
    assert ("sluice_process_resident_memory_bytes", ()) in m

    # A connection and a destination go: the broker's counters stay where they were.
    consumer.disconnect()
    wait_until(lambda: _scrape(managed)[("sluice_connections", ())] == 1, what="a consumer gone")
    managed.http.delete("/api/destinations/queue/m1/messages")
    assert managed.http.delete("/api/destinations/queue/m1").status == 200
    after = _scrape(managed)
    for name in (
        "sluice_messages_in_total",
        "sluice_messages_delivered_total",
        "sluice_messages_acked_total",
    ):
        assert after[(name, ())] == m[(name, ())], name
    # The 5 the consumer held unacknowledged went back when it left.
    assert after[("sluice_messages_redelivered_total", ())] == 5
    assert after[("sluice_connections_opened_total", ())] == 2
    assert after[("sluice_connections_closed_total", (("reason", "client_disconnect"),))] == 1
    assert ("sluice_destination_messages_ready", _q("/queue/m1")) not in after
    producer.disconnect()


def test_the_destination_cap_is_named_and_counted() -> None:
    managed = start_managed(http={"metrics_max_destinations": 2})
    try:
        conn, col = _connect(managed.broker.port)
        _send(conn, col, "/queue/big", 3)
        _send(conn, col, "/queue/mid", 2)
        _send(conn, col, "/queue/small", 1)
        m = _scrape(managed)
        shown = {
            dict(labels)["destination"]
            for (name, labels) in m
            if name == "sluice_destination_messages_ready"
        }
        assert shown == {"/queue/big", "/queue/mid"}
        assert m[("sluice_metrics_destinations_omitted", ())] == 1
        assert m[("sluice_metrics_destination_cap_hits_total", ())] == 1
        # The aggregates still count every destination.
        assert m[("sluice_messages_ready", ())] == 6
        assert _scrape(managed)[("sluice_metrics_destination_cap_hits_total", ())] == 2
        conn.disconnect()
    finally:
        managed.stop()


def test_limits_hit_are_counted(managed: Managed) -> None:
    raw = RawStomp(managed.broker.port)
    raw.send(b"CONNECT\nx:" + b"a" * 70_000)  # a header block too large
    assert raw.closed(10)
    m = _scrape(managed)
    limit = (("limit", "max_header_bytes"),)
    assert m[("sluice_limit_hits_total", limit)] == 1
    assert m[("sluice_connections_closed_total", (("reason", "protocol_error"),))] == 1
    assert m[("sluice_login_refusals_total", (("reason", "bad_credentials"),))] == 0
    raw.close()
