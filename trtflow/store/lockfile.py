"""trtflow.lock: what the last run resolved, per node: key, key components and output digests.

JSON, not YAML: at 1000 stages PyYAML takes a third of a second to read and write it, JSON a few ms,
and a no-op run reads it every time.

Commit it for release builds. It stores the actual parameter values, not just keys, so a frozen run
can say *what* changed. It holds no times: the same project always writes the same lock.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import ProjectError
from trtflow.hashing import stage_key
from trtflow.states import FAILED, SKIPPED, NodeState
from trtflow.store.records import StageRecord
from trtflow.util.fs import atomic_write

NODE_ID = re.compile(r"[a-z]+:[A-Za-z0-9._/:+-]{1,400}")
DIGEST = re.compile(r"[0-9a-f]{64}")
FINGERPRINT_TEXT = re.compile(r"[A-Za-z0-9._+!:/ -]{0,200}")
LOCK_FILE = "trtflow.lock"
LOCK_VERSION = 1
MAX_LOCK_BYTES = 64 << 20  # a lock of thousands of stages is a few MB
NOTE = (
    "Written by `trtflow run`: every stage's key, key components and output digests. Commit it; `trtflow run --frozen` "
    "fails if the plan no longer matches it."
)


@dataclass(frozen=True)
class LockEntry:
    """One node of trtflow.lock: its stage key, the components that key hashes, and its output digests; or the
    one-line reason it failed (a failure of the stage's own, recorded under its key), or why it was skipped.

        {"key": ..., "kind": "build", ..., "outputs": {"engine": ...}}       built (or cached)
        {"key": ..., "kind": "precision", ..., "outputs": {}, "failed": "int8: ModelOpt quantized no node ..."}
        {"skipped": "upstream precision:lstm/int8 failed or was skipped"}
    """

    key: str | None
    components: dict
    outputs: dict[str, str]
    canonical: dict[str, str] | None = None  # an engine's canonical digest (backends.engine_identity), if it has one
    failed: str | None = None
    skipped: str | None = None

    @property
    def built(self) -> bool:
        """Whether the node has outputs in the lock (neither failed nor skipped)."""
        return self.failed is None and self.skipped is None

    @property
    def status(self) -> str:
        """`built`, `failed: <reason>` or `skipped: <reason>`, as messages name it."""
        return (
            f"failed ({self.failed})"
            if self.failed is not None
            else f"skipped ({self.skipped})"
            if self.skipped is not None
            else "built"
        )

    def as_record(self) -> StageRecord:
        """The entry as the stage record it stands for: what a key made from its outputs (and canonical digests)
        reads."""
        return {
            "key": self.key or "",
            "outputs": self.outputs,
            "components": self.components,
            "record": {"canonical_sha256": self.canonical} if self.canonical else {},
        }

    def to_json(self) -> dict:
        """The node's entry in the lock file: the key, the components beside it, the outputs (and canonical digests)."""
        if self.skipped is not None:
            return {"skipped": self.skipped}
        extra: dict[str, object] = {"canonical": self.canonical} if self.canonical else {}
        extra.update({"failed": self.failed} if self.failed is not None else {})
        return {"key": self.key, **self.components, "outputs": self.outputs, **extra}

    @classmethod
    def from_json(cls, data: dict) -> LockEntry:
        """Read an entry written by to_json, checked as untrusted data: digests are sha256 digests, the key is the
        hash of the components beside it, fingerprints hold plain values (KeyError if a component is missing,
        ValueError or TypeError for the rest)."""
        if "skipped" in data:
            return cls(key=None, components={}, outputs={}, skipped=_text(data["skipped"]))
        components = {k: data[k] for k in ("kind", "version", "params", "fingerprint", "inputs")}
        key = _digest(data["key"], "key")
        if stage_key(components) != key:
            raise ValueError("its key is not the hash of its components (edited by hand?)")
        _plain_fingerprint(components["fingerprint"])
        return cls(
            key=key,
            components=components,
            outputs=_digests(data["outputs"], "outputs"),
            canonical=_digests(data["canonical"], "canonical") if data.get("canonical") is not None else None,
            failed=_text(data["failed"]) if "failed" in data else None,
        )


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a failure or skip reason must be text, not {type(value).__name__}")
    return value


def _digest(value: object, field: str) -> str:
    if not isinstance(value, str) or not DIGEST.fullmatch(value):
        raise ValueError(f"{field} {str(value)[:80]!r} is not a sha256 digest")
    return value


def _digests(value: object, field: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
        raise TypeError(f"{field} must map names to sha256 digests")
    return {name: _digest(digest, f"{field}.{name}") for name, digest in value.items()}


def _plain_fingerprint(fingerprint: object) -> None:
    """A fingerprint names tools and versions: short texts of letters, digits and `._+-!:/ ` (a GPU name has
    spaces), numbers, booleans, and lists and objects of those; nothing a terminal or pip would read as more than a
    value."""
    if not isinstance(fingerprint, dict):
        raise TypeError("fingerprint must be an object")
    for where, text in _texts(fingerprint, "fingerprint"):
        if not FINGERPRINT_TEXT.fullmatch(text):
            raise ValueError(f"{where[:60]} {text[:80]!r} is not a plain name or version")


def _texts(value: object, where: str) -> list[tuple[str, str]]:
    """(where, text) of every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, list):
        return [found for item in value for found in _texts(item, where)]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in [*_texts(k, where), *_texts(v, f"{where}.{k}")]]
    return []


def read_lock(path: Path) -> dict[str, LockEntry] | None:
    """The lock's entries by node id, or None if there is no lock file."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes()[:MAX_LOCK_BYTES])
        if data.get("version") != LOCK_VERSION:
            raise ProjectError(
                f"{path.name}: lock version {data.get('version')!r} is not {LOCK_VERSION}; run without --frozen to "
                "rewrite it"
            )
        nodes = data.get("nodes") or {}
    except (ValueError, AttributeError, RecursionError) as exc:
        raise ProjectError(
            f"{path.name}: unreadable lock file ({type(exc).__name__}: {exc}); delete it and run again"
        ) from exc
    if not isinstance(nodes, dict):
        raise ProjectError(f"{path.name}: unreadable lock file (nodes is not an object); delete it and run again")
    entries = {}
    for node, entry in nodes.items():
        try:
            if not NODE_ID.fullmatch(node):
                raise ValueError("not a stage id")
            entries[node] = LockEntry.from_json(entry)
        except (ValueError, AttributeError, KeyError, TypeError, RecursionError) as exc:
            raise ProjectError(
                f"{path.name}: entry {node[:120]!r} refused: {str(exc)[:200]}; restore it from "
                "version control, or delete the lock and run again"
            ) from exc
    return entries


def write_lock(path: Path, entries: dict[str, LockEntry]) -> None:
    """Write the lock atomically (temp file + rename), nodes sorted, so diffs stay readable."""
    body = {"note": NOTE, "version": LOCK_VERSION, "nodes": {node: entries[node].to_json() for node in sorted(entries)}}
    text = json.dumps(body, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    atomic_write(path, text)


def entries_digest(entries: dict[str, LockEntry]) -> str:
    """A digest of what a lock holds, cheap to compute: node ids, keys and outputs (components hash to the key)."""
    digest = hashlib.sha256()
    for node in sorted(entries):
        entry = entries[node]
        status = "" if entry.built else f"\0{entry.status}"
        canonical = sorted((entry.canonical or {}).items())
        digest.update(f"{node}\0{entry.key}\0{sorted(entry.outputs.items())}\0{canonical}{status}\n".encode())
    return digest.hexdigest()


def failure_entries(states: dict[str, NodeState], built: dict[str, LockEntry]) -> dict[str, LockEntry]:
    """Lock entries of the recorded failures of a run and of what was skipped below them (only below them: what an
    environment failure skipped keeps its old entry)."""
    entries: dict[str, LockEntry] = {}
    for node_id, state in states.items():
        if state.status == FAILED and state.recorded and node_id not in built:
            entries[node_id] = LockEntry(
                key=state.key, components=state.components or {}, outputs={}, failed=state.reason
            )
        elif state.status == SKIPPED and _below_recorded(state, states, entries):
            entries[node_id] = LockEntry(key=None, components={}, outputs={}, skipped=state.reason)
    return entries


def _below_recorded(state: NodeState, states: dict[str, NodeState], entries: dict[str, LockEntry]) -> bool:
    """Whether every upstream a skipped node lost has a failure or skip entry already (nodes come in DAG order)."""
    lost = [
        dep.node
        for dep in getattr(state.node, "deps", ())
        if states.get(dep.node) is not None and states[dep.node].status in (FAILED, SKIPPED)
    ]
    return bool(lost) and all(node_id in entries for node_id in lost)
