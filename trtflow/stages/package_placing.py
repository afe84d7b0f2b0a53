"""Placing a package: `<packages>/<recipe>/` (and `<recipe>.tar.gz` when the recipe asks for one) made to match the
package stage's record, with the provenance statement beside them.

Every placed file is a hard link to its store object (read-only, as every object is): an engine's bytes are on disk
once, shared by its build, its package and its folder. Only an archive holds them a second time, which is why it is
made only when asked for. A placed file edited in place changes its object too: the store sees its new signature,
re-hashes it and rebuilds what it was. Where a link cannot be made (another filesystem), a copy.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from trtflow.stages.base import Node, Placement
from trtflow.store.records import StageRecord
from trtflow.util.reads import note_path

ARCHIVE = "archive"  # the output name of `<recipe>.tar.gz`; every other output is a file of the folder, by its path
NOT_PLACED = "not placed yet"
UPDATED = "an earlier package of the recipe, as placed"  # an ordinary update: replaced without a warning


def _listing(record: StageRecord) -> dict[str, str]:
    """The package folder's files (relative path -> sha256), from the package stage's record."""
    return {name: digest for name, digest in record["outputs"].items() if name != ARCHIVE}


def finish(node: Node, record: StageRecord, place: Placement) -> str | None:
    """Make `<packages>/<recipe>/`, its archive (if asked for) and its provenance match the package stage's record.

    Returns what was repaired (a folder or archive that differed from the package), None otherwise.
    """
    from trtflow.store.locks import holding

    recipe = node.recipe
    difference = _difference(record, place, recipe)
    if difference or _provenance_differs(place, recipe, record):
        with holding(place.store.locks / f"package-{recipe}.lock"):  # concurrent runs write the same package folder
            difference = _difference(record, place, recipe)  # another run may have put it in place meanwhile
            if difference:
                _checkout(place, record, recipe)
            if _provenance_differs(place, recipe, record):
                _write_provenance(place, recipe, record)
    return (
        None
        if difference in (None, NOT_PLACED, UPDATED)
        else f"{place.packages_dir / recipe}: {difference}; restored it from the store"
    )


def _difference(record: StageRecord, place: Placement, recipe: str) -> str | None:
    """What differs between the placed folder and archive and the package (None: nothing; cheap when unchanged: a
    file is re-hashed only when its size, mtime or inode changed)."""
    from trtflow.provenance import provenance_path

    archive, folder = place.packages_dir / f"{recipe}.tar.gz", place.packages_dir / recipe
    note_path(archive)  # one made or deleted by hand is seen by the next run, not answered from its memo
    if not any(path.exists() for path in (archive, folder, provenance_path(folder))):
        return NOT_PLACED  # a folder deleted while its provenance stays is a damaged package, and said so
    found = _folder_difference(folder, _listing(record), place)
    if found is not None:
        return UPDATED if _intact_by_its_sums(folder, place) else found
    wanted = record["outputs"].get(ARCHIVE)
    if wanted is None:
        return UPDATED if archive.exists() else None  # an earlier package's archive: removed quietly
    return None if archive.is_file() and place.digests.digest(archive) == wanted else f"{archive.name} differs"


def _folder_difference(folder: Path, files: dict[str, str], place: Placement) -> str | None:
    """What differs between a package folder and the files it should hold (None: nothing)."""
    if folder.is_symlink() or not folder.is_dir():
        return "its folder is a symlink" if folder.is_symlink() else "its folder is missing"
    present = _files_under(folder)
    if set(present) != set(files):
        changed = sorted(set(present) ^ set(files))
        return f"its folder has other files than the package ({', '.join(changed[:3])})"
    changed = [name for name in sorted(files) if place.digests.digest(present[name]) != files[name]]
    return f"{', '.join(changed[:3])} changed" if changed else None


def _intact_by_its_sums(folder: Path, place: Placement) -> bool:
    """Whether a folder is a package as trtflow placed it (an earlier one): every file, and no other, with the sha256
    its SHA256SUMS gives."""
    from trtflow.manifest import SUMS_FILE, read_sums

    sums = folder / SUMS_FILE
    if folder.is_symlink() or sums.is_symlink() or not sums.is_file():
        return False
    try:
        files = read_sums(sums.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return False
    files[SUMS_FILE] = place.digests.digest(sums)
    return _folder_difference(folder, files, place) is None


def _files_under(folder: Path) -> dict[str, Path]:
    """Every entry under `folder` by relative POSIX path (symlinks and special files included, never followed)."""
    found = {}
    for parent, dirs, files in os.walk(folder):
        note_path(parent)  # a file added anywhere changes its folder
        for name in files + [d for d in dirs if (Path(parent) / d).is_symlink()]:
            path = Path(parent) / name
            found[path.relative_to(folder).as_posix()] = path
    return found


def _provenance(place: Placement, recipe: str, record: StageRecord) -> tuple[Path, bytes]:
    """(where `<recipe>.intoto.jsonl` goes, the bytes it must hold): signed by the run's key, if any."""
    from trtflow import provenance
    from trtflow.manifest import MANIFEST_FILE

    statement = provenance.statement(
        recipe,
        record["outputs"].get(ARCHIVE),
        record["outputs"][MANIFEST_FILE],
        record["record"]["manifest"],
        record["key"],
    )
    path = provenance.provenance_path(place.packages_dir / recipe)
    return path, provenance.envelope_line(statement, place.signer)


def _provenance_differs(place: Placement, recipe: str, record: StageRecord) -> bool:
    """Whether the provenance file is missing or holds other bytes (a new package, another key, an edit)."""
    path, line = _provenance(place, recipe, record)
    note_path(path)
    return not (path.is_file() and not path.is_symlink() and path.read_bytes() == line)


def _write_provenance(place: Placement, recipe: str, record: StageRecord) -> None:
    """Write `<recipe>.intoto.jsonl` beside the package, atomically."""
    from trtflow.util.fs import atomic_write

    path, line = _provenance(place, recipe, record)
    atomic_write(path, line)


def _checkout(place: Placement, record: StageRecord, recipe: str) -> None:
    """Link the package's objects into a folder beside the packages folder, then swap it (and the archive) into
    place; an archive of an earlier package that this one does not make is removed."""
    from trtflow.util.archive import replace_dir_atomically
    from trtflow.util.faults import crash_point

    packages_dir = place.packages_dir
    packages_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=packages_dir, prefix=f".{recipe}.incoming-"))
    try:
        for name, digest in _listing(record).items():
            _place_object(place, digest, staging / recipe / name)
        crash_point("package-extracted")
        replace_dir_atomically(staging / recipe, packages_dir / recipe)
        archive, packed = packages_dir / f"{recipe}.tar.gz", record["outputs"].get(ARCHIVE)
        if packed is None:
            archive.unlink(missing_ok=True)
            return
        _place_object(place, packed, staging / "package.tar.gz")
        os.replace(staging / "package.tar.gz", archive)
        place.digests.vouch(archive, packed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place_object(place: Placement, digest: str, path: Path) -> None:
    """Put the object `digest` at `path`: a hard link, or a read-only copy where no link can be made."""
    from trtflow.errors import StageError

    path.parent.mkdir(parents=True, exist_ok=True)
    if not place.store.objects.link_as(digest, path):
        if not place.store.objects.intact(digest):
            raise StageError(f"{path.name}: object {digest[:16]}... is gone from the store; run again to rebuild it")
        shutil.copyfile(place.store.objects.path(digest), path)
        os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    place.digests.vouch(path, digest)
