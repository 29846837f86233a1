"""`ExitCode`: what every `sluice` command exits with, defined once."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """The exit status of a command."""

    # Done: for a benchmark, the run completed and every message arrived exactly once.
    OK = 0
    # Failed, with a one-line reason on stderr.
    FAILURE = 1
    # The command line was wrong (argparse uses 2 as well).
    USAGE = 2
    # A high-availability broker lost its lease (another broker took the store over): it stopped
    # serving at once, without writing.
    LEASE_LOST = 3
