"""What a start does with damage when it is asked to repair, and how it reports what was lost.

Recovery (`recovery.py`) decides where damage is; with `StoreConfig.repair` these functions skip
it: the bytes are set aside and padded over (`damage.py`), and the report names every message lost
(destination, sequence, message id where readable) and every other damaged record. Before the
index checkpoint the index knows which live messages were there and drops them; after it the
damaged records were never applied, so an ADD counts as lost unless a later record removes it
(`lost_adds`, settled by `forget_lost` as replay goes on).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sluice.config import StoreConfig
from sluice.errors import CorruptionError
from sluice.store.journal import damage as dmg
from sluice.store.journal import format as fmt
from sluice.store.journal.scan import Damage
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

# Damaged ADDs after the checkpoint, (destination, seq) -> report line.
LostAdds = dict[tuple[str, int], str]


def note(report: list[str], line: str) -> None:
    """Log a line of the recovery report and keep it."""
    log.warning("%s", line)
    report.append(line)


def note_lost(report: list[str], lost: list[tuple[str, int, str | None]]) -> None:
    """Name lost messages in the report, the first `MAX_LISTED_RECORDS` of them."""
    for name, seq, message_id in lost[: dmg.MAX_LISTED_RECORDS]:
        note(report, "  " + dmg.message_line(name, seq, message_id))
    if len(lost) > dmg.MAX_LISTED_RECORDS:
        note(report, f"  and {len(lost) - dmg.MAX_LISTED_RECORDS} more lost messages")


def repair_stretch(
    config: StoreConfig,
    state: JournalState,
    path: Path,
    file_no: int,
    data: bytes,
    item: Damage,
    apply_from: int,
    report: list[str],
    lost_adds: LostAdds,
) -> None:
    """Skip one damaged stretch: say what it held and what is lost, then pad over it."""
    stop = item.resume if item.resume is not None else item.end
    seen, unreadable = dmg.describe(data, item.offset, stop)
    copy = dmg.save_and_pad(config.data_dir, path, data, item)
    kept = f"; the bytes are kept in {copy}" if copy is not None else ""
    note(
        report,
        f"{path}: damaged records skipped by repair at offset {item.offset}: "
        f"{stop - item.offset} bytes lost ({item.reason}){kept}",
    )
    ids = {r.offset: r.message_id for r in seen if r.rtype == fmt.RecordType.ADD}
    # Before the checkpoint the index knows which live messages were there.
    if item.offset < apply_from:
        dropped = state.drop_lost(state.messages_in(file_no, item.offset, stop))
        note_lost(report, [(name, seq, ids.get(loc.offset)) for name, seq, loc in dropped])
    listed = 0
    for record in seen:
        applied = record.offset < apply_from
        if record.rtype == fmt.RecordType.ADD:
            if applied:
                continue  # what was live there, the index named above
            if record.destination is None:
                note(report, f"  lost message: unreadable ADD record at offset {record.offset}")
                continue
            line = dmg.message_line(record.destination, record.seq, record.message_id, record.txno)
            if record.txno or not record.seq:
                note(report, "  " + line)
            else:
                lost_adds[(record.destination, record.seq)] = line
            continue
        if listed < dmg.MAX_LISTED_RECORDS:
            note(report, "  " + dmg.record_line(record, effect_kept=applied))
        listed += 1
    if unreadable:
        note(report, f"  {unreadable} bytes could not be read as records")


def short_file(
    config: StoreConfig,
    state: JournalState,
    path: Path,
    file_no: int,
    end: int,
    known: int,
    report: list[str],
) -> None:
    """A data file's valid data ends before what the index holds from it: it was cut or
    zeroed after the index was written."""
    reason = f"valid data ends at offset {end}, the index holds data up to {known}"
    if not config.repair:
        raise CorruptionError(f"data file lost data: {reason}", str(path), end)
    dropped = state.drop_lost(state.messages_in(file_no, end, known))
    note(report, f"{path}: {reason}; {known - end} bytes lost (repair goes on)")
    note_lost(report, [(name, seq, None) for name, seq, _loc in dropped])


def forget_lost(lost: LostAdds, record: fmt.Record) -> None:
    """A replayed record that removes a message whose damaged ADD was counted as lost."""
    if not lost:
        return
    if isinstance(record, fmt.Remove) and not record.txno:
        lost.pop((record.destination, record.seq), None)
    elif isinstance(record, fmt.RemoveRange | fmt.DestDelete):
        upto = record.upto_seq if isinstance(record, fmt.RemoveRange) else 1 << 64
        for key in [k for k in lost if k[0] == record.destination and k[1] <= upto]:
            del lost[key]
