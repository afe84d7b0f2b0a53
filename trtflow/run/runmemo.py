"""The last no-op run, remembered by the signatures of everything it read, so the same no-op is answered at once.

Why: a no-op must stay close to Python's start-up at thousands of stages, and resolving every stage (parse each
recipe, hash each key, read each record) costs about 0.4 ms a stage. make and ninja decide by file times; this
does the same with more care. A run that found every stage cached (whole project, no --force, --frozen,
--check-repro or remote cache, no warning) writes `<project>/.trtflow/last-run.json`: the signature (type,
size, mtime, ctime, inode) of every file and folder it read or checked (pipeline.yaml, recipes, sources,
calibration data, the store's records and objects, the lock, package archives, folders and provenance, signing
keys, trtflow's own code), each glob it expanded with what it matched, the versions of the tools in the stage
keys, the interpreter and the TRTFLOW_* and pass-through environment (as a digest: a key may be there). The
next `trtflow run` recomputes that fingerprint before loading the project and, if it is the same, prints the
remembered summary. ctime cannot be set back, so a file replaced with its old mtime is still seen; anything
touched within 2 s before that run started is never trusted, and the memo is not written then.

Only reads are remembered; nothing here decides what to build. A miss (or an unreadable memo) is a normal run.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

from trtflow.states import CACHED, FAILED, SKIPPED, NodeState
from trtflow.util.reads import Reads

MEMO_DIR = ".trtflow"
MEMO_FILE = "last-run.json"
MEMO_MAX_BYTES = 256 << 20
RACY_NS = 2_000_000_000  # files touched this close to the run's start are not trusted (coarse file-system clocks)
FORMAT = 1


def expand(kind: str, pattern: str) -> list[str]:
    """A glob as the run expanded it, now."""
    if kind == "glob":
        return sorted(glob.glob(pattern, recursive=True))
    return sorted(str(p) for p in Path(pattern).rglob("*")) if os.path.isdir(pattern) else []


def signature(path: str) -> list[int] | None:
    """(type, size, mtime_ns, ctime_ns, inode) of a path, not following a symlink; None if it is not there."""
    try:
        seen = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return [seen.st_mode >> 12, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns, seen.st_ino]


def environment() -> str:
    """A digest of what the process brings: interpreter, trtflow's version and the environment variables trtflow
    reads."""
    from trtflow import __version__
    from trtflow.util.settings import PASSED_THROUGH

    names = sorted(n for n in os.environ if n.startswith("TRTFLOW_") or n in PASSED_THROUGH)
    text = json.dumps([sys.executable, sys.version, __version__, [[n, os.environ[n]] for n in names]])
    return hashlib.sha256(text.encode()).hexdigest()


def own_code() -> list[str]:
    """trtflow's own source files: an edited checkout is a different tool."""
    package = Path(__file__).resolve().parent
    return sorted(str(p) for p in package.rglob("*.py"))


def fingerprint(paths: list[str], globs: dict[str, list[str]], versions: dict[str, str | None]) -> str | None:
    """The digest of every signature, glob result and version as they are now; None if they cannot be trusted."""
    from trtflow.util.versions import installed_version

    now = time.time_ns()
    digest = hashlib.sha256(environment().encode())
    for path in paths:
        seen = signature(path)
        if seen is not None and now - max(seen[2], seen[3]) < RACY_NS:
            return None
        digest.update(f"{path}\0{seen}\n".encode())
    for name, matches in sorted(globs.items()):
        kind, pattern = name.split(":", 1)
        if expand(kind, pattern) != matches:
            return None
        digest.update(f"{name}\0{len(matches)}\n".encode())
    for distribution, version in sorted(versions.items()):
        if installed_version(distribution) != version:
            return None
        digest.update(f"{distribution}\0{version}\n".encode())
    return digest.hexdigest()


class RememberedNode(NamedTuple):
    """What a summary shows of a node the memo answered for."""

    id: str
    kind: str
    recipe: str


def remembered_state(entry: dict) -> NodeState:
    """A remembered `--json` node entry as the NodeState the summary prints: cached, a recorded failure found again
    (exit 1 as before), or skipped below one."""
    node = RememberedNode(entry["id"], entry["kind"], entry["recipe"])
    if entry.get("status") == FAILED:
        return NodeState(
            node, FAILED, str(entry.get("reason") or ""), key=entry["key"], exit_code=1, recorded=True, from_cache=True
        )
    if entry.get("status") == SKIPPED:
        return NodeState(node, SKIPPED, str(entry.get("reason") or ""))
    return NodeState(node, CACHED, key=entry["key"])


def memo_path(project_dir: Path) -> Path:
    """Where a project's memo lives."""
    return project_dir / MEMO_DIR / MEMO_FILE


def remembered_nodes(project_dir: Path) -> list[dict] | None:
    """The `--json` node entries of the last no-op, if nothing it read has changed since; None otherwise.

    A remembered no-op still removes the work folders of dead runs (runs_died_in), as any run does."""
    try:
        with open(memo_path(project_dir), "rb") as stream:
            memo = json.loads(stream.read(MEMO_MAX_BYTES))
        if memo.get("format") != FORMAT or not isinstance(memo.get("nodes"), list):
            return None
        if memo.get("project") != str(project_dir.resolve()):
            return None  # a copied or moved project: the memo names the files of the folder that wrote it
        now = fingerprint(memo["paths"], memo["globs"], memo["versions"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    nodes = memo["nodes"]
    if (
        now is None
        or now != memo.get("fingerprint")
        or not all(isinstance(n, dict) and _NODE_FIELDS <= n.keys() for n in nodes)
    ):
        return None
    if isinstance(memo.get("store"), str) and runs_died_in(Path(memo["store"])):
        from trtflow.store.locks import sweep_dead_runs_locked  # only then: the store's modules cost a no-op 10 ms

        sweep_dead_runs_locked(Path(memo["store"]))
    return nodes


def runs_died_in(store: Path) -> bool:
    """Whether the store's tmp/ holds a run's work folder at all (one listing; which are dead is for the store)."""
    try:
        with os.scandir(store / "tmp") as entries:
            return any(entry.name.startswith("run-") for entry in entries)
    except OSError:
        return False


_NODE_FIELDS = {"id", "kind", "recipe", "key"}


def remember(project_dir: Path, reads: Reads, nodes: list[dict], started_ns: int, store: Path | None = None) -> None:
    """Write the memo of a no-op run that started at `started_ns` (not when something it read was touched since
    shortly before then: the run may have read an older version). Never fails the run."""
    paths = sorted(reads.paths | set(own_code()))
    if any(seen is not None and max(seen[2], seen[3]) > started_ns - RACY_NS for seen in map(signature, paths)):
        forget(project_dir)
        return
    now = fingerprint(paths, reads.globs, reads.versions)
    if now is None:
        forget(project_dir)
        return
    memo = {
        "format": FORMAT,
        "fingerprint": now,
        "paths": paths,
        "globs": reads.globs,
        "versions": reads.versions,
        "nodes": nodes,
        "project": str(project_dir.resolve()),
        "store": str(store) if store is not None else None,
    }
    text = json.dumps(memo, sort_keys=True)
    path = memo_path(project_dir)
    with contextlib.suppress(OSError):
        if path.is_file() and path.read_text() == text:
            return  # the same no-op again: write nothing
        from trtflow.util.fs import atomic_write

        path.parent.mkdir(exist_ok=True)
        ignore = path.parent / ".gitignore"
        if not ignore.exists():
            atomic_write(ignore, "# written by trtflow: nothing here belongs in version control\n*\n")
        atomic_write(path, text)


def forget(project_dir: Path) -> None:
    """Drop the memo (a run that changed something, or could not be remembered)."""
    with contextlib.suppress(OSError):
        memo_path(project_dir).unlink()
