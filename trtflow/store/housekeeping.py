"""`trtflow cache`: what the store holds (ls), whether its bytes are intact (verify), what can go (gc).

Each function returns plain JSON-ready data; the CLI prints it.

gc keeps every stage record that trtflow.lock names, that produced a package now in the packages folder,
or (with --keep-last N) that one of the last N runs finished with, and every object those records name
as output or input. Records are not followed upstream by digest: identical bytes from an old stage (a
verify report that did not change) would otherwise keep that stage's whole superseded chain. Everything
else goes: superseded records and their objects, quarantined objects, work dirs of dead runs,
half-written `.incoming-*` files, free lock files.
It is a dry run unless told otherwise, and refuses to delete while a run is using the store.
"""

from __future__ import annotations

import concurrent.futures as futures
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trtflow.hashing import sha256_handle
from trtflow.store.layout import entry_is_regular
from trtflow.store.lockfile import LOCK_FILE, read_lock
from trtflow.store.locks import (
    exclusive_store,
    file_lock,
    holding,
    remove_free_lock_files,
    run_is_live,
    sweep_dead_runs,
)
from trtflow.store.records import DIGEST
from trtflow.store.store import Store
from trtflow.util.fs import NotRegular, open_regular, remove_nofollow, remove_under


# ls ------------------------------------------------------------------------------------------
def usage(store: Store, lock_keys: set[str]) -> dict:
    """Records and bytes per (recipe, stage kind), how many of them trtflow.lock uses, and store totals."""
    sizes = _object_sizes(store)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    referenced: set[str] = set()
    for key, record in store.records.all():
        kind, _, rest = str(record.get("node", "?:?")).partition(":")
        group = groups.setdefault((rest.split("/", 1)[0], kind), {"records": 0, "in_lock": 0, "digests": set()})
        group["records"] += 1
        group["in_lock"] += key in lock_keys
        group["digests"].update(record["outputs"].values())
        referenced.update(record["outputs"].values())
    stages = [
        {
            "recipe": recipe,
            "stage": kind,
            "records": g["records"],
            "in_lock": g["in_lock"],
            "bytes": sum(sizes.get(d, 0) for d in g["digests"]),
        }
        for (recipe, kind), g in sorted(groups.items())
    ]
    unreferenced = [d for d in sizes if d not in referenced]
    return {
        "store": str(store.root),
        "stages": stages,
        "objects": {"count": len(sizes), "bytes": sum(sizes.values())},
        "unreferenced": {"count": len(unreferenced), "bytes": sum(sizes[d] for d in unreferenced)},
        "corrupt": _tree_size(store.corrupt),
        "tmp": _tree_size(store.tmp),
    }


# verify --------------------------------------------------------------------------------------
def verify(store: Store, threads: int | None = None) -> dict:
    """Re-hash every object whatever its remembered signature (bit rot keeps mtime); quarantine corrupt ones."""
    started = time.perf_counter()
    list(store.records.all())  # sets malformed records aside (store.set_aside names them)
    files = _regular_objects(store)
    with futures.ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:  # hashlib releases the GIL
        checked = list(pool.map(_hash_with_inode, files))
    corrupt = _quarantine_corrupt(store, checked)
    moved = {bad["digest"] for bad in corrupt}
    missing = [
        {"key": key, "node": record.get("node"), "digest": digest}
        for key, record in store.records.all()
        for digest in record["outputs"].values()
        if digest not in moved and not store.objects.has(digest)
    ]
    return {
        "store": str(store.root),
        "objects": len(files),
        "bytes": sum(size for _, _, size, _ in checked),
        "corrupt": corrupt,
        "missing": missing,
        "set_aside": list(store.set_aside),
        "leftovers": [str(p) for p in _leftovers(store)],
        "seconds": round(time.perf_counter() - started, 3),
    }


def _regular_objects(store: Store) -> list[Path]:
    """The object files that are regular files; a link or a FIFO in an object's place is set aside, never read, and
    counted with the malformed entries (verify then exits 1)."""
    files = []
    for path in store.objects.files():
        if DIGEST.match(path.name) and path.parent.name == path.name[:2]:
            if entry_is_regular(store.root, path, store.notes):
                files.append(path)
            elif not path.exists():
                store.set_aside.append(path.name)
    return files


def _quarantine_corrupt(store: Store, checked: list[tuple[Path, int, int, str | None]]) -> list[dict]:
    """Move every object whose bytes do not hash to its name to corrupt/, saying which records used it."""
    users = _users(store)
    corrupt = []
    for path, inode, _, actual in checked:
        if actual is not None and actual != path.name:
            moved = store.objects.quarantine(path.name, inode)
            corrupt.append(
                {
                    "digest": path.name,
                    "path": str(path),
                    "actual_sha256": actual,
                    "moved_to": str(moved) if moved else None,
                    "used_by": users.get(path.name, []),
                }
            )
    return corrupt


def _hash_with_inode(path: Path) -> tuple[Path, int, int, str | None]:
    """(path, inode, size, sha256); sha256 None if the file went away meanwhile."""
    try:
        with open_regular(path) as handle:  # no-follow, non-blocking: a link or FIFO swapped in is never read
            stat = os.fstat(handle.fileno())
            return path, stat.st_ino, stat.st_size, sha256_handle(handle)
    except (FileNotFoundError, NotRegular):
        return path, 0, 0, None


def _users(store: Store) -> dict[str, list[dict]]:
    """digest -> the records (node and key) whose outputs name it."""
    users: dict[str, list[dict]] = {}
    for key, record in store.records.all():
        for digest in record["outputs"].values():
            users.setdefault(digest, []).append({"node": record.get("node"), "key": key})
    return users


# gc ------------------------------------------------------------------------------------------
def lock_keys(project_root: Path) -> set[str]:
    """The stage keys trtflow.lock names (none without a lock)."""
    return {entry.key for entry in (read_lock(project_root / LOCK_FILE) or {}).values() if entry.key is not None}


def live_keys(store: Store, project_root: Path, packages_dir: Path, keep_last: int = 0) -> set[str]:
    """Keys gc must keep: the lock's, the current packages' producers, and the last `keep_last` runs'."""
    from trtflow.manifest import MANIFEST_FILE

    keys = lock_keys(project_root)
    placed = [*packages_dir.glob("*.tar.gz"), *packages_dir.glob(f"*/{MANIFEST_FILE}")] if packages_dir.is_dir() else []
    digests = store.memos.file_digests()
    shipped = {digests.digest(path) for path in sorted(placed) if path.is_file()}
    keys |= {key for key, record in store.records.all() if shipped & set(record["outputs"].values())}
    for run in store.runs.recent(keep_last) if keep_last else []:
        keys |= set(run)
    return keys


def garbage(store: Store, keep: set[str]) -> dict:
    """What gc would delete (and keep), with sizes; deletes nothing."""
    records = dict(store.records.all())
    live = keep & set(records)
    kept_digests = {digest for key in live for digest in _objects_of(records[key]) if store.objects.has(digest)}
    objects = [p for p in store.objects.files() if p.name not in kept_digests]
    tmp = [p for p in store.entries("tmp") if not run_is_live(store.root, p.name)] + list(store.stray_files())
    corrupt = list(store.entries("corrupt"))
    tmp += list(store.entries("exchange"))  # what distributed runs shipped: needed by no run once none is live
    freed = {"objects": _sizes(objects), "corrupt": _sizes(corrupt), "tmp": _sizes(tmp)}
    return {
        "store": str(store.root),
        "records": sorted(set(records) - live),
        "kept_records": len(live),
        "kept_objects": len(kept_digests),
        "kept_bytes": sum(_file_size(store.objects.path(d)) for d in kept_digests),
        "objects": [str(p) for p in objects],
        "corrupt": [str(p) for p in corrupt],
        "tmp": [str(p) for p in tmp],
        "freed_bytes": sum(freed.values()),
        "freed": freed,
    }


def collect_garbage(store: Store, keep: set[str]) -> dict:
    """Delete what `garbage` lists, with the store to itself; records first, so a crash leaves orphans only."""
    with exclusive_store(store.root):
        plan = garbage(store, keep)
        for key in plan["records"]:
            store.records.delete(key)
        for path in map(Path, plan["objects"]):
            _remove(store, path)
            store.objects.forget(path.name)
        for path in map(Path, plan["corrupt"] + plan["tmp"]):
            _remove(store, path)
        plan["lock_files"] = len(remove_free_lock_files(store.root))
        plan["stat_entries"] = store.forget_missing_files()
    return plan


def _objects_of(record: Mapping[str, Any]) -> Iterator[str]:
    """The digests a record names: its outputs, and its inputs (so a kept package keeps what it was built from)."""
    yield from record["outputs"].values()
    yield from _strings(record.get("components", {}).get("inputs"))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _recipe_of_leftover(name: str) -> str | None:
    """The recipe whose placement left `name` (`.<recipe>.incoming-*`, `.<recipe>.old-*`,
    `.<recipe>.intoto.jsonl.*.tmp`)."""
    if not name.startswith("."):
        return None
    for marker in (".incoming-", ".old-", ".intoto.jsonl."):
        if marker in name and (marker != ".intoto.jsonl." or name.endswith(".tmp")):
            return name[1:].split(marker)[0] or None
    return None


def _sweep_store_strays(store: Store, own_run: str | None) -> list[Path]:
    """Temp files of killed writers under objects/, records/ and runs/, when no run but `own_run` is live."""
    # a run starting now waits: it cannot begin a write we would take for a stray
    with holding(store.locks / "gc.lock"):
        swept = sweep_dead_runs(store.root)  # a run that took no lease (a no-op) sweeps dead runs' folders too
        others = [p.name for p in _children(store.tmp) if p.name != own_run and run_is_live(store.root, p.name)]
        if others:
            return swept
        strays = list(_leftovers(store))
        for path in strays:
            _remove(store, path)
    return strays + swept


# sizes ---------------------------------------------------------------------------------------
def _object_sizes(store: Store) -> dict[str, int]:
    return {p.name: _file_size(p) for p in store.objects.files() if DIGEST.match(p.name)}


def _leftovers(store: Store) -> Iterator[Path]:
    """Files that are not objects, records or runs: `.incoming-*` and temp files of a killed writer, strays."""
    yield from (p for p in store.objects.files() if not (DIGEST.match(p.name) and p.parent.name == p.name[:2]))
    yield from store.stray_files()


def _remove(store: Store, path: Path) -> None:
    """Delete an entry gc reached in the store: by a dirfd walk from the store's root, links unlinked, never
    followed."""
    remove_under(store.root, str(path.relative_to(store.root)))


def _children(folder: Path) -> Iterator[Path]:
    return iter(sorted(folder.iterdir())) if folder.is_dir() and not folder.is_symlink() else iter(())


def _file_size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def _tree_size(folder: Path) -> int:
    """Bytes of the regular files under a real folder (links are not followed, nor counted)."""
    if not folder.is_dir() or folder.is_symlink():
        return 0
    total = 0
    for top, _, names in os.walk(folder):  # os.walk does not descend into linked folders
        total += sum(_file_size(Path(top, name)) for name in names if not os.path.islink(os.path.join(top, name)))
    return total


def _sizes(paths: Iterable[Path]) -> int:
    return sum(_tree_size(p) if p.is_dir() else _file_size(p) for p in paths)


def sweep_leftovers(
    store: Store,
    packages_dir: Path,
    project_root: Path,
    own_run: str | None = None,
    runs_died: bool | None = None,
) -> list[Path]:
    """Remove what a killed run left beside its outputs: `.<recipe>.incoming-*` and `.<recipe>.old-*` in the packages
    folder (only while that recipe's package lock is free: no run is placing it), `.trtflow.lock.*.tmp` (while the
    lock file's lock is free), and half-written objects and records in the store (only while no other run is live:
    new runs wait meanwhile). `own_run`: the calling run's tmp dir name. Only a killed run leaves half-written files
    in the store, so they are looked for only if `runs_died` (None: if a dead run's tmp dir is there; listing every
    object on every no-op would cost 0.1 ms a stage). Returns what was removed."""
    died = (
        runs_died
        if runs_died is not None
        else any(p.name.startswith("run-") and not run_is_live(store.root, p.name) for p in store.entries("tmp"))
    )
    removed = _sweep_store_strays(store, own_run) if died else []
    from filelock import Timeout

    candidates = [(p, _recipe_of_leftover(p.name)) for p in _children(packages_dir) if _recipe_of_leftover(p.name)]
    candidates += [(p, None) for p in project_root.glob(".trtflow.lock.*.tmp")]
    for path, recipe in candidates:
        lock = file_lock(store.locks / (f"package-{recipe}.lock" if recipe else "trtflow-lock.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue  # a live run is placing it now
        try:
            remove_nofollow(path)
            removed.append(path)
        finally:
            lock.release()
    return removed
