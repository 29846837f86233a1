"""`sluice store verify|dump|rebuild-index|compact DIR`: offline tools for a journal directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sluice.cli.common import Runner
from sluice.cli.exitcodes import ExitCode

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> dict[str, Runner]:
    """Add `store` to the subcommand parsers; return its runner by name."""
    st = sub.add_parser("store", help="offline tools for a journal data directory")
    st.add_argument("action", choices=["verify", "dump", "rebuild-index", "compact"])
    st.add_argument("data_dir", type=Path)
    return {"store": _run_store}


def _run_store(args: argparse.Namespace) -> int:
    from sluice.store.journal import tools  # noqa: PLC0415 - offline tools only

    data_dir: Path = args.data_dir
    if not (data_dir / "journal").is_dir():
        print(f"sluice store: {data_dir} has no journal/ directory", file=sys.stderr)
        return ExitCode.FAILURE
    action = args.action
    if action == "dump":
        tools.dump(data_dir, sys.stdout)
        return ExitCode.OK
    if action == "verify":
        report = tools.verify(data_dir)
        print("\n".join(report.lines))
        return ExitCode.OK if report.ok else ExitCode.FAILURE
    if action == "rebuild-index":
        print("\n".join(tools.rebuild_index(data_dir).lines))
        return ExitCode.OK
    print("\n".join(tools.compact(data_dir).lines()) or "nothing to compact")
    return ExitCode.OK
