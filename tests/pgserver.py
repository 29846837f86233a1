"""A throwaway PostgreSQL server for tests and benchmarks: Debian's `initdb` and `pg_ctl`, run as
the `postgres` user (initdb refuses root) in a temporary directory, on a free 127.0.0.1 port,
with `fsync=on`, trust authentication for the user `sluice`. `PgServer.stop()` stops exactly the
server it started (its own data directory), and the directory goes with it.

`pg_server` (in `tests/conftest.py`) is the session fixture; `fresh_schema(server)` names a schema
no other test uses, so each test starts from an empty store without creating a database.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_USER = "sluice"
_SCHEMAS = itertools.count(1)


def pg_bin() -> Path | None:
    """The newest Debian PostgreSQL bin directory, or None when PostgreSQL is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    return Path(found[-1]).parent if found else None


def _major(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


def unavailable_reason() -> str | None:
    """Why a server cannot be started here, or None when it can."""
    if pg_bin() is None:
        return "PostgreSQL is not installed (Debian's postgresql package: `make test` installs it)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "there is no `postgres` user to run initdb as"
    if os.geteuid() != 0:
        return "starting PostgreSQL as the `postgres` user needs root"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster in a temporary directory, on 127.0.0.1."""

    def __init__(self, *, fsync: bool = True) -> None:
        bin_dir = pg_bin()
        assert bin_dir is not None, unavailable_reason()
        self.bin = bin_dir
        self.fsync = fsync
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"
        self.log = self.dir / "log"
        self.port = 0
        self.running = False

    def _as_postgres(self, *args: str, timeout: float = 60.0) -> None:
        subprocess.run(
            ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(args)],
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def init(self) -> None:
        """initdb: a new cluster whose superuser is `sluice`, trusted from 127.0.0.1."""
        self._as_postgres(
            f"{self.bin}/initdb", "-D", str(self.data), "-A", "trust", "-U", PG_USER, "-E", "UTF8"
        )

    def start(self) -> None:
        """Start (again) on a free port; returns once it accepts connections."""
        self.port = self.port or free_port()
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=200"
        )
        self._as_postgres(
            f"{self.bin}/pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "start",
            "-o", f"'{options}'",
        )  # fmt: skip
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop this server (`immediate`: as a crash, recovery at the next start)."""
        if not self.running:
            return
        self.running = False
        self._as_postgres(f"{self.bin}/pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart_immediate(self) -> None:
        """Crash the server (`pg_ctl -m immediate`) and start it again on the same port."""
        self.stop("immediate")
        self.start()

    def destroy(self) -> None:
        """Stop it and remove its directory."""
        with contextlib.suppress(subprocess.SubprocessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        """A connection URI for the `sluice` user."""
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{dbname}"


def fresh_schema(prefix: str = "t") -> str:
    """A schema name no other store of this process has used."""
    return f"{prefix}{os.getpid()}_{next(_SCHEMAS)}"
