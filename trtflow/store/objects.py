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
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from trtflow.errors import ObjectMismatch, StoreWriteError
from trtflow.hashing import file_signature, sha256_handle
from trtflow.store.cache import FILE_NAME as CACHE_FILE
from trtflow.store.cache import Cache
from trtflow.store.layout import SUBFOLDERS, entry_is_regular, folder, real_folder, set_aside
from trtflow.store.legacy import LEGACY_INDEX, import_legacy_index
from trtflow.store.memos import CacheMemos, MemoryView
from trtflow.store.records import DIGEST, RecordFiles
from trtflow.store.runs import RunHistory
from trtflow.util.faults import crash_point
from trtflow.util.fs import NotRegular, fsync_dir, fsync_file, open_regular
from trtflow.util.reads import note_path

# Errors that mean "this write cannot succeed here" (disk full, file size limit, quota, read-only, denied).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


EXCHANGE_DIR = "exchange"  # the Ray executor's default data plane (executors.exchange); gc empties it


def write_failure(root: Path, exc: BaseException, what: str = "") -> StoreWriteError:
    """One line naming the store, the failure and the likely cause."""
    if isinstance(exc, OSError):
        reason = f"{exc.strerror or exc} [Errno {exc.errno}]" + (f" on {exc.filename}" if exc.filename else "")
    else:
        reason = str(exc)
    hint = "disk full, file size limit or quota reached, or no permission?"
    return StoreWriteError(f"cannot write to the store {root}{' ' + what if what else ''}: {reason} ({hint})")


class Store(RecordFiles, CacheMemos, RunHistory):
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
        # malformed records, linked objects and folders moved to corrupt/ by this instance
        self.set_aside: list[str] = []
        self._cache = Cache(root / CACHE_FILE)
        self._stat = MemoryView(self._cache, "stat:")

    @classmethod
    def create(cls, root: Path) -> Store:
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
    def existing(cls, root: Path) -> Store | None:
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
        return real_folder(self.root, f"objects/{digest[:2]}", self.notes) and entry_is_regular(
            self.root, self.object_path(digest), self.notes
        )

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

    def quarantine(self, digest: str, inode: int) -> Path | None:
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

    def add_object(self, source: Path, expected: str | None = None) -> str:
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
        """Entries under records/ and runs/ that are neither a record nor a run: temp files of a killed writer,
        strays."""
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

    def forget_missing_files(self) -> int:
        """Drop remembered signatures of files and objects that no longer exist (gc); returns how many."""
        gone = [
            name for prefix in ("stat:", "obj:") for name in self._cache.names(prefix) if self._names_missing_file(name)
        ]
        for name in gone:
            self._cache.delete(name)
        return len(gone)

    def _names_missing_file(self, name: str) -> bool:
        if name.startswith("stat:"):
            return not os.path.exists(name.removeprefix("stat:"))
        digest = name.removeprefix("obj:")
        return not (DIGEST.match(digest) and self.has_object(digest))

    def entries(self, sub: str) -> Iterator[Path]:
        """A real store folder's entries, sorted (nothing for a missing folder; a link in its place is set aside)."""
        return iter(sorted((self.root / sub).iterdir())) if real_folder(self.root, sub, self.notes) else iter(())


def _signature(stat: os.stat_result) -> str:
    """(size, mtime_ns, inode) as one short string: compared on every lookup of a cached record."""
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
