"""`sluice get`'s target directory against hostile stream names and a prepared directory: an
existing file is never replaced, a symlinked state directory is refused, and control and format
characters (Unicode direction overrides among them) never reach a file name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.cli.getdir import STATE_DIR_NAME, GetDir, GetDirError, safe_name


def _finish(folder: GetDir, stream_id: str, name: str, content: bytes) -> Path:
    record = folder.new_record(stream_id, name)
    folder.save(record)
    with folder.open_part(record, 0) as part:
        part.write(content)
    final = folder.finalize(record)
    folder.drop(record, delete_part=False)
    return final


def test_an_existing_file_with_the_streams_name_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "report.pdf").write_bytes(b"mine")
    folder = GetDir(tmp_path)
    folder.load()
    first = _finish(folder, "s1", "report.pdf", b"theirs 1")
    second = _finish(folder, "s2", "report.pdf", b"theirs 2")
    assert (tmp_path / "report.pdf").read_bytes() == b"mine"
    assert first.name == "report (1).pdf"
    assert first.read_bytes() == b"theirs 1"
    assert second.name == "report (2).pdf"
    assert second.read_bytes() == b"theirs 2"


def test_a_symlink_with_the_streams_name_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / "data.bin")
    folder = GetDir(tmp_path)
    folder.load()
    final = _finish(folder, "s1", "data.bin", b"new")
    assert final.name == "data (1).bin"
    assert target.read_bytes() == b"keep"
    assert (tmp_path / "data.bin").is_symlink()


def test_a_symlinked_state_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(outside, target / STATE_DIR_NAME)
    with pytest.raises(GetDirError, match="symbolic link"):
        GetDir(target).load()
    folder = GetDir(target)
    folder.records = {}
    record = folder.new_record("s1", "x.txt")
    with pytest.raises(GetDirError, match="symbolic link"):
        folder.save(record)
    assert list(outside.iterdir()) == []


def test_a_symlinked_record_is_not_read_and_a_planted_temp_link_not_written_through(
    tmp_path: Path,
) -> None:
    folder = GetDir(tmp_path)
    folder.load()
    record = folder.new_record("s1", "x.txt")
    folder.save(record)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    record_path = next((tmp_path / STATE_DIR_NAME).glob("*.json"))
    os.symlink(victim, record_path.with_suffix(".tmp"))
    folder.save(record)
    assert victim.read_text() == "untouched"
    record_path.unlink()
    os.symlink(victim, record_path)
    fresh = GetDir(tmp_path)
    warnings = fresh.load()
    assert fresh.records == {}
    assert any("unreadable record" in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("invoice\u202egpj.exe", "invoicegpj.exe"),  # RIGHT-TO-LEFT OVERRIDE
        ("a\u200bb\u200fc\u2066d\u2069.txt", "abcd.txt"),  # zero-width space, RLM, isolates
        ("line\u2028break\u2029.txt", "linebreak.txt"),
        ("bell\x07\x1b[31m.txt", "bell[31m.txt"),
        ("\u061cnote.txt", "note.txt"),  # ARABIC LETTER MARK
        ("caf\u00e9 \u00fcber.txt", "caf\u00e9 \u00fcber.txt"),  # letters stay
    ],
)
def test_control_and_format_characters_never_reach_a_file_name(raw: str, expected: str) -> None:
    assert safe_name(raw, "id") == expected


def test_a_record_naming_an_unsafe_file_is_ignored(tmp_path: Path) -> None:
    folder = GetDir(tmp_path)
    folder.load()
    record = folder.new_record("s1", "ok.txt")
    record.name = "evil\u202etxt.exe"
    folder.save(record)
    fresh = GetDir(tmp_path)
    warnings = fresh.load()
    assert fresh.records == {}
    assert any("unsafe" in w for w in warnings), warnings
