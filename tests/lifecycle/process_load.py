"""Load while the broker dies: a producer (and maybe a consumer) on their own threads, the main
thread waiting for the k-th receipt to SIGKILL the broker. Every message is in the model before
it is on the wire; what was receipted is required, what was not may exist; an ACK whose receipt
the kill swallowed leaves its message maybe there."""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable

from lifecycle.process_io import BrokerGone, SimClient
from lifecycle.process_model import QUEUES, TOPICS, Model, SimFailure, SimMessage
from lifecycle.process_sweep import body_for, headers_for, take
from waiting import wait_until

# SENDs a producer keeps on the wire before it waits for the oldest receipt.
WINDOW = 8
# The receipts must come well within this; they take milliseconds on a healthy broker.
RECEIPTS_TIMEOUT_S = 60.0


class BackgroundLoad:
    """A producer to every destination and, `with_consumer`, a consumer of one queue that
    acknowledges everything with receipts; choices drawn from `seed`."""

    def __init__(self, model: Model, port: int, seed: int, with_consumer: bool) -> None:
        self.model = model
        self.port = port
        self.rng = random.Random(seed)
        self.with_consumer = with_consumer
        self.receipts = 0
        self._reached = threading.Event()
        self._stop = threading.Event()
        self._failures: list[SimFailure] = []

    def run_then_kill(self, receipts: int, kill: Callable[[], None]) -> None:
        """Run until the producer has `receipts` receipts (or stops), then `kill` the broker
        and wait for the clients to notice; a check that failed on their threads is raised."""
        threads = [
            threading.Thread(
                target=self._produce, args=(receipts, self.rng.randrange(1 << 30)), daemon=True
            )
        ]
        if self.with_consumer:
            queue = self.rng.choice(QUEUES)
            threads.append(threading.Thread(target=self._consume, args=(queue,), daemon=True))
        for thread in threads:
            thread.start()
        try:
            wait_until(
                lambda: self._reached.is_set() or not threads[0].is_alive(),
                RECEIPTS_TIMEOUT_S,
                f"{receipts} receipts",
            )
        except TimeoutError as exc:
            raise SimFailure("hang", str(exc)) from None
        finally:
            kill()
            self._stop.set()
            for thread in threads:
                thread.join(RECEIPTS_TIMEOUT_S)
        if any(thread.is_alive() for thread in threads):
            raise SimFailure("hang", "a background client did not end after the kill")
        if self._failures:
            raise self._failures[0]

    def _produce(self, receipts: int, seed: int) -> None:
        rng = random.Random(seed)
        window: deque[tuple[str, SimMessage]] = deque()
        try:
            client = SimClient(self.port)
        except (BrokerGone, SimFailure) as exc:
            self._failures.append(SimFailure("connection-lost", f"background producer: {exc}"))
            return
        try:
            while not self._stop.is_set():
                dest = rng.choice(QUEUES + TOPICS)
                size = rng.choice([100, 1000, 4000, 16000])
                msg = self.model.new_message(dest, persistent=rng.random() < 0.9, size=size)
                body = body_for(msg.msg_id, msg.size)
                window.append((client.send(dest, body, headers_for(msg)), msg))
                while window and (len(window) >= WINDOW or client.has_receipt(window[0][0])):
                    receipt, done = window.popleft()
                    client.wait_receipts([receipt], "background SEND")
                    self.model.visible(done, receipted=True)
                    self.receipts += 1
                    if self.receipts >= receipts:
                        self._reached.set()
        except BrokerGone:
            pass
        except SimFailure as failure:
            if not self._stop.is_set():
                self._failures.append(failure)
        finally:
            client.abandon()

    def _consume(self, queue: str) -> None:
        try:
            client = SimClient(self.port)
            client.subscribe(queue, "bg", prefetch=20)
        except (BrokerGone, SimFailure):
            return  # the producer's failure says more
        try:
            while not self._stop.is_set():
                frame = client.poll_message(0.1)
                if frame is None:
                    continue
                msg = take(self.model, client, frame, "queue", queue)
                if msg is not None:
                    self.model.ack_sent(msg)
                    client.wait_receipts([client.frame("ACK", id=frame.headers["ack"])], "ACK")
                    self.model.acked(msg)
        except BrokerGone:
            pass
        except SimFailure as failure:
            if not self._stop.is_set():
                self._failures.append(failure)
        finally:
            client.abandon()
