"""Mutated frames over real sockets against a broker subprocess: every connection ends in an
ERROR or a clean close, the broker keeps serving, and its log holds no traceback."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from brokerproc import BrokerProcess
from rawstomp import RawStomp
from stomp_codec.test_fuzz import CONNECT, _case, _mutate

CONNECTIONS = 300


def _attack(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass


def test_mutated_frames_over_sockets_leave_no_traceback(tmp_path: Path) -> None:
    broker = BrokerProcess(
        '[store]\nkind = "memory"\n[limits]\nmax_frame_bytes = 65536\n', tmp_path
    ).start()
    rng = random.Random(14)
    try:
        for n in range(CONNECTIONS):
            connect = _mutate(rng, CONNECT) if n % 4 == 0 else CONNECT
            _attack(broker.port, connect + _case(rng))
        peer = RawStomp(broker.port)
        peer.connect()
        peer.send(b"SEND\ndestination:/queue/after\nreceipt:r\n\nstill here\0")
        assert peer.frame().command == "RECEIPT"
    finally:
        assert broker.stop() == 0
    log = broker.log_text
    assert "Traceback" not in log
    assert "internal error" not in log
    assert "closing after error" in log  # the attack reached the parser
