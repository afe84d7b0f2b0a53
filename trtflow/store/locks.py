"""Locks between trtflow processes that share a store: per-key build locks, run leases, gc exclusivity.

All are flock locks (through filelock) on files under `<store>/locks/`. The kernel drops a flock when the
process holding it dies, so a run killed with SIGKILL never leaves a lock that blocks anyone:

    locks/<stage key>.lock   held while one process builds that key; others wait, then use its record
    locks/run-<id>.lock      held for a whole run; the run's work dirs live in tmp/run-<id>/
    locks/gc.lock            held by gc while it deletes, and for a moment by every run as it starts

A tmp/run-<id>/ whose run lock nobody holds belongs to a dead run and is swept by the next run.
filelock is imported on first use: a no-op run takes no lock but its lease.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtflow.errors import StoreBusy
from trtflow.store.layout import WRITE_ERRNOS, folder, real_folder, write_failure
from trtflow.util.fs import remove_under


def file_lock(path: Path) -> Any:
    """A FileLock on `path` in a real locks folder; a symlink or a FIFO in the lock file's place is unlinked first
    (the lock opens its file with O_CREAT and would write through a link)."""
    from filelock import FileLock

    folder(path.parent.parent, path.parent.name)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    return FileLock(str(path), thread_local=False)


def _try_acquire(lock: Any) -> bool:
    """One non-blocking attempt; False if another holder (process or open file) has it."""
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    return True


@contextlib.contextmanager
def holding(path: Path) -> Iterator[None]:
    """Hold the lock at `path` (waiting for it) for the duration of a short read-modify-write."""
    lock = file_lock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


class KeyLocks:
    """The build locks one run holds, one per stage key. `claim` never blocks: a busy key is retried later."""

    def __init__(self, locks_dir: Path):
        self.dir = locks_dir
        self.held: dict[str, Any] = {}
        folder(locks_dir.parent, locks_dir.name)

    def claim(self, key: str) -> bool:
        """True if this run now holds `key`'s lock; False if anyone holds it (this run included)."""
        if key in self.held:
            return False
        lock = file_lock(self.dir / f"{key}.lock")
        if not _try_acquire(lock):
            return False
        self.held[key] = lock
        return True

    def release(self, key: str) -> None:
        """Release `key`, removing its lock file (keys are many; their lock files would pile up)."""
        lock = self.held.pop(key, None)
        if lock is not None:
            _unlink_and_release(lock)

    def release_all(self) -> None:
        """Release every build lock this run still holds."""
        for key in list(self.held):
            self.release(key)


class RunLease:
    """One run's claim on the store: a private tmp dir, and a lock that tells gc and sweepers it is alive."""

    def __init__(self, root: Path, notes: list[str] | None = None):
        self.root = root
        self.id = f"{os.getpid()}-{time.time_ns()}"
        try:
            locks = folder(root, "locks", notes)  # a link in its place is set aside (and said) before any lock is taken
            folder(root, "tmp", notes)
            with holding(locks / "gc.lock"):  # waits while a gc is deleting
                self._lock = file_lock(locks / f"run-{self.id}.lock")
                self._lock.acquire()
                self.tmp = folder(root, "tmp") / f"run-{self.id}"
                self.tmp.mkdir()
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            raise write_failure(root, exc, "(starting a run)") from exc
        self.swept = sweep_dead_runs(root)

    def close(self) -> None:
        """Remove the work dirs, then the lock file."""
        _remove_work(self.root, self.tmp.name)
        _unlink_and_release(self._lock)


class LazyLease:
    """A RunLease taken on first use: a run that finds everything cached writes nothing under the store."""

    def __init__(self, root: Path, notes: list[str] | None = None):
        self.root, self.notes = root, notes
        self._lease: RunLease | None = None

    @property
    def taken(self) -> bool:
        """Whether the lease was taken (the run did or will do work in the store)."""
        return self._lease is not None

    @property
    def swept(self) -> list[Path]:
        """The tmp dirs of dead runs that taking the lease removed (none if it was not taken)."""
        return self._lease.swept if self._lease is not None else []

    def tmp(self) -> Path:
        """The lease's tmp dir, taking the lease now if it was not taken yet."""
        if self._lease is None:
            self._lease = RunLease(self.root, self.notes)
        return self._lease.tmp

    def close(self) -> None:
        """Release the lease if it was taken."""
        if self._lease is not None:
            self._lease.close()


def _dead(lock_path: Path) -> Any | None:
    """The acquired lock if nobody holds `lock_path` (its run is dead or finished), else None."""
    lock = file_lock(lock_path)
    return lock if _try_acquire(lock) else None


def sweep_dead_runs(root: Path) -> list[Path]:
    """Remove tmp/run-<id>/ of every run whose lock is free (a crashed run); returns what was removed."""
    removed = []
    tmp = root / "tmp"
    for work in sorted(tmp.glob("run-*")) if real_folder(root, "tmp") else []:
        lock = _dead(root / "locks" / f"{work.name}.lock")
        if lock is not None:
            if _remove_work(root, work.name):
                removed.append(work)
            _unlink_and_release(lock)
    return removed


def _remove_work(root: Path, name: str) -> bool:
    """Remove tmp/<name>/ by a dirfd walk (a link in it is unlinked, never followed); False when it could not be
    (someone else writing into it meanwhile): its lock goes anyway, so a later sweep or `cache gc` takes it, and no run
    fails over a folder it no longer needs."""
    try:
        remove_under(root, f"tmp/{name}")
    except OSError:
        return False
    return True


def sweep_dead_runs_locked(root: Path) -> list[Path]:
    """sweep_dead_runs with gc's lock held (no run starts meanwhile): what a run that did no work of its own calls."""
    with holding(root / "locks" / "gc.lock"):
        return sweep_dead_runs(root)


def _unlink_and_release(lock: Any) -> None:
    """Unlink while still holding: a waiter that opened the old file finds it unlinked and starts over."""
    with contextlib.suppress(OSError):
        os.unlink(lock.lock_file)
    lock.release()


@contextlib.contextmanager
def exclusive_store(root: Path) -> Iterator[None]:
    """For gc: while held no run can start, and it is refused (StoreBusy) while any run is alive."""
    locks = folder(root, "locks")
    gate = file_lock(locks / "gc.lock")
    if not _try_acquire(gate):
        raise StoreBusy(f"another `trtflow cache gc` is using the store {root}; try again when it finishes")
    try:
        live = [path for path in sorted(locks.glob("run-*.lock")) if not _release_if_dead(path)]
        if live:
            raise StoreBusy(f"{len(live)} trtflow run(s) are using the store {root}; run gc again when they finish")
        yield
    finally:
        gate.release()


def _release_if_dead(lock_path: Path) -> bool:
    """Remove the lock file if nobody holds it; False if somebody does."""
    lock = _dead(lock_path)
    if lock is not None:
        _unlink_and_release(lock)
    return lock is not None


def remove_free_lock_files(root: Path) -> list[Path]:
    """Delete the key lock files nobody holds (gc, under `exclusive_store` only); returns them."""
    locks = root / "locks"
    found = []
    for path in sorted(locks.glob("*.lock")) if real_folder(root, "locks") else []:
        if path.name != "gc.lock" and not path.name.startswith("run-") and _release_if_dead(path):
            found.append(path)
    return found


def run_is_live(root: Path, name: str) -> bool:
    """Whether the run owning tmp/<name> still holds its lock (entries that are not run dirs are never live)."""
    lock_path = root / "locks" / f"{name}.lock"
    if not name.startswith("run-") or not lock_path.exists():  # a live run creates its lock before its dir
        return False
    lock = _dead(lock_path)
    if lock is None:
        return True
    lock.release()
    return False
