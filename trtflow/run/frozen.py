"""`run --frozen`: every node held to what trtflow.lock records, as the run settles it.

A node must resolve to the lock's key; its outputs must be the lock's bytes, or, for an engine, bytes with the lock's
canonical digest (only the backend's generated numbering differs: `equivalent`). What is made from an engine is keyed by
its canonical digest (plan.keyed_digest), so it keeps the lock's key; a package, which carries the engine's bytes, may
then differ from the lock's through that engine alone. A failure or skip exactly as the lock records it is expected
(the run may still pass); anything else says what the lock has instead.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trtflow.errors import ProjectError
from trtflow.run.dag import Dag, dag_node
from trtflow.run.plan import Resolution, Resolver, frozen_differences
from trtflow.states import FAILED, SKIPPED, NodeState
from trtflow.store.lockfile import LOCK_FILE, LockEntry, read_lock
from trtflow.store.records import StageRecord
from trtflow.store.store import Store
from trtflow.toolchain import check_installed

EQUIVALENT = (
    "equivalent to trtflow.lock: the engine differs only in the backend's generated numbering "
    "(canonical digest matches)"
)


IDENTICAL, EQUIVALENT_VERDICT, DIFFERENT = "identical", "equivalent", "different"  # as `--check-repro` says them


def canonical_outputs(record: StageRecord) -> dict[str, str] | None:
    """The canonical digests a stage recorded for its outputs (an engine's), or None."""
    return record["record"].get("canonical_sha256")


def _first_difference(outputs: dict[str, str], locked: dict[str, str]) -> str:
    """`model: sha256 1a2b... where the lock has 3c4d...` for the first output that differs."""
    for role in sorted(set(outputs) | set(locked)):
        if outputs.get(role) != locked.get(role):
            return f"{role}: sha256 {str(outputs.get(role))[:12]}... where the lock has {str(locked.get(role))[:12]}..."
    return "none"


class FrozenCheck:
    """The lock's entry per node (None: not a frozen run, every check passes) and what the run found against it."""

    def __init__(self, expected: dict[str, LockEntry] | None, store: Store):
        self.expected, self.store = expected, store
        self.equivalent: dict[str, dict] = {}  # nodes whose engine is equivalent to the lock's, not identical
        self.identical: set[str] = set()  # nodes whose outputs are the lock's, byte for byte
        self.different: set[str] = set()  # engines whose canonical digest differs from the lock's (or have none)

    def off_lock(self, resolution: Resolution) -> NodeState | None:
        """The failed state of a node whose key left the lock (an upstream made different bytes), else None."""
        if self.expected is None:
            return None
        entry = self.expected[resolution.node.id]
        if resolution.key == entry.key:  # an equivalent upstream engine keys its consumers by its canonical digest
            return None
        why = (
            f"trtflow.lock has it {entry.status}, but its upstreams built now"
            if entry.skipped is not None
            else "key differs from trtflow.lock: an upstream stage produced different bytes"
        )
        return NodeState(resolution.node, FAILED, why + ": refused under --frozen", key=resolution.key, exit_code=1)

    def verdict(self, state: NodeState, record: StageRecord) -> NodeState:
        """A finished node against the lock: as it was, equivalent (said in its state), held through its key, or
        failed."""
        entry = (self.expected or {}).get(state.node.id)
        if entry is not None and entry.failed is not None:
            return NodeState(
                state.node,
                FAILED,
                f"builds now, but trtflow.lock records it as failed ({entry.failed}): refused under --frozen",
                key=state.key,
                exit_code=1,
            )
        if entry is None or record["outputs"] == entry.outputs:
            if entry is not None:
                self.identical.add(state.node.id)
            return state
        if state.node.kind != "build":
            if any(d.node in self.equivalent for d in dag_node(state).deps):
                return state
            return NodeState(
                state.node,
                FAILED,
                f"output differs from trtflow.lock ({_first_difference(record['outputs'], entry.outputs)}): "
                "refused under --frozen; compare the toolchain with `trtflow toolchain`, or rebuild without --frozen "
                "and commit the new lock if the change is wanted",
                key=state.key,
                exit_code=1,
            )
        canonical = self._canonical_of(record)  # recomputed from the bytes: a record's own claim is not evidence
        if canonical and canonical == entry.canonical:
            self.equivalent[state.node.id] = entry.outputs
            return NodeState(
                state.node, state.status, EQUIVALENT, key=state.key, components=state.components, seconds=state.seconds
            )
        self.different.add(state.node.id)
        why = (
            "its canonical digest differs too"
            if canonical and entry.canonical
            else "it has no canonical form to compare"
        )
        return NodeState(
            state.node,
            FAILED,
            f"engine differs from trtflow.lock and {why}: not reproducible; `trtflow run --check-repro 2` shows "
            "whether this machine rebuilds it the same (docs/reproducibility.md)",
            key=state.key,
            exit_code=1,
        )

    def _canonical_of(self, record: StageRecord) -> dict[str, str] | None:
        """The canonical digests of the engines a build record names, computed from the store's objects."""
        from trtflow.backends.engine_identity import canonical_digest

        claimed = canonical_outputs(record) or {}
        digests = {
            role: canonical_digest(self.store.objects.path(record["outputs"][role]))
            for role in claimed
            if role in record["outputs"]
        }
        found = {role: digest for role, digest in digests.items() if digest}
        return found if digests and len(found) == len(digests) else None

    def engines(self, build_nodes: list[str]) -> dict[str, str]:
        """Each engine checked against the lock: `identical` (its bytes), `equivalent` (its canonical digest) or
        `different`; engines not built this run (a failure upstream) are left out."""
        verdicts = {IDENTICAL: self.identical, EQUIVALENT_VERDICT: set(self.equivalent), DIFFERENT: self.different}
        return {node: verdict for node in sorted(build_nodes) for verdict, nodes in verdicts.items() if node in nodes}

    def as_locked(self, state: NodeState) -> NodeState:
        """A failure or skip as trtflow.lock records it is expected (the run may still pass); a failure the lock does
        not record says what the lock has instead."""
        entry = (self.expected or {}).get(state.node.id)
        if entry is None:
            return state
        if state.status == SKIPPED or (state.recorded and entry.failed == state.reason and entry.key == state.key):
            return dataclasses.replace(
                state, expected=state.status == SKIPPED and entry.skipped is not None or state.status == FAILED
            )
        if state.status == FAILED and "trtflow.lock" not in state.reason:
            return dataclasses.replace(state, reason=f"{state.reason} (trtflow.lock has it {entry.status})")
        return state


def locked_entries(lock_path: Path, dag: Dag, resolver: Resolver, all_node_ids: set[str]) -> dict[str, LockEntry]:
    """The lock's entry per node of `dag`, after checking the plan matches it (ProjectError naming each change)."""
    lock = read_lock(lock_path)
    if lock is None:
        raise ProjectError(f"{LOCK_FILE}: not found; --frozen needs one: run `trtflow run` once and commit {LOCK_FILE}")
    check_installed({node.id: lock[node.id] for node in dag if node.id in lock})  # each tool named, not each stage
    changes = frozen_differences(dag, resolver, lock, all_node_ids)
    if changes:
        raise ProjectError(
            f"{LOCK_FILE}: the plan differs from the lock (--frozen):\n"
            + "\n".join(f"  {line}" for line in changes)
            + f"\nundo the change, or run `trtflow run` without --frozen to rebuild and rewrite {LOCK_FILE}, then "
            "commit it"
        )
    return {node.id: lock[node.id] for node in dag}
