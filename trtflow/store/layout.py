"""The store's folders are checked to be real folders on every use, not only when the store is created.

A writer of the store can put a symlink where a folder belongs (`tmp -> /home/you`): whatever trtflow then wrote,
read or deleted "in the store" would happen outside it. So each folder of the store is lstat-ed, component by
component, before it is used (a stat or two per use), and whatever stands where a folder belongs and is not one is
renamed to corrupt/ (a rename moves the link itself, never what it points to) with a warning. Deletions walk
folders by descriptor (util.fs.remove_under); files are opened with O_NOFOLLOW and must be regular.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from trtflow.errors import StoreWriteError
from trtflow.util.fs import NotRegular

SUBFOLDERS = ("objects", "records", "runs", "tmp", "locks", "corrupt", "exchange")
CORRUPT = "corrupt"
# Errors that mean "this write cannot succeed here" (disk full, file size limit, quota, read-only, denied).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def write_failure(root: Path, exc: BaseException, what: str = "") -> StoreWriteError:
    """One line naming the store, the failure and the likely cause."""
    if isinstance(exc, OSError):
        reason = f"{exc.strerror or exc} [Errno {exc.errno}]" + (f" on {exc.filename}" if exc.filename else "")
    else:
        reason = str(exc)
    hint = "disk full, file size limit or quota reached, or no permission?"
    return StoreWriteError(f"cannot write to the store {root}{' ' + what if what else ''}: {reason} ({hint})")


@contextlib.contextmanager
def writing_to(root: Path, what: str = "") -> Iterator[None]:
    """Turn a failed write (disk full, EFBIG, quota, denied, SQLite full) into one StoreWriteError."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise write_failure(root, exc, what) from exc


class StoreFolders:
    """What every part of a store shares: its root, its folders (each checked to be real on use), and what it did on
    its own, for the run to report (notes; records, linked objects and folders set aside; objects quarantined)."""

    def __init__(self, root: Path):
        self.root = root
        self.notes: list[str] = []
        self.set_aside: list[str] = []
        self.quarantined: list[str] = []

    def real(self, relative: str) -> bool:
        """Whether `root/relative` is a real folder (whatever stands in its place is set aside)."""
        return real_folder(self.root, relative, self.notes)

    def made(self, relative: str) -> Path:
        """`root/relative` as a real folder, created where missing."""
        return folder(self.root, relative, self.notes)

    def entries(self, sub: str) -> Iterator[Path]:
        """A real store folder's entries, sorted (nothing for a missing folder; a link in its place is set aside)."""
        return iter(sorted((self.root / sub).iterdir())) if self.real(sub) else iter(())

    def writing(self, what: str = "") -> contextlib.AbstractContextManager:
        """Turn a failed write into one StoreWriteError naming the store and `what` was being written."""
        return writing_to(self.root, what)


def real_folder(root: Path, relative: str, notes: list[str] | None = None) -> bool:
    """True if every component of `root/relative` is a real folder; False if one is missing, and the first that
    is a symlink or a file is set aside (see set_aside)."""
    path = root
    for part in Path(relative).parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(mode):
            set_aside(root, path, "is not a real folder", notes)
            return False
    return True


def folder(root: Path, relative: str, notes: list[str] | None = None) -> Path:
    """`root/relative` as a real folder, created where missing (whatever stood in its place set aside first)."""
    if real_folder(root, relative, notes):
        return root / relative
    path = root
    for part in Path(relative).parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    if not real_folder(root, relative, notes):  # replaced by a link between the two checks: refuse
        raise NotRegular(0, "not a real folder", str(root / relative))
    return root / relative


def set_aside(root: Path, path: Path, why: str, notes: list[str] | None = None) -> Path | None:
    """Rename the entry `path` of the store (a symlink, a FIFO, a file where a folder belongs) to corrupt/, never
    following or deleting through it; `corrupt` itself goes beside it. Returns where it went (None if it is gone)."""
    relative = path.relative_to(root)
    stamp = time.time_ns()
    target: Path | None
    if relative == Path(CORRUPT):
        target = root / f"{CORRUPT}.{stamp}.set-aside"
    else:
        target = folder(root, CORRUPT, notes) / f"{'-'.join(relative.parts)}.{stamp}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    except OSError:
        target = None  # a read-only store: still never used
    if notes is not None:
        notes.append(
            f"the store's {relative} {why} (a symlink, a FIFO or a file); never followed it: moved it to "
            f"{target.relative_to(root) if target else 'nowhere (read-only store)'}"
        )
    return target


def entry_is_regular(root: Path, path: Path, notes: list[str] | None = None) -> bool:
    """True if `path` (in a folder already checked) is a regular file; False if missing; anything else is set aside."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISREG(mode):
        return True
    set_aside(root, path, "is not a regular file", notes)
    return False
