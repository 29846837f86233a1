"""The load generator behind `sluice bench`: throughput, sync, latency and connection scenarios.

It speaks raw STOMP 1.2 over the sans-IO codec in `sluice.stomp`, so it can load any STOMP broker
(Sluice, ActiveMQ, RabbitMQ). Producers and consumers run in separate worker processes, each with
its own asyncio loop (the synchronous producers of `sync` one process each, as separate
applications would be); results come back to the coordinating process as JSON over pipes.

Layout: `payload` (message bodies), `stats` (latency histogram, exactly-once verifier),
`stomplink` (one raw STOMP connection and the broker it goes to), `roles` (`BenchProducer` and
`BenchConsumer`), `channel` (a worker's pipe to the coordinator), `worker` (the worker process),
`check` (a queue's emptiness check), `connections` and `connections_worker` (the
many-connections scenario), `runner` (the coordinating process), `report` (text and JSON
output), `procstat` and `limits` (CPU time, memory, open files), `cli` (the `sluice bench`
subcommand).
"""

from __future__ import annotations
