"""The store's and the toolchain's commands below the CLI: cache ls, verify and gc; toolchain and doctor.

Each returns a plain value the CLI prints (and `--json` dumps); none prints.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow import __version__


@dataclass(frozen=True)
class StoreAnswer:
    """What a cache command found: its report (None: the project has no store yet), where the store is, and what the
    store did on its own meanwhile (a malformed record set aside)."""

    store: Path
    report: dict | None
    notes: tuple[str, ...] = ()


def cache_usage(project_dir: Path) -> StoreAnswer:
    """Records and bytes per recipe and stage, how many trtflow.lock uses, and the store's totals."""
    from trtflow.store import housekeeping

    return _on_store(
        project_dir, lambda project, store: housekeeping.usage(store, housekeeping.lock_keys(project.root))
    )


def cache_verify(project_dir: Path) -> StoreAnswer:
    """Every object re-hashed and every record checked; bad ones moved aside (the next run rebuilds them)."""
    from trtflow.store import housekeeping

    return _on_store(project_dir, lambda project, store: housekeeping.verify(store))


def cache_gc(project_dir: Path, keep_last: int, delete: bool) -> StoreAnswer:
    """What trtflow.lock, the current packages and the last `keep_last` runs do not use: listed, or deleted (with what
    killed runs left beside the packages) if `delete`."""
    from trtflow.store import housekeeping

    def sweep(project: Any, store: Any) -> dict:
        keep = housekeeping.live_keys(store, project.root, project.packages_dir, keep_last)
        if not delete:
            return {**housekeeping.garbage(store, keep), "dry_run": True}
        report = housekeeping.collect_garbage(store, keep)
        report["leftovers"] = [
            str(p) for p in housekeeping.sweep_leftovers(store, project.packages_dir, project.root, runs_died=True)
        ]
        return {**report, "dry_run": False}

    return _on_store(project_dir, sweep)


def _on_store(project_dir: Path, work: Callable[[Any, Any], dict]) -> StoreAnswer:
    """`work(project, store)` on the project's store, closed afterwards; no report if nothing has run yet."""
    from trtflow.recipe import load_project
    from trtflow.store import Store

    project = load_project(project_dir)
    store = Store.existing(project.store_dir)
    if store is None:
        return StoreAnswer(project.store_dir, None)
    try:
        report = work(project, store)
        return StoreAnswer(project.store_dir, report, tuple(store.take_notes()))
    finally:
        store.close()


def toolchain_requirements(project_dir: Path) -> str:
    """The exact tool versions trtflow.lock's stage keys name, as a pip requirements file."""
    from trtflow.toolchain import read_tools, requirements

    return requirements(read_tools(project_dir.resolve()))


def doctor(project_dir: Path) -> dict:
    """The installed tools held to the ones trtflow.lock was made with: {trtflow, python, tools: [rows], ok, hint}."""
    from trtflow.toolchain import INSTALL_HINT, read_tools

    tools = read_tools(project_dir.resolve())
    rows = [{"tool": t.name, "locked": t.version, "installed": t.installed(), "stages": len(t.named_by)} for t in tools]
    ok = all(row["installed"] == row["locked"] for row in rows)
    return {
        "trtflow": __version__,
        "python": sys.version.split()[0],
        "tools": rows,
        "ok": ok,
        "hint": None if ok else INSTALL_HINT,
    }
