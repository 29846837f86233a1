"""Sluice against ActiveMQ and RabbitMQ, side by side: the parts of `benchmarks/compare.py`.

- `scenarios`: what is run (the `sluice bench` arguments), which numbers are read, the targets;
- `procs`: child processes in sessions of their own, stopped on time-out and Ctrl-C, and the
  pids cgroup that caps the tasks of one broker;
- `brokers`: installing, starting and stopping Sluice and the peers, one instance at a time;
- `matrix`: runs x scenarios x brokers, interleaved, one result record per attempt;
- `summary`: medians, min-max, ratios to the best peer, targets;
- `markdown` and `charts`: the generated section of docs/benchmarks.md and its PNG charts;
- `cli`: the command line.
"""
