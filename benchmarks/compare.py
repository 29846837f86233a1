#!/usr/bin/env python3
"""Sluice against ActiveMQ and RabbitMQ on this machine, side by side, in one command.

For each run, each scenario and each broker (in an order that rotates), start the broker fresh on
an empty data directory, run `sluice bench <scenario> --json FILE` against it, stop it. Measures
the machine (benchmarks/machine.py) before and after. Writes the raw results to
docs/benchmarks-compare.json, PNG charts to docs/img/ and the section between
`<!-- compare:begin -->` and `<!-- compare:end -->` of docs/benchmarks.md: medians with min-max,
ratios of Sluice to the best peer, the targets, the machine and the command.

    .venv/bin/python benchmarks/compare.py --runs 3
    .venv/bin/python benchmarks/compare.py --scenarios sync-1,sync-8 --brokers sluice,activemq
    .venv/bin/python benchmarks/compare.py --quick        # smoke test of the harness, ~5 min

The peers are installed with benchmarks/peers/*.sh (root, apt) if missing; a system ActiveMQ or
RabbitMQ service already running makes that peer unavailable unless `--stop-system-services`.
The comparison refuses to start on a checkout with uncommitted changes unless `--allow-dirty`;
every attempt records the Sluice commit it ran. Charts need the `bench` extra (matplotlib). A
scenario that fails for one broker is recorded with its reason; Ctrl-C stops every broker and
bench process started here and keeps the partial results.
"""

from __future__ import annotations

import sys

from compare.cli import main

if __name__ == "__main__":
    sys.exit(main())
