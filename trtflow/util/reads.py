"""What a run reads: the files, folders, globs and tool versions its result depends on, noted by the code that reads
them so the no-op memo (runmemo) can tell later whether any of them changed.

One recording at a time, process-wide: the readers are everywhere (recipes, hashing, the store, calibration data),
and passing a recorder through all of them would add a parameter to every reading function for one consumer.
Outside a recording, noting does nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class Reads:
    """What one run read: files and folders (absolute paths), globs with their matches, tool versions."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.globs: dict[str, list[str]] = {}  # "glob:<pattern>" or "rglob:<folder>" -> sorted matches
        self.versions: dict[str, str | None] = {}


_reads: Reads | None = None


@contextlib.contextmanager
def recording() -> Iterator[Reads]:
    """Remember what the code run inside reads (one recording at a time; nested calls share it)."""
    global _reads
    if _reads is not None:
        yield _reads
        return
    _reads = Reads()
    try:
        yield _reads
    finally:
        _reads = None


def note_path(path: os.PathLike[str] | str) -> None:
    """A file or folder the run's result depends on (nothing happens outside a recording)."""
    if _reads is not None:
        _reads.paths.add(os.path.abspath(path))


def note_glob(kind: str, pattern: str, matches: list[str]) -> None:
    """A glob the run expanded (`glob`: glob.glob(pattern, recursive=True); `rglob`: every path under a folder)."""
    if _reads is not None:
        _reads.globs[f"{kind}:{pattern}"] = sorted(matches)


def note_version(distribution: str, version: str | None) -> None:
    """The installed version of a tool the stage keys depend on."""
    if _reads is not None:
        _reads.versions[distribution] = version
