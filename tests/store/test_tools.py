"""The offline tools: verify, dump, rebuild_index, compact."""

from __future__ import annotations

import io
import os
from collections.abc import Callable

from sluice.store.journal import tools
from sluice.store.journal.files import file_path, list_files

from .helpers import Harness, msg

Q = "/queue/tools"


def test_tools_on_a_small_store(make_journal: Callable[..., Harness]) -> None:
    h = make_journal(checkpoint_interval_s=3600.0, gc_interval_s=3600.0)
    h.open()
    s = h.s
    h.track(s.add(msg(Q, 1, b"keep"), None))
    for seq in range(2, 1500):
        h.track(s.add(msg(Q, seq, os.urandom(2048)), None))
    for seq in range(2, 1500):
        h.track(s.remove(Q, seq))
    h.settle()
    h.close()
    data_dir = h.make().config.data_dir  # type: ignore[union-attr]

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
