"""One project's store, opened: its objects, stage records, run history and memos, each a part with one job.

Layout under the store root:
    objects/<aa>/<sha256>     artifact bytes, named by their digest, read-only, written atomically (objects.py)
    records/<kk>/<key>.json   one stage record each, written atomically; checked against its key when read (records.py)
    runs/<ns>-<pid>.json      the stage keys of each of the last RUN_HISTORY runs, for `gc --keep-last N` (runs.py)
    cache.sqlite              remembered signatures and last resolutions (cache.py, memos.py): thrown away if unreadable
    tmp/run-<id>/             work directories of one live run (same filesystem, so renames are atomic)
    locks/                    inter-process locks (locks.py)
    corrupt/                  objects and records that failed their check, moved aside for a post-mortem

Every name under the store is made from a digest or a run id checked by a pattern, never read from a file: nothing a
writer of the store puts in a record or the cache can make trtflow read, write or delete a path outside it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from trtflow.errors import StoreWriteError
from trtflow.store.cache import FILE_NAME as CACHE_FILE
from trtflow.store.cache import Cache
from trtflow.store.layout import SUBFOLDERS, StoreFolders, folder, real_folder, writing_to
from trtflow.store.legacy import LEGACY_INDEX, import_legacy_index
from trtflow.store.memos import CacheMemos
from trtflow.store.objects import ObjectFiles
from trtflow.store.records import RecordFiles
from trtflow.store.runs import RunHistory

EXCHANGE_DIR = "exchange"  # the Ray executor's default data plane (executors.exchange); gc empties it


class Store:
    """The store of one project. Open with `Store.create` (run) or `Store.existing` (plan, inspect); its parts are
    `objects`, `records`, `runs` and `memos`."""

    def __init__(self, root: Path):
        self.root = root
        self.folders = StoreFolders(root)
        self.tmp = root / "tmp"
        self.locks = root / "locks"
        self.corrupt = root / "corrupt"
        self.exchange = root / EXCHANGE_DIR
        self._cache = Cache(root / CACHE_FILE)
        self.objects = ObjectFiles(self.folders, self._cache)
        self.records = RecordFiles(self.folders, self.objects)
        self.runs = RunHistory(self.folders)
        self.memos = CacheMemos(self._cache)

    @property
    def notes(self) -> list[str]:
        """What the store did on its own (records moved aside, a legacy index imported), for the run to report."""
        return self.folders.notes

    @property
    def set_aside(self) -> list[str]:
        """Malformed records, linked objects and folders moved to corrupt/ by this instance."""
        return self.folders.set_aside

    @property
    def quarantined(self) -> list[str]:
        """Digests of objects moved to corrupt/ by this instance, for the run to report."""
        return self.folders.quarantined

    @classmethod
    def create(cls, root: Path) -> Store:
        """Open the store at `root` for a run, creating its folders first (StoreWriteError if it cannot)."""
        notes: list[str] = []
        with writing_to(root):
            root.mkdir(parents=True, exist_ok=True)
            for sub in SUBFOLDERS:  # each checked on every use too; here, so the run's first warning names them
                if sub in ("corrupt", "exchange"):
                    real_folder(root, sub, notes)
                else:
                    folder(root, sub, notes)
        store = cls(root)
        store.notes.extend(notes)
        import_legacy_index(store.records)
        return store

    @classmethod
    def existing(cls, root: Path) -> Store | None:
        """The store if one was ever created at `root`, else None (planning must not create one)."""
        if not (os.path.lexists(root / "records") or (root / LEGACY_INDEX).is_dir()):
            return None
        store = cls(root)
        for sub in SUBFOLDERS:  # a link in a folder's place is set aside now, so the run's warnings name it
            real_folder(root, sub, store.notes)
        with contextlib.suppress(StoreWriteError):  # a read-only old store: planning goes on without its records
            import_legacy_index(store.records)
        return store

    def close(self) -> None:
        """Close the cache (its SQLite connection)."""
        self._cache.close()

    def take_notes(self) -> list[str]:
        """What the store did on its own since the last call (a cache started anew, a record moved aside)."""
        taken = self.notes + self._cache.notes
        self.notes.clear()
        self._cache.notes = []
        return taken

    def writing(self, what: str = "") -> contextlib.AbstractContextManager:
        """Turn a failed write (disk full, EFBIG, quota, denied, SQLite full) into one StoreWriteError."""
        return self.folders.writing(what)

    def entries(self, sub: str) -> Iterator[Path]:
        """A real store folder's entries, sorted (nothing for a missing folder; a link in its place is set aside)."""
        return self.folders.entries(sub)

    def stray_files(self) -> Iterator[Path]:
        """Entries under records/ and runs/ that are neither a record nor a run: temp files of a killed writer,
        strays."""
        records = set(self.records.files())
        for sub in self.entries("records"):
            if stat.S_ISDIR(sub.lstat().st_mode):
                yield from (p for p in self.entries(f"records/{sub.name}") if p not in records)
            else:
                yield sub
        runs = set(self.runs.files())
        yield from (p for p in self.entries("runs") if p not in runs)

    def forget_missing_files(self) -> int:
        """Drop remembered signatures of files and objects that no longer exist (gc); returns how many."""
        return self.objects.forget_missing(lambda path: not os.path.exists(path))
