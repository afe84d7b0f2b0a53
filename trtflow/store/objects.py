"""The content-addressed store: immutable objects on disk plus a JSON-only index.

Layout under the store root:
    objects/<aa>/<sha256>   artifact bytes, named by their digest, read-only, written atomically
    index/                  diskcache: stage key -> outputs + record; node id -> last run; stat cache; run history
    tmp/run-<id>/           work directories of one live run (same filesystem, so renames are atomic)
    locks/                  inter-process locks (see storelock.py)
    corrupt/                objects whose bytes no longer match their name, moved aside for a post-mortem

Index values are JSON text only. diskcache would otherwise pickle values, and a cache directory shared
between CI runners must not be able to run code in whoever reads it.

Crash safety comes from ordering: an object is fsynced and renamed into place before any record names
it, so a crash leaves orphan objects (gc removes them), never a record pointing at half an object.
Integrity: an object's (size, mtime_ns, inode) is remembered when it is added; a lookup that finds a
different signature re-hashes it, and one whose bytes no longer match its name is quarantined and
counted as missing, so its stage is rebuilt. `cache verify` re-hashes everything (bit rot keeps mtime).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, MutableMapping, Optional

import diskcache

from trtflow.errors import EnvironmentProblem, InternalError, TrtflowError
from trtflow.hashing import FileDigests, file_signature, sha256_file, sha256_text
from trtflow.util.fs import fsync_dir, fsync_file

# Errors that mean "this write cannot succeed here" (disk full, file size limit, quota, read-only, denied).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
RUN_HISTORY = 50  # runs remembered for `cache gc --keep-last N`


class StoreCorrupt(TrtflowError):
    """The store holds something it must never hold (a pickled index entry)."""


class StoreWriteError(EnvironmentProblem):
    """A write into the store failed: the disk is full, a size limit or quota was hit, or access is denied."""


class ObjectMismatch(TrtflowError):
    """A file offered as a known object hashes to something else (a tampered or truncated download)."""

    def __init__(self, expected: str, actual: str):
        super().__init__(f"expected sha256 {expected[:16]}..., got {actual[:16]}...")
        self.expected, self.actual = expected, actual


def write_failure(root: Path, exc: BaseException, what: str = "") -> StoreWriteError:
    """One line naming the store, the failure and the likely cause."""
    if isinstance(exc, OSError):
        reason = f"{exc.strerror or exc} [Errno {exc.errno}]" + (f" on {exc.filename}" if exc.filename else "")
    else:
        reason = str(exc)
    hint = "disk full, file size limit or quota reached, or no permission?"
    return StoreWriteError(f"cannot write to the store {root}{' ' + what if what else ''}: {reason} ({hint})")


class JsonOnlyDisk(diskcache.Disk):
    """A diskcache Disk that stores text only and refuses to unpickle anything it finds."""

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        """Store a value that must be JSON text; anything else is a bug (diskcache would pickle it)."""
        if not isinstance(value, str):
            raise InternalError(f"store index values must be JSON text, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        """Read a value back; a pickled one raises StoreCorrupt instead of being unpickled."""
        if mode == diskcache.core.MODE_PICKLE:
            raise StoreCorrupt("the store index holds a pickled value; refusing to load it (delete the store's index/ folder)")
        return super().fetch(mode, filename, value, read)

    def get(self, key: Any, raw: bool) -> Any:
        """Read a key back; a pickled one raises StoreCorrupt instead of being unpickled."""
        if not raw:
            raise StoreCorrupt("the store index holds a pickled key; refusing to load it (delete the store's index/ folder)")
        return super().get(key, raw)


class _IndexView(MutableMapping[str, Any]):
    """One prefix of the index as a mapping of JSON values (used as FileDigests' memory)."""

    def __init__(self, cache: diskcache.Cache, prefix: str):
        self._cache, self._prefix = cache, prefix

    def __getitem__(self, name: str) -> Any:
        text = self._cache.get(self._prefix + name)
        if text is None:
            raise KeyError(name)
        return json.loads(text)

    def __setitem__(self, name: str, value: Any) -> None:
        try:
            self._cache.set(self._prefix + name, json.dumps(value))
        except sqlite3.OperationalError as exc:
            raise write_failure(Path(self._cache.directory).parent, exc, "(its index)") from None

    def __delitem__(self, name: str) -> None:
        del self._cache[self._prefix + name]

    def __iter__(self) -> Iterator[str]:
        raise InternalError("the index is not iterated through a view")

    def __len__(self) -> int:
        raise InternalError("the index is not counted through a view")


class Store:
    """Objects + index of one project. Open with `Store.create` (run) or `Store.existing` (plan, inspect)."""

    def __init__(self, root: Path):
        self.root = root
        self.objects = root / "objects"
        self.tmp = root / "tmp"
        self.locks = root / "locks"
        self.corrupt = root / "corrupt"
        self.quarantined: list[str] = []  # digests moved to corrupt/ by this instance, for the run to report
        with self.writing("(its index)"):
            # Every value stays inside SQLite (no side files): one transaction makes an update atomic.
            self._index = diskcache.Cache(str(root / "index"), disk=JsonOnlyDisk, disk_min_file_size=2**31 - 1)
        self._stat = _IndexView(self._index, "stat:")

    @classmethod
    def create(cls, root: Path) -> "Store":
        """Open the store at `root` for a run, creating its folders first (StoreWriteError if it cannot)."""
        with cls._writing_to(root, ""):
            for sub in ("objects", "tmp", "index", "locks"):
                (root / sub).mkdir(parents=True, exist_ok=True)
        return cls(root)

    @classmethod
    def existing(cls, root: Path) -> Optional["Store"]:
        """The store if one was ever created at `root`, else None (planning must not create one)."""
        return cls(root) if (root / "index").is_dir() else None

    def close(self) -> None:
        """Close the index (its SQLite connections)."""
        self._index.close()

    def writing(self, what: str = "") -> contextlib.AbstractContextManager:
        """Turn a failed write (disk full, EFBIG, quota, denied, SQLite full) into one StoreWriteError."""
        return self._writing_to(self.root, what)

    @staticmethod
    @contextlib.contextmanager
    def _writing_to(root: Path, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise write_failure(root, exc, what or "(its index)") from None
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            raise write_failure(root, exc, what) from None

    # objects -------------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        """Where an object lives: objects/<first two hex digits>/<digest>."""
        return self.objects / digest[:2] / digest

    def has_object(self, digest: str) -> bool:
        """True if the object's file exists; its bytes are not checked (object_intact does)."""
        return self.object_path(digest).is_file()

    def object_intact(self, digest: str) -> bool:
        """True if the object is present with its bytes; re-hashes only when its signature changed.

        A mismatch quarantines the object, so it counts as missing from then on (and its stage is rebuilt).
        """
        path = self.object_path(digest)
        try:
            seen = os.stat(path)
        except FileNotFoundError:
            return False
        if self._index.get("obj:" + digest) == _signature(seen):
            return True
        return self.verify_object(digest)

    def verify_object(self, digest: str) -> bool:
        """Re-hash the object whatever its signature says (for what is about to ship); quarantine a bad one."""
        path = self.object_path(digest)
        try:
            seen = os.stat(path)
            actual = sha256_file(path)
        except FileNotFoundError:
            return False
        if actual != digest:
            self.quarantine(digest, seen.st_ino)
            return False
        if file_signature(os.stat(path)) == file_signature(seen):  # not replaced while it was read
            self._remember(digest, seen)
        return True

    def _remember(self, digest: str, seen: os.stat_result) -> None:
        """Objects never change, so a signature seen with the right bytes vouches for them until it changes."""
        with contextlib.suppress(StoreWriteError), self.writing():  # a read-only store only loses the shortcut
            self._index.set("obj:" + digest, _signature(seen))

    def quarantine(self, digest: str, inode: int) -> Optional[Path]:
        """Move a corrupt object (the file with `inode`) to corrupt/; None if it is gone or cannot be moved.

        If a concurrent writer replaced it with good bytes after the check, the moved file is not that
        inode, and it is put back.
        """
        path = self.object_path(digest)
        target = self.corrupt / f"{digest}.{time.time_ns()}"
        try:
            self.corrupt.mkdir(exist_ok=True)
            os.replace(path, target)
        except OSError:
            return None  # already gone, or a read-only store: still treated as missing
        if target.stat().st_ino != inode:
            with contextlib.suppress(OSError):
                os.link(target, path)
                target.unlink()
            return None
        self.quarantined.append(digest)
        return target

    def add_object(self, source: Path, expected: Optional[str] = None) -> str:
        """Move a finished file into the store under its digest; the move is atomic and durable.

        `expected`: the digest the bytes must have (a download); anything else raises ObjectMismatch.
        """
        digest = sha256_file(source)
        if expected is not None and digest != expected:
            source.unlink(missing_ok=True)
            raise ObjectMismatch(expected, digest)
        final = self.object_path(digest)
        if self.object_intact(digest):
            source.unlink()
            return digest
        with self.writing(f"(adding object {digest[:16]})"):
            final.parent.mkdir(parents=True, exist_ok=True)
            self._place(source, final)
            self._remember(digest, final.stat())
        return digest

    @staticmethod
    def _place(source: Path, final: Path) -> None:
        """Stage next to the final name, fsync, make read-only, rename; never a half object under a real name."""
        staged = Path(tempfile.mkstemp(dir=final.parent, prefix=".incoming-")[1])
        try:
            shutil.move(str(source), staged)
            fsync_file(staged)
            os.chmod(staged, 0o444)
            os.replace(staged, final)
        finally:
            staged.unlink(missing_ok=True)
        fsync_dir(final.parent)

    def object_files(self) -> Iterator[Path]:
        """Every file under objects/, including leftovers that are not objects (`.incoming-*`)."""
        if self.objects.is_dir():
            for folder in sorted(self.objects.iterdir()):
                if folder.is_dir():
                    yield from sorted(folder.iterdir())

    def forget_object(self, digest: str) -> None:
        """Drop the remembered signature of an object gc deleted."""
        with self.writing():
            self._index.delete("obj:" + digest)

    # index ---------------------------------------------------------------------------------
    def _get_json(self, key: str) -> Optional[Any]:
        text = self._index.get(key)
        return None if text is None else json.loads(text)

    def _set_json(self, key: str, value: Any) -> None:
        with self.writing():
            self._index.set(key, json.dumps(value, sort_keys=True))

    def stage_record(self, key: str) -> Optional[dict]:
        """The record of a finished stage, or None if unknown or any of its output objects is gone or corrupt."""
        record = self._get_json("stage:" + key)
        if record is None or not all(self.object_intact(d) for d in record["outputs"].values()):
            return None
        return record

    def put_stage_record(self, key: str, record: dict) -> dict:
        """Write a record; call only once every object it names is in place (a crash then leaves orphans only).

        Returns the record as stored (keys sorted), so downstream stages see the same record whether it was
        built just now, read back later or pulled from a remote: a package's bytes must not depend on which.
        """
        text = json.dumps(record, sort_keys=True)
        with self.writing():
            self._index.set("stage:" + key, text)
        return json.loads(text)

    def stage_records(self) -> Iterator[tuple[str, dict]]:
        """Every (key, record) in the index, whether or not its objects are present."""
        for name in self._index.iterkeys():
            if isinstance(name, str) and name.startswith("stage:"):
                record = self._get_json(name)
                if record is not None:
                    yield name.removeprefix("stage:"), record

    def delete_stage_record(self, key: str) -> None:
        """Drop a stage's record from the index; the objects it names stay until gc deletes them."""
        with self.writing():
            self._index.delete("stage:" + key)

    def last_run(self, node_id: str) -> Optional[dict]:
        """What the node resolved to the last time it ran or was found cached (for `plan --explain`)."""
        return self._get_json("node:" + node_id)

    def set_last_run(self, node_id: str, value: dict) -> None:
        """Remember what the node resolved to (for `plan --explain`); writes nothing if it is unchanged."""
        if self.last_run(node_id) != value:
            self._set_json("node:" + node_id, value)

    def file_digests(self) -> FileDigests:
        """A FileDigests whose stat cache lives in the index, so unchanged inputs are not re-hashed on the next run."""
        return FileDigests(self._stat)

    def forget_missing_files(self) -> int:
        """Drop remembered signatures of files that no longer exist (gc); returns how many."""
        gone = [name for name in self._index.iterkeys() if isinstance(name, str) and self._names_missing_file(name)]
        with self.writing():
            for name in gone:
                self._index.delete(name)
        return len(gone)

    def _names_missing_file(self, name: str) -> bool:
        if name.startswith("stat:"):
            return not os.path.exists(name.removeprefix("stat:"))
        return name.startswith("obj:") and not self.has_object(name.removeprefix("obj:"))

    # run history ---------------------------------------------------------------------------
    def record_run(self, keys: list[str]) -> None:
        """Remember the stage keys a run finished with (for `gc --keep-last N`); a repeat of the last run adds nothing."""
        keys = sorted(set(keys))
        digest = sha256_text(json.dumps(keys))
        runs = self._get_json("runs") or []
        if runs and runs[-1]["keys_sha256"] == digest:
            return
        with self.writing(), self._index.transact():
            runs = self._get_json("runs") or []
            run_id = f"{time.time_ns()}-{os.getpid()}"
            self._index.set("run:" + run_id, json.dumps(keys))
            runs.append({"id": run_id, "finished": round(time.time(), 3), "keys_sha256": digest, "stages": len(keys)})
            for old in runs[:-RUN_HISTORY]:
                self._index.delete("run:" + old["id"])
            self._index.set("runs", json.dumps(runs[-RUN_HISTORY:]))

    def recent_runs(self, count: int) -> list[list[str]]:
        """The stage keys of the last `count` recorded runs, newest first."""
        runs = (self._get_json("runs") or [])[::-1][:count]
        return [self._get_json("run:" + run["id"]) or [] for run in runs]


def _signature(stat: os.stat_result) -> str:
    """(size, mtime_ns, inode) as one short string: compared on every lookup of a cached record."""
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
