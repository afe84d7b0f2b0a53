"""The destination a serving process watches: one folder per engine digest and a `current` link flipped atomically.

    <dest>/<recipe>/current -> <sha256>            (a relative symlink, replaced with rename(2))
    <dest>/<recipe>/<sha256>/<recipe>.engine
    <dest>/<recipe>/<sha256>/provision.json        what was chosen, from which package, and why
    <dest>/<recipe>/<sha256>/plugins/<sha>-<name>  plugin libraries the package carries for the engine (if any)

A version folder is filled under a temporary name and renamed into place whole, so `current` never points at a
half-written engine, and the engine's path under `current/` is the same whichever precision or target was chosen.
Installing the engine `current` already points to is a no-op; one installed earlier is switched back to without
copying. The `keep` newest version folders (current included) stay, so a process still holding the previous engine
keeps it and a rollback is a link flip; older ones are removed. Provisions of one recipe take turns (a lock file).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock

from trtflow.errors import BadDestination
from trtflow.util.fs import fsync_dir, real_dir, remove_nofollow

Extras = dict[str, tuple[int, Callable[[BinaryIO], None]]]  # more files of the version folder: path -> (size, copy)
CURRENT = "current"
RECORD = "provision.json"
DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Installed:
    """Where the engine is, and what installing it did: installed, unchanged, or switched (back) to."""

    action: str
    engine: Path
    record: Path
    current: Path


def install(
    dest: Path,
    recipe: str,
    sha256: str,
    size: int,
    copy: Callable[[BinaryIO], None],
    record: dict,
    keep: int = 2,
    check: Callable[[Path], None] | None = None,
    extras: Extras | None = None,
) -> Installed:
    """Make `<dest>/<recipe>/current` point at the engine `sha256`; `copy` writes its verified bytes when needed, and
    each of `extras` (paths inside the version folder, named by content: a plugin's sha256) its own.

    `check(engine path)` runs before `current` flips to a new or earlier version: if it raises, `current` stays as
    it was and the version folder is kept (a retry does not fetch the bytes again)."""
    folder, extras = dest / recipe, extras or {}
    created = _make_folder(dest, folder)
    try:
        with FileLock(str(_lock_file(folder))):
            _sweep_incoming(folder)  # provisions of a recipe take turns: what a killed one left is nobody's now
            complete = _complete(folder / sha256, recipe, size, extras)
            action = "unchanged" if _current(folder) == sha256 and complete else None
            if action is None and complete:
                action = "switched"
                os.utime(folder / sha256)  # now the most recently installed: pruning keeps it
            if action is None:
                _fill(folder, recipe, sha256, {f"{recipe}.engine": (size, copy), **extras}, record)
                action = "installed"
            if action != "unchanged":
                if check is not None:
                    check(folder / sha256 / f"{recipe}.engine")
                _point_current(folder, sha256)
                _prune(folder, keep)
    except BaseException:
        _remove_if_empty(folder, created)
        raise
    version = folder / sha256
    return Installed(action, version / f"{recipe}.engine", version / RECORD, folder / CURRENT)


def _make_folder(dest: Path, folder: Path) -> list[Path]:
    """mkdir -p the recipe's folder; the folders it made (to take back if nothing lands). A link there is refused."""
    if folder.is_symlink():
        raise BadDestination(f"--dest {dest}: {folder} is a symlink; refusing to install through it (remove it)")
    made = [p for p in (folder, dest) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadDestination(f"--dest {dest}: cannot make the folder: {exc.strerror or exc}") from exc
    return made


def _remove_if_empty(folder: Path, created: list[Path]) -> None:
    """Take back the folders this install made, when nothing was installed in them."""
    if folder in created:
        (folder / ".lock").unlink(missing_ok=True)
    for path in created:
        try:
            path.rmdir()
        except OSError:
            pass


def _current(folder: Path) -> str | None:
    try:
        return os.readlink(folder / CURRENT)
    except OSError:
        return None


def _complete(version: Path, recipe: str, size: int, extras: Extras) -> bool:
    """The version folder holds the engine and every extra file at its recorded size, and its record (it was renamed
    into place whole)."""
    files = {f"{recipe}.engine": size, **{name: extra[0] for name, extra in extras.items()}}
    return (
        real_dir(version)
        and (version / RECORD).is_file()
        and all(_regular(version / name, want) for name, want in files.items())
    )


def _regular(path: Path, size: int) -> bool:
    return path.is_file() and not path.is_symlink() and path.stat().st_size == size


def _fill(folder: Path, recipe: str, sha256: str, files: Extras, record: dict) -> None:
    """Write the engine, the extra files and the record into a temporary folder, fsync them, rename it to `<sha256>`."""
    incoming = folder / f".incoming-{uuid.uuid4().hex}"
    incoming.mkdir()
    try:
        for name, (_, copy) in files.items():
            (incoming / name).parent.mkdir(parents=True, exist_ok=True)
            with open(incoming / name, "wb") as sink:
                copy(sink)
                sink.flush()
                os.fsync(sink.fileno())
        with open(incoming / RECORD, "w", encoding="utf-8") as sink:
            sink.write(json.dumps(record, indent=2) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
        for parent in sorted({(incoming / name).parent for name in files}):
            fsync_dir(parent)
        target = folder / sha256
        if os.path.lexists(target):  # an incomplete leftover of an interrupted install, or a link: replace it
            remove_nofollow(target)
        os.rename(incoming, target)
        fsync_dir(folder)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _lock_file(folder: Path) -> Path:
    """The recipe's lock file; a link or anything but a regular file in its place is removed (never written through)."""
    path = folder / ".lock"
    if os.path.lexists(path) and not path.is_file() or path.is_symlink():
        remove_nofollow(path)
    return path


def _sweep_incoming(folder: Path) -> None:
    """Remove the `.incoming-*` folders and `.current-*` links of provisions that were killed (call with the lock)."""
    for path in folder.iterdir():
        if path.name.startswith((".incoming-", ".current-")):
            remove_nofollow(path)


def _point_current(folder: Path, sha256: str) -> None:
    """Replace the `current` link in one rename, so a watcher sees the old target or the new one, never neither."""
    link = folder / f".current-{uuid.uuid4().hex}"
    os.symlink(sha256, link)
    try:
        os.replace(link, folder / CURRENT)
    except BaseException:
        link.unlink(missing_ok=True)
        raise
    fsync_dir(folder)


def _prune(folder: Path, keep: int) -> None:
    """Remove version folders beyond the `keep` most recently installed ones; never the current one."""
    current = _current(folder)
    versions = sorted(
        (p for p in folder.iterdir() if DIGEST.fullmatch(p.name) and p.is_dir() and not p.is_symlink()),
        key=lambda p: p.stat().st_mtime_ns,
        reverse=True,
    )
    kept = [p for p in versions if p.name == current] + [p for p in versions if p.name != current][: max(keep - 1, 0)]
    for path in versions:
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)
