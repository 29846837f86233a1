"""A broker on a damaged journal: a start stops on damage (naming file and offset) unless asked
to repair; a record found damaged while the broker runs costs that message, never the queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from rawstomp import RawStomp
from sluice.store.journal import format as fmt
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.scan import FileScan, ScannedRecord

QUEUE = "/queue/damage"
COUNT = 2000


def _config(data: Path) -> str:
    return f'[store]\nkind = "journal"\ndata_dir = "{data}"\njournal_file_bytes = 1048576\n'


def _body(i: int) -> str:
    return f"message-{i:05d}-" + "x" * 200


def _fill(port: int) -> None:
    client = RawStomp(port)
    client.connect()
    for i in range(COUNT):
        receipt = f"receipt:r{i}\n" if i == COUNT - 1 else ""
        client.send(f"SEND\ndestination:{QUEUE}\npersistent:true\n{receipt}\n{_body(i)}\0".encode())
    frame = client.frame(timeout=60)
    assert frame.command == "RECEIPT"
    client.close()


def _drain(port: int) -> list[str]:
    client = RawStomp(port)
    client.connect()
    client.send(f"SUBSCRIBE\nid:0\ndestination:{QUEUE}\nack:auto\n\n\0".encode())
    bodies = []
    while True:
        try:
            frame = client.frame(timeout=3)
        except TimeoutError:
            break
        assert frame.command == "MESSAGE", frame
        bodies.append(frame.body.decode())
    client.close()
    return bodies


def _record_of(data: Path, i: int) -> tuple[Path, int, int]:
    """(file, record offset, an offset in its body) of message i's ADD record."""
    journal = data / "journal"
    for file_no in list_files(journal):
        path = file_path(journal, file_no)
        for item in FileScan(path):
            if isinstance(item, ScannedRecord) and item.rtype == fmt.RecordType.ADD:
                message, _ = fmt.decode_add(item.payload)
                if message.body == _body(i).encode():
                    return path, item.offset, item.offset + item.length - 10
    raise AssertionError(f"message {i} not found")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x20]))


def test_damage_found_at_start_stops_it_and_repair_names_the_loss(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(_config(data), tmp_path).start()
    _fill(broker.port)
    assert broker.stop() == 0
    path, offset, inside = _record_of(data, 700)
    _flip(path, inside)

    refused = BrokerProcess(_config(data), tmp_path)
    with pytest.raises(RuntimeError) as info:
        refused.start()
    assert f"damaged journal record: checksum mismatch ({path} at offset {offset})" in str(
        info.value
    )

    repaired = BrokerProcess(_config(data), tmp_path, "--repair").start()
    try:
        bodies = _drain(repaired.port)
    finally:
        assert repaired.stop() == 0
    log = repaired.log_text
    assert f"lost message: destination '{QUEUE}' seq 701" in log
    assert bodies == [_body(i) for i in range(COUNT) if i != 700]
    assert "Traceback" not in log


def test_damage_found_while_running_costs_one_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(_config(data), tmp_path).start()
    _fill(broker.port)
    assert broker.stop() == 0
    # Restarted, the queue holds its backlog in the store and pages it in as it is consumed.
    broker = BrokerProcess(_config(data), tmp_path).start()
    try:
        path, offset, inside = _record_of(data, 1500)
        _flip(path, inside)
        bodies = _drain(broker.port)
    finally:
        assert broker.stop() == 0
    log = broker.log_text
    assert bodies == [_body(i) for i in range(COUNT) if i != 1500]
    assert f"dropped, its record is damaged: message record is damaged ({path} at offset" in log
    assert f"at offset {offset})" in log
    assert "Traceback" not in log
