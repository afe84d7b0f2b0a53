"""A stage's notes reach the run through its work directory: the last line said, one line, never half a file."""

from __future__ import annotations

from pathlib import Path

from trtflow.util.stage_progress import MAX_CHARS, notes_in, read, silent


def test_the_run_reads_the_last_line_a_stage_said(tmp_path: Path) -> None:
    say = notes_in(tmp_path)
    assert read(tmp_path) is None  # nothing said yet
    say("ModelOpt making the int8 model")
    say("fallback: trial model 3, 12 of 36 candidates kept high\nsecond line")
    assert read(tmp_path) == "fallback: trial model 3, 12 of 36 candidates kept high"
    say("x" * (MAX_CHARS * 2))
    assert read(tmp_path) == "x" * MAX_CHARS
    assert sorted(p.name for p in tmp_path.iterdir()) == [".progress"]  # no temporary file left beside it


def test_notes_that_cannot_be_written_change_nothing(tmp_path: Path) -> None:
    notes_in(tmp_path / "gone")("a stage whose folder went away")  # no error: only the heartbeat's line is lost
    silent("said to no one")
    assert read(tmp_path / "gone") is None
