"""Crash tests: a broker on the journal store, killed with SIGKILL under load and restarted (and,
in one variant, its index damaged before each restart: truncated, bytes flipped or overwritten).

Producers send persistent messages and wait for each RECEIPT; consumers use client-individual acks
and ask for a RECEIPT on every ACK. After all cycles a final consumer drains the queues. Then:
- every receipted message was delivered at some point (none lost);
- a message whose ACK was receipted is never delivered again;
- a message delivered more than once carries `redelivered:true` on every delivery after the first.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from rawstomp import RawStomp

QUEUES = ["/queue/crash-a", "/queue/crash-b"]
PRODUCERS = 3
CONSUMERS = 2


@dataclass
class Ledger:
    """What clients saw, shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    receipted: set[str] = field(default_factory=set)
    # body -> list of `redelivered` flags, in delivery order
    deliveries: dict[str, list[bool]] = field(default_factory=dict)
    ack_confirmed: set[str] = field(default_factory=set)
    # deliveries that happened after the message's ACK was confirmed
    after_ack: list[str] = field(default_factory=list)


def _producer(port: int, number: int, cycle: int, ledger: Ledger, stop: threading.Event) -> None:
    try:
        client = RawStomp(port, timeout=10)
        client.connect()
        n = 0
        while not stop.is_set():
            body = f"c{cycle}-p{number}-{n}"
            queue = QUEUES[n % len(QUEUES)]
            client.send(
                f"SEND\ndestination:{queue}\npersistent:true\nreceipt:{body}\n\n{body}\0".encode()
            )
            frame = client.frame()
            assert frame.command == "RECEIPT"
            assert frame.headers["receipt-id"] == body
            with ledger.lock:
                ledger.receipted.add(body)
            n += 1
    except (OSError, ConnectionError, TimeoutError):
        return  # the broker died


def _consume(client: RawStomp, ledger: Ledger, stop: threading.Event | None) -> None:
    """Receive and acknowledge until the connection ends (or, with no `stop`, until idle)."""
    pending_acks: dict[str, str] = {}
    while stop is None or not stop.is_set():
        try:
            frame = client.frame(timeout=None if stop is not None else 1.0)
        except TimeoutError:
            if stop is None:
                return
            continue
        if frame.command == "RECEIPT":
            body = pending_acks.pop(frame.headers["receipt-id"], None)
            if body is not None:
                with ledger.lock:
                    ledger.ack_confirmed.add(body)
            continue
        assert frame.command == "MESSAGE", frame
        body = frame.body.decode()
        with ledger.lock:
            if body in ledger.ack_confirmed:
                ledger.after_ack.append(body)
            ledger.deliveries.setdefault(body, []).append(
                frame.headers.get("redelivered") == "true"
            )
        receipt = "ack-" + body
        pending_acks[receipt] = body
        client.send(f"ACK\nid:{frame.headers['ack']}\nreceipt:{receipt}\n\n\0".encode())


def _consumer(port: int, ledger: Ledger, stop: threading.Event) -> None:
    try:
        client = RawStomp(port, timeout=10)
        client.connect()
        for i, queue in enumerate(QUEUES):
            client.send(
                f"SUBSCRIBE\nid:{i}\ndestination:{queue}\nack:client-individual\n"
                f"activemq.prefetchSize:10\n\n\0".encode()
            )
        _consume(client, ledger, stop)
    except (OSError, ConnectionError, TimeoutError):
        return


def _config(data: Path) -> str:
    return f'[store]\nkind = "journal"\ndata_dir = "{data}"\njournal_file_bytes = 1048576\n'


def _damage_index(data: Path, rng: random.Random) -> None:
    """What a crash, a bad disk or a careless copy can do to data.mdb."""
    path = data / "index" / "data.mdb"
    if not path.exists():
        return
    raw = bytearray(path.read_bytes())
    how = rng.choice(["truncate", "flips", "chunk"])
    if how == "truncate":
        del raw[rng.randrange(len(raw)) :]
    elif how == "flips":
        for _ in range(rng.randint(1, 16)):
            raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
    else:
        at = rng.randrange(len(raw))
        raw[at : at + 4096] = rng.randbytes(len(raw[at : at + 4096]))
    path.write_bytes(bytes(raw))


def _run_cycles(
    tmp_path: Path, cycles: int, seed: int, *, damage_index: bool = False
) -> tuple[Ledger, str]:
    rng = random.Random(seed)
    ledger = Ledger()
    data = tmp_path / "data"
    logs = []
    for cycle in range(cycles):
        if damage_index:
            _damage_index(data, rng)
        broker = BrokerProcess(_config(data), tmp_path).start()
        stop = threading.Event()
        threads = [
            threading.Thread(target=_producer, args=(broker.port, p, cycle, ledger, stop))
            for p in range(PRODUCERS)
        ] + [
            threading.Thread(target=_consumer, args=(broker.port, ledger, stop))
            for _ in range(CONSUMERS)
        ]
        for t in threads:
            t.start()
        # Kill at a random moment of the load. The clients find out from their sockets.
        stop.wait(rng.uniform(0.2, 1.2))
        broker.kill()
        stop.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
        logs.append(broker.log_text)
    # Drain what is left.
    if damage_index:
        _damage_index(data, rng)
    broker = BrokerProcess(_config(data), tmp_path).start()
    try:
        drain = RawStomp(broker.port)
        drain.connect()
        for i, queue in enumerate(QUEUES):
            drain.send(
                f"SUBSCRIBE\nid:{i}\ndestination:{queue}\nack:client-individual\n\n\0".encode()
            )
        _consume(drain, ledger, None)
        drain.close()
    finally:
        assert broker.stop() == 0
        report = broker.log_text
    logs.append(report)
    everything = "".join(logs)
    assert "Traceback" not in everything, everything
    return ledger, everything


def _check(ledger: Ledger) -> None:
    lost = ledger.receipted - ledger.deliveries.keys()
    assert not lost, f"{len(lost)} receipted messages never delivered, e.g. {sorted(lost)[:5]}"
    assert not ledger.after_ack, f"delivered after a confirmed ACK: {ledger.after_ack[:5]}"
    unmarked = [
        body for body, flags in ledger.deliveries.items() if len(flags) > 1 and not all(flags[1:])
    ]
    assert not unmarked, f"delivered twice without redelivered:true: {unmarked[:5]}"
    assert len(ledger.receipted) > 0


@pytest.mark.crash
def test_sigkill_under_load_loses_nothing_receipted(tmp_path: Path) -> None:
    ledger, _ = _run_cycles(tmp_path, cycles=20, seed=20261122)
    _check(ledger)
    print(
        f"receipted {len(ledger.receipted)}, delivered {len(ledger.deliveries)}, "
        f"redelivered {sum(len(f) - 1 for f in ledger.deliveries.values())}"
    )


@pytest.mark.crash
def test_sigkill_and_a_damaged_index_lose_nothing_receipted(tmp_path: Path) -> None:
    # Every start finds the index damaged: it must start all the same (no SIGBUS), say so, and
    # rebuild from the journal without losing a receipted message.
    ledger, logs = _run_cycles(tmp_path, cycles=6, seed=99, damage_index=True)
    _check(ledger)
    assert "index rebuilt" in logs


@pytest.mark.crash
@pytest.mark.slow
def test_sigkill_200_cycles(tmp_path: Path) -> None:
    ledger, _ = _run_cycles(tmp_path, cycles=200, seed=7)
    _check(ledger)
    print(
        f"receipted {len(ledger.receipted)}, delivered {len(ledger.deliveries)}, "
        f"redelivered {sum(len(f) - 1 for f in ledger.deliveries.values())}"
    )
