"""One way to write a file so that readers never see it half-written: temp file beside it, fsync, rename.

Every durable write of trtflow (lock file, store objects and records, provisioned engines) goes through
`atomic_writer`; the directory is fsynced after the rename so the new name survives a power cut too.
The no-follow helpers below are the one way trtflow reads, lists and removes entries of folders that others may
write (the store, a remote folder, a package, an export destination): never through a symlink, never a FIFO.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trtflow.util.faults import crash_point


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a binary file in `path`'s folder; on success it is fsynced and renamed to `path`, else removed."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as sink:
            os.fchmod(sink.fileno(), mode)  # mkstemp's 0600 would hide the file from other readers
            yield sink
            sink.flush()
            os.fsync(sink.fileno())
        crash_point(f"write:{path.name}")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Write all of `data` to `path` atomically and durably (text is UTF-8)."""
    with atomic_writer(path, mode) as sink:
        sink.write(data.encode("utf-8") if isinstance(data, str) else data)


def fsync_file(path: Path) -> None:
    """Flush a file's bytes to disk (before a rename makes it visible under its real name)."""
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries, so a rename inside it is durable; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder: the rename is still atomic
    finally:
        os.close(fd)


# No-follow access: folders another party can write (the store, a remote folder, a package or export destination)
# are read and changed only through entries that are what they claim to be, never through a symlink.
NOFOLLOW_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs the open


class NotRegular(OSError):
    """A path that must be a regular file (or a real folder) is a symlink, a FIFO, a device or a folder."""


def size_or_zero(path: os.PathLike[str] | str) -> int:
    """A file's size in bytes; 0 where it cannot be read (whoever reads it says what is wrong)."""
    try:
        return os.stat(path).st_size
    except (OSError, ValueError):
        return 0


def real_dir(path: Path) -> bool:
    """True if `path` itself (not what a symlink points to) is a folder."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def open_regular(path: Path | str, dir_fd: int | None = None, follow_links: bool = False) -> BinaryIO:
    """Open a regular file for reading, never through a symlink in its last component (unless `follow_links`) and
    never blocking on a FIFO.

    NotRegular (an OSError) if it is anything but a regular file; FileNotFoundError if it is not there.
    """
    flags = NOFOLLOW_READ & ~os.O_NOFOLLOW if follow_links else NOFOLLOW_READ
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # ELOOP: a symlink; ENXIO: a socket or a FIFO without writer
            raise NotRegular(exc.errno, "not a regular file", str(path)) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path, limit: int) -> bytes:
    """Up to `limit` bytes of a regular file (see open_regular)."""
    with open_regular(path) as handle:
        return handle.read(limit)


def open_dir(path: Path, dir_fd: int | None = None) -> int:
    """A descriptor of the real folder `path` (O_NOFOLLOW | O_DIRECTORY); NotRegular if it is a symlink or a file."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotRegular(exc.errno, "not a real folder", str(path)) from exc
        raise


def remove_in(dir_fd: int, name: str) -> None:
    """Remove the entry `name` of an opened folder: a file or a symlink is unlinked (never followed), a real folder
    is removed with everything in it, each level opened without following links. Nothing if it is gone."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            _rmtree_in(dir_fd, name)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _rmtree_in(dir_fd: int, name: str) -> None:
    """shutil.rmtree of the folder `name` in an opened folder: fd-based on Linux, links inside are unlinked, never
    followed. Python 3.10's rmtree takes no dir_fd: it walks the same way from the folder's /proc/self/fd entry."""
    if sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        shutil.rmtree(f"/proc/self/fd/{dir_fd}/{name}")


def remove_nofollow(path: Path) -> None:
    """Remove `path` (see remove_in) with its folder opened without following a link; refuses a linked folder."""
    fd = open_dir(path.parent)
    try:
        remove_in(fd, path.name)
    finally:
        os.close(fd)


def write_nofollow(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` as a new file at `path` in a real folder, atomically; a symlink at `path` is replaced, never
    written through (the rename replaces the link itself)."""
    if not real_dir(path.parent):
        raise NotRegular(errno.ENOTDIR, "not a real folder", str(path.parent))
    atomic_write(path, data, mode)


def open_dir_under(root: Path, relative: str) -> int:
    """A descriptor of the folder `root/relative`, every component below `root` opened without following a link
    (a dirfd walk: a symlink swapped in anywhere on the way is never followed). NotRegular if one is not a folder."""
    fd = open_dir(root)
    try:
        for part in Path(relative).parts:
            inner = open_dir(Path(part), dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_under(root: Path, relative: str) -> None:
    """Remove the entry `root/relative` (see remove_in), its folders reached by a dirfd walk; nothing if any is gone
    or is not a real folder (what a link points to is never touched)."""
    parent, name = os.path.split(relative)
    try:
        fd = open_dir_under(root, parent)
    except (FileNotFoundError, NotRegular):
        return
    try:
        remove_in(fd, name)
    finally:
        os.close(fd)


@contextlib.contextmanager
def private_dir(prefix: str) -> Iterator[Path]:
    """A new 0700 folder of this user's in the system temp folder, removed afterwards: a channel between this process
    and a child it starts that no other user (nor a writer of the store) can write."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_private(path: Path) -> None:
    """NotRegular unless `path` is a real folder of this user's that nobody else can write (0700 or stricter)."""
    seen = os.lstat(path)
    if not stat.S_ISDIR(seen.st_mode) or seen.st_uid != os.getuid() or seen.st_mode & 0o077:
        raise NotRegular(errno.EPERM, "not a private folder of this user's (a 0700 folder)", str(path))


def read_private(path: Path, limit: int) -> bytes:
    """Up to `limit` bytes of a regular file (no-follow) in a private folder (check_private)."""
    check_private(path.parent)
    return read_regular(path, limit)


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link `source` as `target` (free for a multi-GB file on one filesystem), else copy it."""
    try:
        os.link(source, target)
    except OSError:  # another filesystem: slower but correct
        shutil.copyfile(source, target)


def first_link(paths: list[Path]) -> Path | None:
    """The first of `paths` that is a symlink (None if none is): a destination's outputs are never written through
    one, and a link where an output goes is refused rather than silently replaced."""
    for path in paths:
        if os.path.islink(path):
            return path
    return None
