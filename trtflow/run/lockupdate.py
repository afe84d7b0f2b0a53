"""Writing trtflow.lock after a run: this run's entries over the old ones, merged under a lock with concurrent runs
of the project, and nothing written when nothing changed."""

from __future__ import annotations

from pathlib import Path

from trtflow.errors import ProjectError
from trtflow.run.frozen import canonical_outputs
from trtflow.run.result import RunResult
from trtflow.run.runmemo import signature
from trtflow.store import Store
from trtflow.store.lockfile import LockEntry, entries_digest, failure_entries, read_lock, write_lock
from trtflow.store.locks import holding
from trtflow.util.reads import note_path


def update_lock(lock_path: Path, all_node_ids: set[str], store: Store, result: RunResult) -> None:
    """Entries of this run's nodes replace old ones (a recorded failure and what it skipped included: the lock
    holds every stage); nodes gone from the project are dropped. A node that failed for a reason of the machine
    (killed, a missing package) keeps its old entry."""
    ours = {
        node_id: LockEntry(
            key=record["key"],
            components=record["components"],
            outputs=record["outputs"],
            canonical=canonical_outputs(record),
        )
        for node_id, record in result.records.items()
    }
    ours.update(failure_entries({s.node.id: s for s in result.nodes}, ours))
    note_path(lock_path)
    with holding(store.locks / "trtflow-lock.lock"):  # concurrent runs of one project merge, not overwrite
        if all_node_ids <= ours.keys() and _lock_holds(
            lock_path, store, entries_digest({k: ours[k] for k in all_node_ids})
        ):
            return  # a no-op of the whole project: the lock is the one the last run wrote or read, unchanged
        try:
            previous = read_lock(lock_path) or {}
        except ProjectError:
            previous = {}  # an unreadable lock is replaced: this run knows everything it needs
        entries = {k: v for k, v in previous.items() if k in all_node_ids}
        entries.update(ours)
        if entries != previous:  # a no-op writes nothing (and skips encoding thousands of entries)
            write_lock(lock_path, entries)
        store.memos.remember_lock(str(lock_path), signature(str(lock_path)), entries_digest(entries))


def _lock_holds(lock_path: Path, store: Store, digest: str) -> bool:
    """Whether the lock file is, byte for byte, one this store saw holding entries of `digest` (no need to read
    it)."""
    seen = signature(str(lock_path))  # type, size, mtime, ctime, inode: the same file, untouched
    return seen is not None and store.memos.remembered_lock(str(lock_path)) == [seen, digest]
