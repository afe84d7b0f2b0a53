"""What a long stage is doing now, for the run's heartbeat (`still    precision:bert/int8  (running for 240 s:
fallback: 80 of 121 nodes ranked)`).

The worker running a stage names its work directory (`working_in`); the stage says a short line whenever its work
moves on (`note`), written to PROGRESS_FILE there (replaced whole, never half-written); the run reads it when it says a
stage is still running (`read`). Best effort: a stage that says nothing, a worker on another machine (Ray) or a file
that cannot be written changes nothing but that line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

PROGRESS_FILE = ".progress"
MAX_CHARS = 160

_where: Path | None = None


@contextlib.contextmanager
def working_in(workdir: Path) -> Iterator[None]:
    """While the block runs, `note` writes into `workdir`."""
    global _where
    before, _where = _where, workdir
    try:
        yield
    finally:
        _where = before


def note(text: str) -> None:
    """Say what the stage is doing now (one line; the last one said is what the run shows)."""
    if _where is None:
        return
    temporary = _where / f"{PROGRESS_FILE}.{os.getpid()}"
    try:
        temporary.write_text(text.splitlines()[0][:MAX_CHARS] if text else "", encoding="utf-8")
        os.replace(temporary, _where / PROGRESS_FILE)
    except OSError:
        pass


def read(workdir: Path) -> str | None:
    """What the stage working in `workdir` last said, if anything."""
    try:
        with open(workdir / PROGRESS_FILE, encoding="utf-8", errors="replace") as handle:
            said = handle.read(MAX_CHARS).strip()
    except OSError:
        return None
    return said or None
