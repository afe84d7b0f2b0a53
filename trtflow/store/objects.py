"""The store's objects: artifact bytes named by their digest, immutable, written atomically and checked on use.

The whole store (store.Store) is made of this part, the stage records (records), the run history (runs) and the
memos in its throwaway cache (memos). Layout under the store root:
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
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trtflow.errors import ObjectMismatch, StoreWriteError
from trtflow.hashing import file_signature, sha256_handle
from trtflow.store.cache import Cache
from trtflow.store.layout import StoreFolders, entry_is_regular, set_aside
from trtflow.util.faults import crash_point
from trtflow.util.fs import NotRegular, fsync_dir, fsync_file, open_regular
from trtflow.util.reads import note_path

DIGEST = re.compile(r"^[0-9a-f]{64}$")


class ObjectFiles:
    """The objects of one store: `path`, `has`, `intact` (checked on a changed signature), `verify` (always
    re-hashed), `verified_this_run` (re-hashed unless this process hashed it), `add`, `quarantine`, `files`,
    `forget`."""

    def __init__(self, folders: StoreFolders, cache: Cache):
        self.folders = folders
        self.folder = folders.root / "objects"
        self._cache = cache
        self._hashed_here: dict[str, str] = {}  # digest -> its signature when this process hashed it

    def path(self, digest: str) -> Path:
        """Where an object lives: objects/<first two hex digits>/<digest>."""
        return self.folder / digest[:2] / digest

    def has(self, digest: str) -> bool:
        """True if the object is a regular file in a real folder; its bytes are not checked (`intact` does).

        A symlink or anything else in its place (or in place of a folder above it) is set aside, never followed."""
        return self.folders.real(f"objects/{digest[:2]}") and entry_is_regular(
            self.folders.root, self.path(digest), self.folders.notes
        )

    def intact(self, digest: str) -> bool:
        """True if the object is present with its bytes; re-hashes only when its signature changed.

        A mismatch quarantines the object, so it counts as missing from then on (and its stage is rebuilt).
        """
        path = self.path(digest)
        note_path(path)
        if not self.has(digest):
            return False
        try:
            seen = os.lstat(path)
        except FileNotFoundError:
            return False
        if self._cache.get("obj:" + digest) == _signature(seen):
            return True
        return self.verify(digest)

    def verify(self, digest: str) -> bool:
        """Re-hash the object whatever its signature says (for what is about to ship); quarantine a bad one."""
        path = self.path(digest)
        if not self.has(digest):
            return False
        try:
            with open_regular(path) as handle:  # no-follow: a link swapped in meanwhile is never read
                seen = os.fstat(handle.fileno())
                actual = sha256_handle(handle)
        except FileNotFoundError:
            return False
        except NotRegular:
            set_aside(self.folders.root, path, "is not a regular file", self.folders.notes)
            return False
        if actual != digest:
            self.quarantine(digest, seen.st_ino)
            return False
        if file_signature(os.lstat(path)) == file_signature(seen):  # not replaced while it was read
            self._remember(digest, seen)
        return True

    def verified_this_run(self, digest: str) -> bool:
        """`verify`, unless this process already hashed the object (added or verified it) and its signature is the
        same since: what is about to ship is hashed once a run, not again minutes later (links to it, as stages'
        inputs and placed packages, change its ctime, not its bytes)."""
        try:
            unchanged = self._hashed_here.get(digest) == _signature(os.lstat(self.path(digest)))
        except OSError:
            unchanged = False
        return (unchanged and self.has(digest)) or self.verify(digest)

    def _remember(self, digest: str, seen: os.stat_result) -> None:
        """Objects never change, so a signature seen with the right bytes vouches for them until it changes."""
        self._cache.set("obj:" + digest, _signature(seen))
        self._hashed_here[digest] = _signature(seen)

    def quarantine(self, digest: str, inode: int) -> Path | None:
        """Move a corrupt object (the file with `inode`) to corrupt/; None if it is gone or cannot be moved.

        If a concurrent writer replaced it with good bytes after the check, the moved file is not that
        inode, and it is put back.
        """
        path = self.path(digest)
        target = self.folders.root / "corrupt" / f"{digest}.{time.time_ns()}"
        try:
            self.folders.made("corrupt")
            os.replace(path, target)
        except OSError:
            return None  # already gone, or a read-only store: still treated as missing
        if target.lstat().st_ino != inode:
            with contextlib.suppress(OSError):
                os.link(target, path)
                target.unlink()
            return None
        self.folders.quarantined.append(digest)
        return target

    def link_as(self, digest: str, path: Path) -> bool:
        """Put a hard link to the intact object `digest` in the place of the file `path` (read-only, as objects are);
        False, and `path` left as it is, where there is no such object or no link can be made (another filesystem)."""
        if not self.intact(digest):
            return False
        linked = path.with_name(f".{path.name}.link")
        try:
            os.link(self.path(digest), linked)
        except OSError:
            return False
        os.replace(linked, path)
        return True

    def add(self, source: Path, expected: str | None = None) -> str:
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
        final = self.path(digest)
        if self.intact(digest):
            source.unlink()
            return digest
        with self.folders.writing(f"(adding object {digest[:16]})"):
            self.folders.made(f"objects/{digest[:2]}")
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

    def files(self) -> Iterator[Path]:
        """Every entry of the real folders under objects/, including leftovers that are not objects (`.incoming-*`);
        a link or a file where a folder belongs is set aside, never listed through."""
        if self.folders.real("objects"):
            for sub in sorted(self.folder.iterdir()):
                if self.folders.real(f"objects/{sub.name}"):
                    yield from sorted(sub.iterdir())
                else:
                    self.folders.set_aside.append(f"objects/{sub.name}")

    def forget(self, digest: str) -> None:
        """Drop the remembered signature of an object gc deleted."""
        self._cache.delete("obj:" + digest)

    def _present(self, digest: str) -> bool:
        return bool(DIGEST.match(digest)) and self.has(digest)

    def forget_missing(self, missing: Callable[[str], bool]) -> int:
        """Drop remembered signatures of objects that no longer exist and of files `missing` says are gone (gc);
        returns how many."""
        gone = [name for name in self._cache.names("obj:") if not self._present(name.removeprefix("obj:"))]
        gone += [name for name in self._cache.names("stat:") if missing(name.removeprefix("stat:"))]
        for name in gone:
            self._cache.delete(name)
        return len(gone)


def _signature(stat: os.stat_result) -> str:
    """(size, mtime_ns, inode) as one short string: compared on every lookup of a cached record."""
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
