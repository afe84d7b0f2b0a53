"""What a long stage is doing now, for the run's heartbeat (`still    precision:bert/int8  (running for 240 s:
fallback: sensitivity measured for 80 of 121)`).

A stage says a short line whenever its work moves on, with the notes of its work directory (`notes_in`): written to
PROGRESS_FILE there, replaced whole, never half-written. The run reads it when it says a stage is still running
(`read`). Best effort: a stage that says nothing, a worker on another machine (Ray) or a file that cannot be written
changes nothing but that line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trtflow.util.fs import atomic_write

PROGRESS_FILE = ".progress"
MAX_CHARS = 160

Notes = Callable[[str], None]


def notes_in(workdir: Path) -> Notes:
    """What a stage working in `workdir` calls to say what it is doing now (the last line said is the one shown)."""

    def say(text: str) -> None:
        try:
            atomic_write(workdir / PROGRESS_FILE, text.splitlines()[0][:MAX_CHARS] if text else "")
        except OSError:
            pass

    return say


def silent(text: str) -> None:
    """Notes that go nowhere (a search run outside a stage, as tests run it)."""


def read(workdir: Path) -> str | None:
    """What the stage working in `workdir` last said, if anything."""
    try:
        with open(workdir / PROGRESS_FILE, encoding="utf-8", errors="replace") as handle:
            said = handle.read(MAX_CHARS).strip()
    except OSError:
        return None
    return said or None
