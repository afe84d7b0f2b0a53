"""The content-addressed store: immutable objects and stage records as files, plus a throwaway cache.

Layout under the store root:
    objects/<aa>/<sha256>     artifact bytes, named by their digest, read-only, written atomically
    records/<kk>/<key>.json   one stage record each, written atomically; checked against its key when read
    runs/<ns>-<pid>.json      the stage keys of each of the last RUN_HISTORY runs (`gc --keep-last N`)
    cache.sqlite              remembered signatures and last resolutions (store/cache.py): thrown away if unreadable
    tmp/run-<id>/             work directories of one live run (same filesystem, so renames are atomic)
    locks/                    inter-process locks (see locks.py)
    corrupt/                  objects and records that failed their check, moved aside for a post-mortem

Every name under the store is made from a digest or a run id checked by a pattern, never read from a file:
nothing a writer of the store puts in a record or the cache can make trtflow read, write or delete a path
outside it. A record is JSON whose components hash back to its key; a malformed one is moved to corrupt/
and its stage built again. Nothing is unpickled.

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
import re
import shutil
import sqlite3
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, MutableMapping, Optional

from trtflow.errors import EnvironmentProblem, InternalError, TrtflowError
from trtflow.hashing import FileDigests, file_signature, sha256_handle, stage_key
from trtflow.store.cache import FILE_NAME as CACHE_FILE
from trtflow.store.cache import Cache
from trtflow.util.faults import crash_point
from trtflow.store.layout import SUBFOLDERS, entry_is_regular, folder, real_folder, set_aside
from trtflow.util.jsondata import BoundExceeded, loads_bounded
from trtflow.util.fs import NotRegular, atomic_write, fsync_dir, fsync_file, open_regular, read_regular
from trtflow.runmemo import note_path

# Errors that mean "this write cannot succeed here" (disk full, file size limit, quota, read-only, denied).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
RUN_HISTORY = 50  # runs remembered for `cache gc --keep-last N`
DIGEST = re.compile(r"^[0-9a-f]{64}$")
RUN_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,10}$")
LEGACY_INDEX = "index"  # the diskcache folder of older stores, imported once (import_legacy_index)
RECORD_MAX_BYTES = 16 << 20  # a stage record is a few KiB; anything near this is not one


EXCHANGE_DIR = "exchange"  # the Ray executor's default data plane (executors.exchange); gc empties it

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


class _MemoryView(MutableMapping[str, Any]):
    """One prefix of the cache as a mapping of JSON objects (FileDigests' memory); anything else reads as absent."""

    def __init__(self, cache: "Cache", prefix: str):
        self._cache, self._prefix = cache, prefix

    def __getitem__(self, name: str) -> Any:
        value = self._cache.get(self._prefix + name)
        if not isinstance(value, dict):
            raise KeyError(name)
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self._cache.set(self._prefix + name, value)

    def __delitem__(self, name: str) -> None:
        self._cache.delete(self._prefix + name)

    def __iter__(self) -> Iterator[str]:
        raise InternalError("the cache is not iterated through a view")

    def __len__(self) -> int:
        raise InternalError("the cache is not counted through a view")


class Store:
    """Objects + index of one project. Open with `Store.create` (run) or `Store.existing` (plan, inspect)."""

    def __init__(self, root: Path):
        self.root = root
        self.objects = root / "objects"
        self.records = root / "records"
        self.runs = root / "runs"
        self.tmp = root / "tmp"
        self.locks = root / "locks"
        self.corrupt = root / "corrupt"
        self.exchange = root / EXCHANGE_DIR
        self.quarantined: list[str] = []  # digests moved to corrupt/ by this instance, for the run to report
        self.notes: list[str] = []  # records moved aside, legacy index imported: for the run to report
        self.set_aside: list[str] = []  # malformed records, linked objects and folders moved to corrupt/ by this instance
        self._cache = Cache(root / CACHE_FILE)
        self._stat = _MemoryView(self._cache, "stat:")

    @classmethod
    def create(cls, root: Path) -> "Store":
        """Open the store at `root` for a run, creating its folders first (StoreWriteError if it cannot)."""
        notes: list[str] = []
        with cls._writing_to(root, ""):
            root.mkdir(parents=True, exist_ok=True)
            for sub in SUBFOLDERS:  # each checked on every use too; here, so the run's first warning names them
                if sub in ("corrupt", "exchange"):
                    real_folder(root, sub, notes)
                else:
                    folder(root, sub, notes)
        store = cls(root)
        store.notes += notes
        import_legacy_index(store)
        return store

    @classmethod
    def existing(cls, root: Path) -> Optional["Store"]:
        """The store if one was ever created at `root`, else None (planning must not create one)."""
        if not (os.path.lexists(root / "records") or (root / LEGACY_INDEX).is_dir()):
            return None
        store = cls(root)
        for sub in SUBFOLDERS:  # a link in a folder's place is set aside now, so the run's warnings name it
            real_folder(root, sub, store.notes)
        with contextlib.suppress(StoreWriteError):  # a read-only old store: planning goes on without its records
            import_legacy_index(store)
        return store

    def close(self) -> None:
        """Close the cache (its SQLite connection)."""
        self._cache.close()

    def take_notes(self) -> list[str]:
        """What the store did on its own since the last call (a cache started anew, a record moved aside)."""
        taken = self.notes + self._cache.notes
        self.notes, self._cache.notes = [], []
        return taken

    def writing(self, what: str = "") -> contextlib.AbstractContextManager:
        """Turn a failed write (disk full, EFBIG, quota, denied, SQLite full) into one StoreWriteError."""
        return self._writing_to(self.root, what)

    @staticmethod
    @contextlib.contextmanager
    def _writing_to(root: Path, what: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            raise write_failure(root, exc, what) from None

    # objects -------------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        """Where an object lives: objects/<first two hex digits>/<digest>."""
        return self.objects / digest[:2] / digest

    def has_object(self, digest: str) -> bool:
        """True if the object is a regular file in a real folder; its bytes are not checked (object_intact does).

        A symlink or anything else in its place (or in place of a folder above it) is set aside, never followed."""
        return real_folder(self.root, f"objects/{digest[:2]}", self.notes) and \
            entry_is_regular(self.root, self.object_path(digest), self.notes)

    def object_intact(self, digest: str) -> bool:
        """True if the object is present with its bytes; re-hashes only when its signature changed.

        A mismatch quarantines the object, so it counts as missing from then on (and its stage is rebuilt).
        """
        path = self.object_path(digest)
        note_path(path)
        if not self.has_object(digest):
            return False
        try:
            seen = os.lstat(path)
        except FileNotFoundError:
            return False
        if self._cache.get("obj:" + digest) == _signature(seen):
            return True
        return self.verify_object(digest)

    def verify_object(self, digest: str) -> bool:
        """Re-hash the object whatever its signature says (for what is about to ship); quarantine a bad one."""
        path = self.object_path(digest)
        if not self.has_object(digest):
            return False
        try:
            with open_regular(path) as handle:  # no-follow: a link swapped in meanwhile is never read
                seen = os.fstat(handle.fileno())
                actual = sha256_handle(handle)
        except FileNotFoundError:
            return False
        except NotRegular:
            set_aside(self.root, path, "is not a regular file", self.notes)
            return False
        if actual != digest:
            self.quarantine(digest, seen.st_ino)
            return False
        if file_signature(os.lstat(path)) == file_signature(seen):  # not replaced while it was read
            self._remember(digest, seen)
        return True

    def _remember(self, digest: str, seen: os.stat_result) -> None:
        """Objects never change, so a signature seen with the right bytes vouches for them until it changes."""
        self._cache.set("obj:" + digest, _signature(seen))

    def quarantine(self, digest: str, inode: int) -> Optional[Path]:
        """Move a corrupt object (the file with `inode`) to corrupt/; None if it is gone or cannot be moved.

        If a concurrent writer replaced it with good bytes after the check, the moved file is not that
        inode, and it is put back.
        """
        path = self.object_path(digest)
        target = self.corrupt / f"{digest}.{time.time_ns()}"
        try:
            folder(self.root, "corrupt", self.notes)
            os.replace(path, target)
        except OSError:
            return None  # already gone, or a read-only store: still treated as missing
        if target.lstat().st_ino != inode:
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
        try:
            with open_regular(source) as handle:  # an output that is a link is refused, never read through
                inode = os.fstat(handle.fileno()).st_ino
                digest = sha256_handle(handle)
        except NotRegular:
            raise StoreWriteError(f"{source} is not a regular file: a stage output must be one (not added)") from None
        if expected is not None and digest != expected:
            source.unlink(missing_ok=True)
            raise ObjectMismatch(expected, digest)
        final = self.object_path(digest)
        if self.object_intact(digest):
            source.unlink()
            return digest
        with self.writing(f"(adding object {digest[:16]})"):
            folder(self.root, f"objects/{digest[:2]}", self.notes)
            self._place(source, final, inode)
            self._remember(digest, final.lstat())
        return digest

    @staticmethod
    def _place(source: Path, final: Path, inode: int) -> None:
        """Stage next to the final name, fsync, make read-only, rename; never a half object under a real name.

        `inode`: the file that was hashed; anything else found in its place after the move is refused."""
        staged = Path(tempfile.mkstemp(dir=final.parent, prefix=".incoming-")[1])
        try:
            shutil.move(str(source), staged)
            if os.lstat(staged).st_ino != inode or not stat.S_ISREG(os.lstat(staged).st_mode):
                raise StoreWriteError(f"{source} was replaced while it was added to the store (not added)")
            fsync_file(staged)
            os.chmod(staged, 0o444)
            crash_point("object-placed")
            os.replace(staged, final)
        finally:
            staged.unlink(missing_ok=True)
        fsync_dir(final.parent)

    def object_files(self) -> Iterator[Path]:
        """Every entry of the real folders under objects/, including leftovers that are not objects (`.incoming-*`);
        a link or a file where a folder belongs is set aside, never listed through."""
        if real_folder(self.root, "objects", self.notes):
            for sub in sorted(self.objects.iterdir()):
                if real_folder(self.root, f"objects/{sub.name}", self.notes):
                    yield from sorted(sub.iterdir())
                else:
                    self.set_aside.append(f"objects/{sub.name}")

    def stray_files(self) -> Iterator[Path]:
        """Entries under records/ and runs/ that are neither a record nor a run: temp files of a killed writer, strays."""
        records = set(self._record_files())
        for sub in self.entries("records"):
            if stat.S_ISDIR(sub.lstat().st_mode):
                yield from (p for p in self.entries(f"records/{sub.name}") if p not in records)
            else:
                yield sub
        runs = set(self._run_files())
        yield from (p for p in self.entries("runs") if p not in runs)

    def forget_object(self, digest: str) -> None:
        """Drop the remembered signature of an object gc deleted."""
        self._cache.delete("obj:" + digest)

    # records -----------------------------------------------------------------------------
    def record_path(self, key: str) -> Path:
        """Where a stage's record lives: records/<first two hex digits>/<key>.json (the key must be a digest)."""
        if not DIGEST.match(key):
            raise InternalError(f"a stage key must be a sha256 digest, got {key[:80]!r}")
        return self.records / key[:2] / f"{key}.json"

    def stage_record(self, key: str, components: Optional[dict] = None) -> Optional[dict]:
        """The record of a finished stage, or None if unknown, malformed, or any of its output objects is gone or corrupt.

        `components`: what the caller hashed into `key`, if it did (a record holding the same is not hashed again).
        """
        record = self._read_record(self.record_path(key), key, components)
        if record is None or not all(self.object_intact(d) for d in record["outputs"].values()):
            return None
        return record

    def put_stage_record(self, key: str, record: dict) -> dict:
        """Write a record; call only once every object it names is in place (a crash then leaves orphans only).

        Returns the record as stored (keys sorted), so downstream stages see the same record whether it was
        built just now, read back later or pulled from a remote: a package's bytes must not depend on which.
        """
        text = json.dumps(record, sort_keys=True)
        path = self.record_path(key)
        with self.writing("(writing a stage record)"):
            folder(self.root, f"records/{key[:2]}", self.notes)
            atomic_write(path, text)
        return json.loads(text)

    def stage_records(self) -> Iterator[tuple[str, dict]]:
        """Every well-formed (key, record) in the store, whether or not its objects are present."""
        for path in self._record_files():
            key = path.name.removesuffix(".json")
            record = self._read_record(path, key)
            if record is not None:
                yield key, record

    def delete_stage_record(self, key: str) -> None:
        """Drop a stage's record; the objects it names stay until gc deletes them."""
        with self.writing():
            self.record_path(key).unlink(missing_ok=True)

    def _read_record(self, path: Path, key: str, components: Optional[dict] = None) -> Optional[dict]:
        """The record at `path` if it is well formed and hashes to `key`; a bad one is moved to corrupt/."""
        note_path(path)
        if not real_folder(self.root, f"records/{path.parent.name}", self.notes):
            return None
        try:
            text = read_regular(path, RECORD_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a symlink, a folder, a FIFO: a record is a regular file or nothing
            return self._set_aside(path, f"it is not a regular file ({exc.strerror or exc})")
        if len(text) > RECORD_MAX_BYTES:
            return self._set_aside(path, f"it is over {RECORD_MAX_BYTES >> 20} MiB")
        record, problem = checked_record(text, key, components)
        return record if not problem else self._set_aside(path, problem)

    def _set_aside(self, path: Path, problem: str) -> None:
        """Move a bad record to corrupt/ (its stage is built again) and say so once."""
        target = self.corrupt / f"record-{path.name}.{time.time_ns()}"
        try:
            folder(self.root, "corrupt", self.notes)
            os.replace(path, target)
        except OSError:
            pass  # a read-only store: the record is still ignored
        self.set_aside.append(path.name)
        self.notes.append(f"the store's record {path.name} was malformed ({problem}); moved it to corrupt/, "
                          "its stage is built again")
        return None

    def last_run(self, node_id: str) -> Optional[dict]:
        """What the node resolved to the last time it ran or was found cached (for `plan --explain`)."""
        value = self._cache.get("node:" + node_id)
        return value if isinstance(value, dict) else None

    def set_last_run(self, node_id: str, value: dict) -> None:
        """Remember what the node resolved to (for `plan --explain`); writes nothing if it is unchanged."""
        if self.last_run(node_id) != value:
            self._cache.set("node:" + node_id, value)

    def remembered_peak(self, node_id: str) -> Optional[int]:
        """The peak RSS (bytes) the node's stage reached the last time it ran, if known (the memory-aware scheduler)."""
        value = self._cache.get("peak:" + node_id)
        return value if isinstance(value, int) and value > 0 else None

    def remember_peak(self, node_id: str, peak: Optional[int]) -> None:
        """Remember the node's measured peak RSS for the next run's scheduling (writes only on change)."""
        if peak and self.remembered_peak(node_id) != peak:
            self._cache.set("peak:" + node_id, int(peak))

    def remembered_lock(self, path: str) -> Optional[list]:
        """[file signature, entries digest] of the lock at `path` as this store last wrote or read it; None if unknown."""
        value = self._cache.get("lock:" + path)
        return value if isinstance(value, list) else None

    def remember_lock(self, path: str, signature: Optional[list[int]], digest: str) -> None:
        """Remember what the lock at `path` holds, so an unchanged lock is not read again (writes only on change)."""
        if signature is not None and self.remembered_lock(path) != [signature, digest]:
            self._cache.set("lock:" + path, [signature, digest])

    def package_listing(self, digest: str) -> Optional[dict[str, str]]:
        """The files (relative path -> sha256) a package object extracts to, as remembered at its checkout; None if unknown."""
        value = self._cache.get("package:" + digest)
        return value if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()) else None

    def remember_package_listing(self, digest: str, listing: dict[str, str]) -> None:
        """Remember what a package object extracts to, so a changed package folder is found without reading the archive."""
        self._cache.set("package:" + digest, listing)

    def file_digests(self) -> FileDigests:
        """A FileDigests whose stat cache lives in the cache, so unchanged inputs are not re-hashed on the next run."""
        return FileDigests(self._stat)

    def forget_missing_files(self) -> int:
        """Drop remembered signatures of files and objects that no longer exist (gc); returns how many."""
        gone = [name for prefix in ("stat:", "obj:") for name in self._cache.names(prefix) if self._names_missing_file(name)]
        for name in gone:
            self._cache.delete(name)
        return len(gone)

    def _names_missing_file(self, name: str) -> bool:
        if name.startswith("stat:"):
            return not os.path.exists(name.removeprefix("stat:"))
        digest = name.removeprefix("obj:")
        return not (DIGEST.match(digest) and self.has_object(digest))

    # run history ---------------------------------------------------------------------------
    def record_run(self, keys: list[str]) -> None:
        """Remember the stage keys a run finished with (for `gc --keep-last N`); a repeat of the last run adds nothing."""
        keys = sorted(set(keys))
        history = self._run_files()
        if history and self._read_run(history[-1]) == keys:
            return
        with self.writing("(recording the run)"):
            folder(self.root, "runs", self.notes)
            atomic_write(self.runs / f"{time.time_ns()}-{os.getpid()}.json", json.dumps(keys))
            for old in self._run_files()[:-RUN_HISTORY]:
                old.unlink(missing_ok=True)

    def recent_runs(self, count: int) -> list[list[str]]:
        """The stage keys of the last `count` recorded runs, newest first."""
        return [self._read_run(path) for path in self._run_files()[::-1][:count]]

    def _run_files(self) -> list[Path]:
        """Run files oldest first (their names start with the time in ns)."""
        if not real_folder(self.root, "runs", self.notes):
            return []
        named = [p for p in self.runs.iterdir() if p.suffix == ".json" and RUN_ID.match(p.stem)]
        return sorted(named, key=lambda p: tuple(int(part) for part in p.stem.split("-")))

    def entries(self, sub: str) -> Iterator[Path]:
        """A real store folder's entries, sorted (nothing for a missing folder; a link in its place is set aside)."""
        return iter(sorted((self.root / sub).iterdir())) if real_folder(self.root, sub, self.notes) else iter(())

    def _record_files(self) -> Iterator[Path]:
        """records/<kk>/<key>.json regular files whose names are digests (temp files and strays are not records)."""
        for sub in self.entries("records"):
            if re.fullmatch(r"[0-9a-f]{2}", sub.name) and real_folder(self.root, f"records/{sub.name}", self.notes):
                for path in sorted(sub.iterdir()):
                    key = path.name.removesuffix(".json")
                    if path.name.endswith(".json") and DIGEST.match(key) and key[:2] == sub.name and \
                            stat.S_ISREG(path.lstat().st_mode):
                        yield path

    @staticmethod
    def _read_run(path: Path) -> list[str]:
        """A run's keys; an unreadable or malformed file counts as a run that kept nothing."""
        try:
            keys = json.loads(read_regular(path, RECORD_MAX_BYTES))
        except (OSError, ValueError, RecursionError):
            return []
        return [k for k in keys if isinstance(k, str) and DIGEST.match(k)] if isinstance(keys, list) else []


def checked_record(text: bytes, key: str, known: Optional[dict] = None) -> tuple[dict, str]:
    """(record, "") if the record is well formed and hashes back to `key`, else ({}, what is wrong).

    `known`: components the caller already hashed to `key`; a record holding exactly those needs no hashing.
    """
    try:
        record = loads_bounded(text, RECORD_MAX_BYTES)
    except ValueError as exc:
        return {}, str(exc) if isinstance(exc, BoundExceeded) else "it is not JSON"
    if not isinstance(record, dict) or record.get("key") != key:
        return {}, "it names another key"
    outputs = record.get("outputs")
    if not isinstance(outputs, dict) or not all(isinstance(d, str) and DIGEST.match(d) for d in outputs.values()):
        return {}, "its outputs are not sha256 digests"
    components = record.get("components")
    if not isinstance(components, dict) or (components != known and stage_key(components) != key):
        return {}, "its key components do not hash to its key"
    return record, ""


def import_legacy_index(store: Store) -> None:
    """Carry the stage records of a store written by an older trtflow (a diskcache index/) over to records/.

    Only the SQLite table's key and value columns are read (diskcache's file-name column is never followed);
    each record must pass `checked_record`, so a hostile row imports nothing. The old index is then removed.
    """
    legacy = store.root / LEGACY_INDEX
    database = legacy / "cache.db"
    if not legacy.is_dir() or legacy.is_symlink():
        return
    imported = 0
    if database.is_file() and not database.is_symlink():
        for key, text in _legacy_rows(database):
            key = key.removeprefix("stage:")
            record, problem = checked_record(text.encode("utf-8", "replace"), key) if DIGEST.match(key) else ({}, "bad key")
            if not problem and not store.record_path(key).exists():
                store.put_stage_record(key, record)
                imported += 1
    shutil.rmtree(legacy, ignore_errors=True)
    store.notes.append(f"imported {imported} stage record(s) from the store's old index/ into records/ and removed it")


def _legacy_rows(database: Path) -> list[tuple[str, str]]:
    """(key, value) of the old index's text rows named stage:*; none if it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)) as db:
            rows = db.execute("SELECT key, value FROM Cache WHERE typeof(key) = 'text' AND typeof(value) = 'text' "
                              "AND substr(key, 1, 6) = 'stage:'").fetchall()
    except sqlite3.Error:
        return []
    return [(str(key), str(value)) for key, value in rows]


def _signature(stat: os.stat_result) -> str:
    """(size, mtime_ns, inode) as one short string: compared on every lookup of a cached record."""
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
