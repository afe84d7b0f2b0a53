"""One way to write a file so that readers never see it half-written: temp file beside it, fsync, rename.

Every durable write of trtflow (lock file, store objects and records, provisioned engines) goes through
`atomic_writer`; the directory is fsynced after the rename so the new name survives a power cut too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

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
