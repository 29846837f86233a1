"""A producer as fast as it can go against a consumer that reads slowly: the broker's memory
stays bounded by its configured limit, and every message arrives once, in order."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from brokerproc import BrokerProcess
from rawstomp import RawStomp

MiB = 1024 * 1024
DESTINATION_LIMIT = 8 * MiB
BROKER_LIMIT = 16 * MiB
MESSAGE_BYTES = 4096
MESSAGES = 16_384  # 64 MiB in all: eight times the destination's limit
# With one destination its limit binds first: the broker queues up to 8 MiB of bodies. Beyond
# them it holds Python objects per queued message (~1 KiB for the message, its header dict and the
# sorted-map slot: ~2 MiB for the 2,048 messages that fit), a write buffer of at most its 1 MiB
# high-water mark (plus one frame) per connection, and the parser's read buffers. Peak RSS growth
# over the baseline measures 10.6 MiB here; the test allows the limit plus 8 MiB, 16 MiB in all.
ALLOWANCE = 8 * MiB


def test_fast_producer_slow_consumer_memory_stays_bounded(tmp_path: Path) -> None:
    broker = BrokerProcess(
        f"""
[store]
kind = "memory"
[limits]
destination_memory_limit_bytes = {DESTINATION_LIMIT}
memory_limit_bytes = {BROKER_LIMIT}
""",
        tmp_path,
    ).start()
    try:
        consumer = RawStomp(broker.port)
        consumer.connect()
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        consumer.send(b"SUBSCRIBE\nid:1\ndestination:/queue/flood\nack:auto\nreceipt:r\n\n\0")
        assert consumer.frame().command == "RECEIPT"
        producer = RawStomp(broker.port)
        producer.connect()
        baseline = broker.rss_bytes()

        body = b"x" * (MESSAGE_BYTES - 8)

        def produce() -> None:
            frames = [
                b"SEND\ndestination:/queue/flood\ncontent-length:%d\n\n%08d%b\0"
                % (MESSAGE_BYTES, i, body)
                for i in range(MESSAGES)
            ]
            for start in range(0, MESSAGES, 64):
                producer.send(b"".join(frames[start : start + 64]))
            producer.send(b"DISCONNECT\nreceipt:done\n\n\0")

        sender = threading.Thread(target=produce)
        sender.start()
        peak = baseline
        for expected in range(MESSAGES):
            frame = consumer.frame(timeout=60)
            assert int(frame.body[:8]) == expected
            if expected % 64 == 0:
                # Read slowly: the broker must queue, then stop reading the producer.
                time.sleep(0.005)
                peak = max(peak, broker.rss_bytes())
        sender.join(60)
        assert producer.frame().headers["receipt-id"] == "done"
        growth = peak - baseline
        print(
            f"baseline {baseline / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB, "
            f"growth {growth / MiB:.1f} MiB"
        )
        assert growth < DESTINATION_LIMIT + ALLOWANCE, growth
    finally:
        assert broker.stop() == 0
    # The bound held because the producer was paused, not because the consumer kept up.
    assert "/queue/flood is over its memory limit" in broker.log_text
