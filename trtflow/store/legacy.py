"""Stores written by older trtflow releases kept stage records in a diskcache index/ folder: imported once."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

from trtflow.store.objects import DIGEST
from trtflow.store.records import NO_RECORD, RecordFiles, checked_record

LEGACY_INDEX = "index"  # the diskcache folder of older stores, imported once (import_legacy_index)


def import_legacy_index(records: RecordFiles) -> None:
    """Carry the stage records of a store written by an older trtflow (a diskcache index/) over to records/.

    Only the SQLite table's key and value columns are read (diskcache's file-name column is never followed);
    each record must pass `checked_record`, so a hostile row imports nothing. The old index is then removed.
    """
    legacy = records.folders.root / LEGACY_INDEX
    database = legacy / "cache.db"
    if not legacy.is_dir() or legacy.is_symlink():
        return
    imported = 0
    if database.is_file() and not database.is_symlink():
        for key, text in _legacy_rows(database):
            key = key.removeprefix("stage:")
            record, problem = (
                checked_record(text.encode("utf-8", "replace"), key) if DIGEST.match(key) else (NO_RECORD, "bad key")
            )
            if not problem and not records.path(key).exists():
                records.put(key, record)
                imported += 1
    shutil.rmtree(legacy, ignore_errors=True)
    records.folders.notes.append(
        f"imported {imported} stage record(s) from the store's old index/ into records/ and removed it"
    )


def _legacy_rows(database: Path) -> list[tuple[str, str]]:
    """(key, value) of the old index's text rows named stage:*; none if it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)) as db:
            rows = db.execute(
                "SELECT key, value FROM Cache WHERE typeof(key) = 'text' AND typeof(value) = 'text' "
                "AND substr(key, 1, 6) = 'stage:'"
            ).fetchall()
    except sqlite3.Error:
        return []
    return [(str(key), str(value)) for key, value in rows]
