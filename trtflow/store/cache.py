"""The store's throwaway cache: what saves work but is never needed to be right.

One SQLite table of name -> JSON text: the remembered (size, mtime_ns, inode) of objects and input files
(so unchanged bytes are not re-hashed) and what each node last resolved to (for `plan --explain`).
Nothing in it names a file that is read, written or deleted because of it: a path is only ever a key
looked up for a file trtflow was about to hash anyway. A cache that SQLite cannot read (a flipped byte,
a truncated file, something else put in its place) is thrown away and started empty, with one warning;
the cost is re-hashing. Values are parsed as JSON and never unpickled.

The first read loads every row in one query (a no-op run of thousands of stages asks for tens of thousands of
names; one query each cost more than the rest of the lookup). Rows another process writes meanwhile are not
seen: every value is checked against the file it describes (signatures by size, mtime and inode) or only
explains, so a stale row costs a re-hash at worst.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE_NAME = "cache.sqlite"
BUSY_TIMEOUT_S = 60


class Cache:
    """A name -> JSON mapping in SQLite that never fails its caller: unreadable means started anew, busy means a
    miss."""

    def __init__(self, path: Path):
        self.path = path
        self.notes: list[str] = []  # resets and switch-offs, for the run to report once
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._off = False
        self._rows: dict[str, str] | None = None  # every row, read at the first get

    def get(self, name: str) -> Any | None:
        """The value under `name`, or None (absent, or not JSON: a stray row counts as absent)."""
        if self._rows is None:
            rows = self._run(lambda db: db.execute("SELECT name, value FROM kv").fetchall(), [])
            self._rows = {name: value for name, value in rows if isinstance(name, str) and isinstance(value, str)}
        text = self._rows.get(name)
        try:
            return json.loads(text) if text is not None else None
        except (TypeError, ValueError, RecursionError):
            return None

    def set(self, name: str, value: Any) -> None:
        """Remember `value` (JSON-ready) under `name`."""
        text = json.dumps(value, sort_keys=True)
        if self._rows is not None:
            self._rows[name] = text
        self._run(lambda db: db.execute("INSERT OR REPLACE INTO kv (name, value) VALUES (?, ?)", (name, text)), None)

    def delete(self, name: str) -> None:
        """Forget `name` (nothing if it is not there)."""
        if self._rows is not None:
            self._rows.pop(name, None)
        self._run(lambda db: db.execute("DELETE FROM kv WHERE name = ?", (name,)), None)

    def names(self, prefix: str) -> list[str]:
        """Every name that starts with `prefix`."""
        rows = self._run(
            lambda db: db.execute("SELECT name FROM kv WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)).fetchall(),
            [],
        )
        return [row[0] for row in rows if isinstance(row[0], str)]

    def close(self) -> None:
        """Close the connection (a later call opens it again)."""
        with self._lock:
            self._close()

    def _run(self, query: Callable[[sqlite3.Connection], Any], empty: Any) -> Any:
        """Run one statement; an unreadable database is thrown away and the statement tried once more."""
        with self._lock:
            for attempt in (1, 2):
                if self._off:
                    return empty
                try:
                    db = self._connect()
                    with db:
                        return query(db)
                except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed", ...
                    unreadable = not isinstance(exc, sqlite3.OperationalError) or "no such table" in str(exc)
                    if unreadable and attempt == 1:
                        self._reset(str(exc))
                    else:
                        self._switch_off(str(exc))
        return empty

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            if os.path.lexists(self.path) and not stat.S_ISREG(os.lstat(self.path).st_mode):
                raise sqlite3.DatabaseError("it is not a regular file")  # a link is never opened: thrown away, anew
            db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            self._db = db
            # a rollback journal: reading writes nothing
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "delete":
                db.execute("PRAGMA journal_mode = DELETE")
            # No fsync per statement: each row is checked against the file it describes (or only explains), and a
            # database a crash left unreadable is thrown away. A write took 0.9 ms with fsyncs, 0.1 ms without, and a
            # run writes one per new object and input file (10,000 after a 10,000-stage build).
            db.execute("PRAGMA synchronous = OFF")
            db.execute("CREATE TABLE IF NOT EXISTS kv (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    def _reset(self, why: str) -> None:
        """Throw the database (and its journals) away; the next statement starts an empty one."""
        self._close()
        self._rows = None
        for suffix in ("", "-wal", "-shm", "-journal"):
            remove_entry(self.path.with_name(self.path.name + suffix))
        self.notes.append(
            f"the store's cache ({self.path.name}) was unreadable ({why}); started it anew "
            "(records and objects are untouched; unchanged files are hashed once more)"
        )

    def _switch_off(self, why: str) -> None:
        self._close()
        self._off = True
        self.notes.append(f"the store's cache ({self.path.name}) is unusable ({why}); going on without it")


def remove_entry(path: Path) -> None:
    """Remove a file, a symlink (never what it points to) or a folder; nothing if it is not there."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
