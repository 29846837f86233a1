"""Seeded random damage to the journal (any file, before and after the checkpoint) and to the
index (after a SIGKILL and after a clean stop): the store opens in a child process, so a crash
(SIGBUS, SIGSEGV, SIGABRT) shows as one, and must

- never crash, and never fail with anything but `CorruptionError` naming a damaged data file;
- without repair, either stop that way or open holding exactly what a repair would keep;
- with repair, always open, report the damage, and keep every message whose ADD record is intact
  and that the journal does not remove (a message whose REMOVE record was damaged may return);
- with only the index damaged, open holding exactly what was stored.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import sluice
from sluice.store.journal import format as fmt
from sluice.store.journal.files import file_path, list_files
from sluice.store.journal.scan import FileScan, ScannedRecord

# The children run the same sources as this process.
SRC = str(Path(sluice.__file__).resolve().parents[1])
DESTINATIONS = ("/queue/c1", "/queue/c2", "/queue/c3")
CONFIG = (
    "journal_file_bytes=1 << 20, checkpoint_interval_s=3600.0, gc_interval_s=3600.0, "
    "index_write_batch=10**9"
)

# Writes a journal in two phases around a checkpoint, then waits to be killed.
_WRITER = textwrap.dedent(
    f"""
    import os, random, sys, threading
    from pathlib import Path
    from sluice.config import StoreConfig
    from sluice.store.api import StoredMessage
    from sluice.store.journal.store import JournalStore
    rng = random.Random(17)
    cond = threading.Condition()
    done = [0]
    def sink(handles):
        with cond:
            done[0] += len(handles)
            cond.notify_all()
    store = JournalStore(StoreConfig(data_dir=Path(sys.argv[1]), {CONFIG}))
    store.open(sink)
    issued = 0
    seqs = {{d: 0 for d in {DESTINATIONS!r}}}
    live = {{d: [] for d in {DESTINATIONS!r}}}
    def settle():
        with cond:
            assert cond.wait_for(lambda: done[0] >= issued, 60)
    for phase in (1300, 450):
        for _ in range(phase):
            d = rng.choice(list(seqs))
            if live[d] and rng.random() < 0.35:
                # Written before removed, so no remove cancels a pending add.
                settle()
                store.remove(d, live[d].pop(rng.randrange(len(live[d]))))
            else:
                seqs[d] += 1
                body = rng.randbytes(rng.randrange(50, 6000))
                mid = f"m-{{d}}-{{seqs[d]}}"
                store.add(StoredMessage(d, seqs[d], mid, 1, {{"k": "v"}}, body), None)
                live[d].append(seqs[d])
            issued += 1
        settle()
        if phase == 1300:
            store.checkpoint()
    print("ready", flush=True)
    sys.stdin.read()
    """
)

# Opens each data directory it is given; one JSON line per directory.
_OPENER = textwrap.dedent(
    f"""
    import json, sys, zlib
    from pathlib import Path
    from sluice.config import StoreConfig
    from sluice.errors import CorruptionError
    from sluice.store.journal.store import JournalStore
    def noop(handles):
        pass
    for line in sys.stdin:
        job = json.loads(line)
        config = StoreConfig(data_dir=Path(job["dir"]), repair=job["repair"], {CONFIG})
        store = JournalStore(config)
        try:
            recovery = store.open(noop)
        except CorruptionError as exc:
            print(json.dumps({{"error": str(exc), "path": exc.path, "offset": exc.offset}}))
            sys.stdout.flush()
            continue
        messages = []
        for d in {DESTINATIONS!r}:
            for m in store.load(d, 0, 10**9, 1 << 62):
                messages.append([d, m.seq, m.message_id, zlib.crc32(m.body)])
        store.close()
        print(json.dumps({{"messages": messages, "report": recovery.report}}))
        sys.stdout.flush()
    """
)

Key = tuple[str, int]


@dataclass
class Record:
    """One record of the intact base journal."""

    file_no: int
    offset: int
    length: int
    record: fmt.Record
    fields: tuple[str, int, str, int] | None = None  # ADD: destination, seq, id, body crc


@dataclass
class Base:
    """An intact data directory, its records, and what every message's fate depends on."""

    path: Path
    records: list[Record]
    adds: dict[Key, Record] = field(default_factory=dict)
    removes: dict[Key, list[Record]] = field(default_factory=dict)
    live: set[Key] = field(default_factory=set)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=SRC)


def _load_base(path: Path) -> Base:
    journal = path / "journal"
    base = Base(path, [])
    for file_no in list_files(journal):
        for item in FileScan(file_path(journal, file_no)):
            assert isinstance(item, ScannedRecord), item
            if item.offset == 0:
                continue
            if item.rtype == fmt.RecordType.ADD:
                message, _meta = fmt.decode_add(item.payload)
                key = (message.destination, message.seq)
                fields = (message.destination, message.seq, message.message_id)
                rec = Record(
                    file_no, item.offset, item.length, _meta, (*fields, zlib.crc32(message.body))
                )
                base.adds[key] = rec
                base.live.add(key)
            else:
                record = fmt.decode(item.rtype, item.payload)
                rec = Record(file_no, item.offset, item.length, record)
                if isinstance(record, fmt.Remove):
                    key = (record.destination, record.seq)
                    base.removes.setdefault(key, []).append(rec)
                    base.live.discard(key)
            base.records.append(rec)
    return base


@pytest.fixture(scope="module")
def bases() -> Iterator[dict[str, Base]]:
    root = Path(tempfile.mkdtemp(prefix="sluice-corruption-"))
    crashed = root / "crashed"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(crashed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    clean = root / "clean"
    shutil.copytree(crashed, clean)
    # Opened and closed: the checkpoint moves to the end, and the index gets its clean marker.
    out = _open_all([(clean, False)])
    assert "messages" in out[0], out
    result = {"crashed": _load_base(crashed), "clean": _load_base(clean)}
    assert len(list_files(crashed / "journal")) >= 4
    yield result
    shutil.rmtree(root)


def _open_all(jobs: list[tuple[Path, bool]]) -> list[dict[str, object]]:
    """Open every directory in one child process; a crash fails the test naming the job."""
    stdin = "".join(json.dumps({"dir": str(d), "repair": r}) + "\n" for d, r in jobs)
    proc = subprocess.run(  # noqa: PLW1510 - a crash is the finding, reported below
        [sys.executable, "-c", _OPENER],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    if proc.returncode != 0:
        crashed = jobs[len(results)] if len(results) < len(jobs) else None
        pytest.fail(
            f"opening {crashed} ended with {proc.returncode} "
            f"(signal {-proc.returncode if proc.returncode < 0 else 0}):\n{proc.stderr[-3000:]}"
        )
    assert len(results) == len(jobs)
    return results


@dataclass
class Trial:
    """One damaged copy and what the damage touched."""

    path: Path
    repair: bool
    journal_damage: dict[int, list[int]] = field(default_factory=dict)  # file -> offsets
    truncated: dict[int, int] = field(default_factory=dict)  # file -> new size
    index_damaged: bool = False
    index_truncated: bool = False


def _damage(base: Base, target: Path, rng: random.Random, repair: bool) -> Trial:
    shutil.copytree(base.path, target)
    trial = Trial(target, repair)
    journal = target / "journal"
    files = list_files(journal)
    kinds = rng.choice([("journal",), ("index",), ("journal", "index")])
    if "journal" in kinds:
        file_no = rng.choice(files)
        path = file_path(journal, file_no)
        ends = [r.offset + r.length for r in base.records if r.file_no == file_no]
        data_end = max(ends, default=fmt.FILE_HEADER_RECORD_BYTES)
        raw = bytearray(path.read_bytes())
        how = rng.choice(["flip", "flips", "chunk", "truncate"])
        if how == "truncate":
            cut = rng.randrange(fmt.FILE_HEADER_RECORD_BYTES, data_end)
            del raw[cut:]
            trial.truncated[file_no] = cut
        else:
            count = {"flip": 1, "flips": rng.randint(2, 4), "chunk": 1}[how]
            for _ in range(count):
                offset = rng.randrange(0, data_end + 64)
                width = rng.randint(16, 600) if how == "chunk" else 1
                for pos in range(offset, min(offset + width, len(raw))):
                    raw[pos] ^= rng.randint(1, 255)
                    trial.journal_damage.setdefault(file_no, []).append(pos)
        path.write_bytes(bytes(raw))
    if "index" in kinds:
        data = target / "index" / "data.mdb"
        raw = bytearray(data.read_bytes())
        trial.index_damaged = True
        how = rng.choice(["flips", "chunk", "truncate", "page"])
        if how == "truncate":
            del raw[rng.randrange(len(raw)) :]
            trial.index_truncated = True
        elif how == "chunk":
            offset = rng.randrange(len(raw))
            for pos in range(offset, min(offset + rng.randint(16, 2048), len(raw))):
                raw[pos] = rng.randrange(256)
        elif how == "page":
            page = rng.randrange(len(raw) // 4096)
            raw[page * 4096 + rng.randrange(64)] ^= rng.randint(1, 255)
        else:
            for _ in range(rng.randint(1, 8)):
                raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
        data.write_bytes(bytes(raw))
    return trial


def _touched(base: Base, trial: Trial) -> set[int]:
    """Ids of the records the damage reached."""
    out = set()
    for rec in base.records:
        offsets = trial.journal_damage.get(rec.file_no, ())
        end = rec.offset + rec.length
        if any(rec.offset <= o < end for o in offsets):
            out.add(id(rec))
        cut = trial.truncated.get(rec.file_no)
        if cut is not None and end > cut:
            out.add(id(rec))
    return out


def _check(base: Base, trial: Trial, result: dict[str, object]) -> None:
    touched = _touched(base, trial)
    journal_hit = bool(trial.journal_damage or trial.truncated)
    if "error" in result:
        assert journal_hit, f"only the index was damaged, yet the start failed: {result}"
        assert not trial.repair, f"repair must always start: {result}"
        damaged = {
            str(file_path(trial.path / "journal", n))
            for n in (*trial.journal_damage, *trial.truncated)
        }
        assert result["path"] in damaged, result
        assert isinstance(result["offset"], int)
        return
    must: set[Key] = set()
    may: set[Key] = set()
    for key, add in base.adds.items():
        if id(add) in touched:
            continue
        if key in base.live:
            must.add(key)
        elif all(id(r) in touched for r in base.removes.get(key, ())):
            may.add(key)
    messages = result["messages"]
    assert isinstance(messages, list)
    got = {(m[0], m[1]): m for m in messages}
    missing = must - got.keys()
    assert not missing, f"intact messages lost: {sorted(missing)[:5]} report={result['report']}"
    extra = got.keys() - must - may
    assert not extra, f"messages that should be gone: {sorted(extra)[:5]}"
    for key, m in got.items():
        assert tuple(m) == base.adds[key].fields, f"{key} came back altered"
    report = result["report"]
    assert isinstance(report, list)
    if touched:
        assert report, "damage that cost records must be reported"
    if not journal_hit:
        assert got.keys() == base.live
    if trial.index_truncated:
        assert any("index rebuilt" in line for line in report), report


SEEDS = [1, 2, 3] + [pytest.param(seed, marks=pytest.mark.slow) for seed in range(4, 40)]


@pytest.mark.parametrize("which", ["crashed", "clean"])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_damage_never_crashes_and_keeps_intact_records(
    bases: dict[str, Base], which: str, seed: int, tmp_path: Path
) -> None:
    base = bases[which]
    rng = random.Random(seed * 1000 + (which == "clean"))
    trials = [_damage(base, tmp_path / f"t{i}", rng, repair=i % 2 == 1) for i in range(12)]
    results = _open_all([(t.path, t.repair) for t in trials])
    for trial, result in zip(trials, results, strict=True):
        _check(base, trial, result)
    # What repair left opens again without repair, holds the same and reports nothing.
    repaired = [(t, r) for t, r in zip(trials, results, strict=True) if t.repair]
    again = _open_all([(t.path, False) for t, _ in repaired])
    for (trial, before), after in zip(repaired, again, strict=True):
        assert "messages" in after, (trial, after)
        assert sorted(map(tuple, after["messages"])) == sorted(map(tuple, before["messages"]))
        assert after["report"] == [], after["report"]
