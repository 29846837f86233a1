"""Run the `sluice` command line as a user does: `python -m sluice ARGS` in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def sluice(
    *args: str, stdin: bytes = b"", timeout: float = 60.0
) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m sluice ARGS`, feeding `stdin`, and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        check=False,
    )


def stderr_lines(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    """The non-empty lines the command wrote on standard error."""
    return [line for line in result.stderr.decode().splitlines() if line.strip()]


@pytest.fixture
def refused_address() -> str:
    """A 127.0.0.1 address where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"
