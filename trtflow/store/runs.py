"""The store's run history: the stage keys each of the last RUN_HISTORY runs finished with, for `gc --keep-last N`."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from trtflow.store.layout import StoreFolders
from trtflow.util.faults import crash_point
from trtflow.util.fs import atomic_writer, read_regular

RUN_HISTORY = 50  # runs remembered for `cache gc --keep-last N`
RUN_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,10}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_MAX_BYTES = 16 << 20  # a run file lists stage keys: a few KiB


class RunHistory:
    """The run history of one store: `record` a run's keys, the `recent` runs' keys."""

    def __init__(self, folders: StoreFolders):
        self.folders = folders
        self.folder = folders.root / "runs"

    def changes(self, keys: list[str]) -> bool:
        """Whether recording `keys` writes a file: a repeat of the last run adds nothing."""
        history = self.files()
        return not history or self._read(history[-1]) != sorted(set(keys))

    def record(self, keys: list[str]) -> None:
        """Remember the stage keys a run finished with (for `gc --keep-last N`); a repeat of the last run adds
        nothing. The caller holds a run lease while this writes: a kill mid-write leaves a dead run's folder, which
        is what tells the next run to sweep the store's half-written files."""
        if not self.changes(keys):
            return
        with self.folders.writing("(recording the run)"):
            self.folders.made("runs")
            with atomic_writer(self.folder / f"{time.time_ns()}-{os.getpid()}.json") as sink:
                sink.write(json.dumps(sorted(set(keys))).encode())
                crash_point("run-history-written")
            for old in self.files()[:-RUN_HISTORY]:
                old.unlink(missing_ok=True)

    def recent(self, count: int) -> list[list[str]]:
        """The stage keys of the last `count` recorded runs, newest first."""
        return [self._read(path) for path in self.files()[::-1][:count]]

    def files(self) -> list[Path]:
        """Run files oldest first (their names start with the time in ns)."""
        if not self.folders.real("runs"):
            return []
        named = [p for p in self.folder.iterdir() if p.suffix == ".json" and RUN_ID.match(p.stem)]
        return sorted(named, key=lambda p: tuple(int(part) for part in p.stem.split("-")))

    @staticmethod
    def _read(path: Path) -> list[str]:
        """A run's keys; an unreadable or malformed file counts as a run that kept nothing."""
        try:
            keys = json.loads(read_regular(path, _MAX_BYTES))
        except (OSError, ValueError, RecursionError):
            return []
        return [k for k in keys if isinstance(k, str) and _DIGEST.match(k)] if isinstance(keys, list) else []
