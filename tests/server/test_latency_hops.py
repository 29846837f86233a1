"""Per-hop latency of persistent sends (`[latency] hops`) against a real broker on the journal
store: which SENDs are timed, that every hop of each is, that the stamps of each send are in
order and its hops add up to its total, and the report written at stop."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from conftest import RunningBroker, start_broker
from rawstomp import RawStomp
from sluice.client import BlockingClient
from sluice.errors import ConfigError
from sluice.server.hops import Hop, HopRecorder
from sluice.server.session import StompSession
from sluice.server.traced import TracedStompSession
from waiting import wait_until

SENDS = 40


def _traced_broker(tmp_path: Path, **sections: dict[str, object]) -> RunningBroker:
    return start_broker(
        store={"kind": "journal", "data_dir": str(tmp_path / "data")},
        latency={"hops": True, "hops_file": str(tmp_path / "hops.json")},
        **sections,
    )


def _recorder(broker: RunningBroker) -> HopRecorder:
    recorder = broker.server.latency
    assert recorder is not None
    return recorder


def _sends(broker: RunningBroker) -> int:
    return broker.stats()["latency_sends"]


def test_every_hop_of_every_synchronous_persistent_send_is_timed(tmp_path: Path) -> None:
    broker = _traced_broker(tmp_path)
    try:
        with BlockingClient(broker.address) as client:
            for i in range(SENDS):
                # Waits for the RECEIPT: one send at a time, as `sluice bench sync` sends.
                client.send("/queue/hops", b"m%d" % i, persistent=True)
        # Recorded right after the RECEIPT went to the socket, on the broker's thread.
        wait_until(lambda: _sends(broker) == SENDS, what="every send recorded")
        stats = broker.stats()
        for hop in Hop:
            assert stats[f"latency_{hop.value}_count"] == SENDS, hop
        assert stats["latency_total_count"] == SENDS
        assert stats["latency_untimed"] == 0
        assert stats["latency_out_of_order"] == 0

        rows = broker.call(lambda: list(_recorder(broker).recent))
        assert len(rows) == SENDS
        fsync = list(Hop).index(Hop.FSYNC)
        for stamps in rows:
            hops = [end - start for start, end in pairwise(stamps)]
            assert len(hops) == len(Hop)
            assert all(hop >= 0 for hop in hops), hops
            # Each send's hops add up to its total, first byte read to RECEIPT written.
            assert sum(hops) == stamps[-1] - stamps[0] > 0
            # The sync policy is `always`: every batch was synced, which takes time.
            assert hops[fsync] > 0

        recorder = _recorder(broker)
        total = broker.call(lambda: (recorder.total.min_value, recorder.total.max_value))
        medians = broker.call(lambda: sum(h.percentile(50) for h in recorder.hops.values()))
        # The median send is no faster than the fastest and no slower than the slowest; the sum
        # of the hops' medians is not a send, but it lies within what sends took too.
        assert total[0] * 0.9 <= medians <= total[1] * 1.1
        # The means add up exactly (hop by hop, every send adds up to its total).
        means = broker.call(lambda: sum(h.sum_values for h in recorder.hops.values()))
        assert means == broker.call(lambda: recorder.total.sum_values)
    finally:
        broker.stop()

    report = json.loads((tmp_path / "hops.json").read_text())
    assert report["sends"] == SENDS
    assert report["unit"] == "ns"
    assert [hop["hop"] for hop in report["hops"]] == [hop.value for hop in Hop]
    for hop in report["hops"]:
        assert hop["count"] == SENDS
        assert 0 <= hop["p50"] <= hop["p99"] <= hop["max"]
    assert report["total"]["count"] == SENDS
    assert report["total"]["p50"] >= max(hop["p50"] for hop in report["hops"])


def test_only_receipted_persistent_sends_outside_transactions_are_timed(tmp_path: Path) -> None:
    broker = _traced_broker(tmp_path)
    try:
        peer = RawStomp(broker.port)
        peer.connect()
        timed = b"SEND\ndestination:/queue/hops\npersistent:true\nreceipt:%d\n\nbody\0"
        frames = [timed % i for i in range(10)]
        frames += [
            # Not persistent; not receipted; in a transaction; a duplicate (not written again).
            b"SEND\ndestination:/queue/hops\nreceipt:r1\n\nx\0",
            b"SEND\ndestination:/queue/hops\npersistent:true\n\nx\0",
            b"BEGIN\ntransaction:t\n\n\0",
            b"SEND\ndestination:/queue/hops\npersistent:true\ntransaction:t\nreceipt:r2\n\nx\0",
            b"COMMIT\ntransaction:t\nreceipt:r3\n\n\0",
            b"SEND\ndestination:/queue/hops\npersistent:true\nx-dedup-id:d\nreceipt:r4\n\nx\0",
            b"SEND\ndestination:/queue/hops\npersistent:true\nx-dedup-id:d\nreceipt:r5\n\nx\0",
        ]
        # Pipelined in one write: most frames arrive in one chunk and wait for the ones before.
        peer.send(b"".join(frames))
        ids = {peer.frame().headers["receipt-id"] for _ in range(15)}
        assert ids == {str(i) for i in range(10)} | {f"r{n}" for n in range(1, 6)}
        wait_until(lambda: _sends(broker) == 11, what="the timed sends recorded")
        stats = broker.stats()
        # Ten, and the first with the dedup id; its duplicate was answered without a write.
        assert stats["latency_sends"] == 11
        assert stats["latency_untimed"] == 1
        assert stats["latency_out_of_order"] == 0
        peer.sock.close()
    finally:
        broker.stop()


def test_sessions_are_traced_only_with_the_setting(tmp_path: Path) -> None:
    traced = _traced_broker(tmp_path / "on")
    plain = start_broker(store={"kind": "journal", "data_dir": str(tmp_path / "off")})
    try:
        for broker, kind in ((traced, TracedStompSession), (plain, StompSession)):
            with BlockingClient(broker.address) as client:
                client.send("/queue/plain", b"x", persistent=True)
                assert broker.call(lambda b=broker: [type(s) for s in b.server.sessions]) == [kind]
        assert plain.server.latency is None
        assert not any(name.startswith("latency_") for name in plain.stats())
    finally:
        traced.stop()
        plain.stop()


def test_the_memory_store_cannot_time_hops() -> None:
    with pytest.raises(ConfigError, match="journal"):
        start_broker(latency={"hops": True})
