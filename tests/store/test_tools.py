"""The offline tools: verify, dump, rebuild_index, compact, and `sluice store ...` around them."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

import sluice
from sluice.store.journal import files, tools
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.indexcodec import MSG_VALUE

from .helpers import Harness, msg

Q = "/queue/tools"
SRC = str(Path(sluice.__file__).resolve().parents[1])


def small_store(make_journal: Callable[..., Harness]) -> Path:
    """A closed store: one message kept, 1,498 written then removed (several files)."""
    h = make_journal(checkpoint_interval_s=3600.0, gc_interval_s=3600.0)
    h.open()
    s = h.s
    h.track(s.add(msg(Q, 1, b"keep"), None))
    for seq in range(2, 1500):
        h.track(s.add(msg(Q, seq, os.urandom(2048)), None))
    # Written before removed: a remove that caught its add still pending would cancel it and
    # nothing would be left to collect.
    h.settle()
    for seq in range(2, 1500):
        h.track(s.remove(Q, seq))
    h.settle()
    h.close()
    return h.make().config.data_dir  # type: ignore[union-attr]


def test_tools_on_a_small_store(make_journal: Callable[..., Harness]) -> None:
    data_dir = small_store(make_journal)

    report = tools.verify(data_dir)
    assert report.ok, report.lines
    assert report.index_messages == 1
    assert report.lines[-1] == "OK"

    out = io.StringIO()
    count = tools.dump(data_dir, out)
    text = out.getvalue()
    assert count == len(text.splitlines())
    assert "FILE_HEADER" in text
    assert "ADD /queue/tools seq=1 " in text

    before = list_files(data_dir / "journal")
    result = tools.compact(data_dir)
    assert result.deleted
    assert len(list_files(data_dir / "journal")) < len(before)

    rebuilt = tools.rebuild_index(data_dir)
    assert rebuilt.destinations == 1
    assert any("index rebuilt" in line for line in rebuilt.lines)
    assert tools.verify(data_dir).ok

    path = file_path(data_dir / "journal", list_files(data_dir / "journal")[0])
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    damaged = tools.verify(data_dir)
    assert not damaged.ok
    assert any(str(path) in line for line in damaged.problems)


def _tamper_message_entry(data_dir: Path, length: int) -> None:
    """Give the one message entry an impossible record length, as damage to the index would
    (the digest is left as it was)."""
    env = lmdb.open(str(data_dir / "index"), max_dbs=8)
    try:
        msgs = env.open_db(b"msgs")
        with env.begin(write=True) as txn:
            key, value = next(iter(txn.cursor(db=msgs)))
            fields = list(MSG_VALUE.unpack(value))
            fields[2] = length
            txn.put(key, MSG_VALUE.pack(*fields), db=msgs)
    finally:
        env.close()
    (data_dir / "index" / "clean").unlink(missing_ok=True)


def test_verify_bounds_lengths_from_the_index(
    make_journal: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = small_store(make_journal)
    _tamper_message_entry(data_dir, 0xFFFF_FFF0)
    asked: list[int] = []
    real = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        asked.append(length)
        return real(fd, length, offset)

    monkeypatch.setattr(files.os, "pread", pread)
    report = tools.verify(data_dir)
    assert not report.ok
    assert any("index damaged" in line for line in report.problems), report.problems
    # The damaged entry may stop verify before it reads records back: none read is fine, a
    # read as long as the entry claims is not.
    assert all(n <= 1 << 20 for n in asked), asked


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what is tested
        [sys.executable, "-m", "sluice", "store", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
        timeout=120,
    )


def test_store_cli_commands_and_exit_codes(
    make_journal: Callable[..., Harness], tmp_path: Path
) -> None:
    data_dir = small_store(make_journal)

    ok = _cli("verify", str(data_dir))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1] == "OK"

    dumped = _cli("dump", str(data_dir))
    assert dumped.returncode == 0
    assert "ADD /queue/tools seq=1 " in dumped.stdout

    compacted = _cli("compact", str(data_dir))
    assert compacted.returncode == 0, compacted.stderr
    assert "deleted db-" in compacted.stdout

    rebuilt = _cli("rebuild-index", str(data_dir))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "index rebuilt: 1 destinations" in rebuilt.stdout
    assert _cli("verify", str(data_dir)).returncode == 0

    # A damaged record: verify fails naming the file and offset, and so does a start.
    broken = tmp_path / "broken"
    shutil.copytree(data_dir, broken)
    path = file_path(broken / "journal", list_files(broken / "journal")[0])
    raw = bytearray(path.read_bytes())
    raw[60] ^= 0xFF
    path.write_bytes(bytes(raw))
    failed = _cli("verify", str(broken))
    assert failed.returncode == 1
    assert f"{path}: damage at offset" in failed.stdout
    refused = _cli("compact", str(broken))
    assert refused.returncode == 1
    assert "damaged journal record" in refused.stderr
    assert str(path) in refused.stderr

    # A damaged index: verify says it is rebuilt at the next open; rebuild-index does it.
    _tamper_message_entry(data_dir, 0xFFFF_FFF0)
    damaged = _cli("verify", str(data_dir))
    assert damaged.returncode == 1
    assert "index damaged" in damaged.stdout
    assert _cli("rebuild-index", str(data_dir)).returncode == 0
    assert _cli("verify", str(data_dir)).returncode == 0

    missing = _cli("verify", str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert "has no journal/ directory" in missing.stderr
    usage = _cli("frobnicate", str(data_dir))
    assert usage.returncode == 2
