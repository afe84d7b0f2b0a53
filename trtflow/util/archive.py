"""Reproducible .tar.gz archives and safe extraction.

Same files in, same bytes out: members sorted, mtime 0, owner root, fixed modes, gzip header without
a time or a file name. Extraction refuses members that would land outside the destination.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import IO

from trtflow.errors import TrtflowError, UnsafeArchive, required
from trtflow.util.faults import crash_point
from trtflow.util.proc import exchange


def write_reproducible_tar(folder: Path, archive: Path, prefix: str) -> None:
    """Pack every file under `folder` as `prefix/<relative path>` into a deterministic .tar.gz.

    The gzip layer stores rather than compresses (level 0): engines are mostly weights (ResNet-18 fp32 compresses
    by 8%) and gzip -9 made packaging 20x slower than `tar cf`; the .tar.gz format stays, so every tool reads it.
    """
    write_reproducible_members(
        archive, prefix, {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    )


def write_reproducible_members(
    archive: Path, prefix: str, members: dict[str, Path | bytes], expected: dict[str, str] | None = None
) -> None:
    """Pack `members` (name -> a file to stream, or bytes) as `prefix/<name>`, sorted by name, into a deterministic
    .tar.gz, without copying the files first. A file whose name `expected` lists is hashed while it is packed and
    must have that sha256 (what is packed is exactly what was verified), else UnsafeArchive."""
    with (
        open(archive, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=STORED) as zipped,
    ):
        with tarfile.TarFile(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_BUFFER) as tar:
            for name in sorted(members):
                content = members[name]
                if isinstance(content, bytes):
                    tar.addfile(_member(f"{prefix}/{name}", len(content)), io.BytesIO(content))
                    continue
                with content.open("rb") as handle:
                    hashing = _Hashing(handle)
                    tar.addfile(_member(f"{prefix}/{name}", os.fstat(handle.fileno()).st_size), hashing)
                if expected and name in expected and hashing.digest.hexdigest() != expected[name]:
                    raise UnsafeArchive(
                        f"{content}: its bytes changed since they were verified (sha256 "
                        f"{hashing.digest.hexdigest()[:16]}..., "
                        f"expected {expected[name][:16]}...)"
                    )


class _Hashing:
    """A file reader that hashes what is read through it."""

    def __init__(self, handle: IO[bytes]):
        self._handle, self.digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self._handle.read(size)
        self.digest.update(chunk)
        return chunk


STORED = 0  # gzip level: no compression (see write_reproducible_tar)
COPY_BUFFER = 1 << 20


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def extract_tar(archive: Path, destination: Path) -> dict[str, str]:
    """Extract regular files only, refusing absolute paths, `..`, links and devices; returns each member's sha256
    (computed while it is written, so nothing is read twice).

    One pass over the archive as a stream, each member checked before it is written: listing the members first and
    then extracting them decompressed the archive twice (0.56 s against 0.17 s for a 94 MB package). A refused
    member can leave the members before it in `destination`: extract into a folder of its own, removed on failure.
    """
    digests = {}
    destination.mkdir(parents=True, exist_ok=True)
    root = destination.resolve()
    with tarfile.open(archive, "r|gz", bufsize=COPY_BUFFER) as tar:
        for member in tar:
            target = (root / member.name).resolve()
            if member.isdir():
                continue
            if not member.isfile() or not target.is_relative_to(root) or os.path.isabs(member.name):
                raise UnsafeArchive(
                    f"{archive}: refusing member {member.name!r} (outside the destination or not a regular file)"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            with required(tar.extractfile(member), member.name) as source, open(target, "wb") as sink:  # isfile()
                hashing = _Hashing(source)
                shutil.copyfileobj(hashing, sink, COPY_BUFFER)
            digests[member.name] = hashing.digest.hexdigest()
    return digests


def replace_dir_atomically(source: Path, destination: Path) -> None:
    """Put a finished folder in place of `destination`; never a half-written one, and on Linux never a moment
    without one (the two folders are exchanged in one rename, then the old one is removed)."""
    if destination.is_dir() and exchange(source, destination):
        crash_point("package-swapped")
        shutil.rmtree(source, ignore_errors=True)  # the old folder, now under the source's name
        return
    old = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.old-"))
    if destination.exists():
        os.replace(destination, old / "x")
    os.replace(source, destination)
    shutil.rmtree(old, ignore_errors=True)


def read_member(archive: Path, suffix: str, limit: int | None = None) -> bytes:
    """The bytes of the first member whose name ends with `suffix` (e.g. '/manifest.json'); more than `limit` is
    refused."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(suffix):
                if limit is not None and member.size > limit:
                    raise TrtflowError(f"{archive}: member {member.name} is {member.size} bytes, more than {limit}")
                return required(tar.extractfile(member), member.name).read()  # a regular file: never None
    raise TrtflowError(f"{archive}: no member ending in {suffix}")
