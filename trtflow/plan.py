"""Planning: which nodes are cached, which are stale and why. Planning never writes anything.

A node's key can be computed once every input's digest is known: source files are hashed (through the
stat cache), upstream outputs come from the upstream's store record. A node whose upstream must run is
stale until that upstream has run; the runner re-resolves it then, and if the upstream's output came
out byte-identical the node is found cached after all (early cut-off).

Explaining compares a node's key components with the ones it had at its last run:

    >>> diff_components({"params": {"opt_level": 3}}, {"params": {"opt_level": 5}})
    ['params.opt_level: 3 -> 5']
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trtflow.dag import Dag, Node
from trtflow.errors import ProjectError
from trtflow.hashing import FileDigests, stage_key
from trtflow.stages.modelfile import MODEL, companions, external_data_locations
from trtflow.store import Store

# the fixed status vocabulary shown by plan, run and --json
CACHED, NEW, STALE, BUILT, FAILED, SKIPPED = "cached", "new", "stale", "built", "failed", "skipped"


@dataclass
class NodeState:
    node: Node
    status: str
    reason: str = ""
    key: Optional[str] = None
    components: Optional[dict] = None
    changes: list[str] = field(default_factory=list)
    seconds: Optional[float] = None
    detail: str = ""
    record: Optional[dict] = field(default=None, repr=False)  # the store record of a cached node

    @property
    def label(self) -> str:
        """`cached`, `new`, `stale: profile max changed`, `failed: ...`: what the user reads."""
        return f"{self.status}: {self.reason}" if self.reason else self.status

    def to_json(self) -> dict:
        return {"id": self.node.id, "kind": self.node.kind, "recipe": self.node.recipe, "status": self.status,
                "reason": self.reason or None, "key": self.key, "changes": self.changes, "seconds": self.seconds}


class Resolver:
    """Computes node keys from input digests and finds finished nodes in the store."""

    def __init__(self, store: Optional[Store], digests: FileDigests):
        self.store = store
        self.digests = digests

    def components(self, node: Node, finished: dict[str, dict]) -> Optional[dict]:
        """The key components of `node`, or None while an upstream has no record yet."""
        inputs: dict[str, str] = {}
        for role, path in node.sources:
            inputs.update(self.source_digests(node, role, path))
        for dep in node.deps:
            if dep.node not in finished:
                return None
            outputs = finished[dep.node]["outputs"]
            inputs[dep.role] = outputs[dep.output]
            for name, digest in companions(outputs, dep.output).items():  # a model's external data is part of it
                inputs[dep.role + name[len(dep.output):]] = digest
        return {"kind": node.kind, "version": node.version, "params": node.params, "fingerprint": node.fingerprint, "inputs": inputs}

    def source_digests(self, node: Node, role: str, path: Path) -> dict[str, str]:
        """A source file's digest; a source model's also one per external data file its graph names.

            {"model": <model.onnx>, "model.data:weights.bin": <weights.bin>}
        """
        if role != MODEL:
            return {role: self.digests.digest(path)}
        try:
            found = self.digests.digest_with_companions(path, external_data_locations)
        except (OSError, ValueError) as exc:
            raise ProjectError(f"{node.info.get('where', node.id)}: {_source_problem(exc, Path(path))}") from None
        return {(f"{role}.data:{name}" if name else role): digest for name, digest in found.items()}

    def cached_record(self, key: str) -> Optional[dict]:
        return self.store.stage_record(key) if self.store else None

    def last_run(self, node: Node) -> Optional[dict]:
        return self.store.last_run(node.id) if self.store else None

    def stale_state(self, node: Node, components: Optional[dict], force: bool, waiting_on: list[str]) -> NodeState:
        """Why a node that is not cached must run, in the fixed vocabulary."""
        key = stage_key(components) if components is not None else None
        last = self.last_run(node)
        if last is None:
            return NodeState(node, NEW, key=key, components=components)
        if force:
            return NodeState(node, STALE, "forced", key=key, components=components)
        changes = diff_components(last["components"], components or _known_parts(node))
        if not changes:
            changes = [f"upstream {', '.join(waiting_on)} will run first"] if waiting_on else ["output missing from the store"]
        reason = changes[0] + (f" (+{len(changes) - 1} more)" if len(changes) > 1 else "")
        return NodeState(node, STALE, reason, key=key, components=components, changes=changes)


def _source_problem(exc: Exception, model: Path) -> str:
    """What went wrong reading a source model or the weights files beside it, in the words modelcheck uses."""
    if not isinstance(exc, FileNotFoundError) or not exc.filename:
        return str(exc)
    if Path(exc.filename) == Path(os.path.abspath(model)):
        return f"model file not found: {model.name}"
    return f"external data file {os.path.relpath(exc.filename, model.parent)} not found beside {model.name}"


def plan(dag: Dag, resolver: Resolver, force: bool = False) -> dict[str, NodeState]:
    """The state of every node as of now, resolving keys as far as cached upstreams allow."""
    finished: dict[str, dict] = {}
    states: dict[str, NodeState] = {}
    for node in dag:
        components = resolver.components(node, finished)
        key = stage_key(components) if components is not None else None
        record = resolver.cached_record(key) if key and not force else None
        if record is not None:
            finished[node.id] = record
            states[node.id] = NodeState(node, CACHED, key=key, components=components, record=record)
        else:
            waiting_on = [dep.node for dep in node.deps if dep.node not in finished]
            states[node.id] = resolver.stale_state(node, components, force, waiting_on)
    return states


def _known_parts(node: Node) -> dict:
    """Key components known before the inputs are (for explaining a node whose upstream must run)."""
    return {"kind": node.kind, "version": node.version, "params": node.params, "fingerprint": node.fingerprint}


def diff_components(old: dict, new: dict) -> list[str]:
    """Human lines naming each leaf that differs, e.g. `fingerprint.backend_version: 1.7.1 -> 1.8.0`."""
    before, after = _flatten(old), _flatten(new)
    lines = []
    for path in sorted(set(before) | set(after), key=_component_order):
        if path.startswith("inputs.") and path not in after:
            continue  # not resolved yet: said separately
        if before.get(path, "<none>") != after.get(path, "<none>"):
            lines.append(_describe(path, before.get(path, "<none>"), after.get(path, "<none>")))
    return lines


def _component_order(path: str) -> tuple:
    rank = {"version": 0, "fingerprint": 1, "params": 2, "inputs": 3}
    return (rank.get(path.split(".")[0].split("[")[0], 9), path)


def _describe(path: str, old: Any, new: Any) -> str:
    if path == "version":
        return f"stage code version {old} -> {new}"
    if path.startswith("inputs."):
        role = path.removeprefix("inputs.")
        return f"input {role} changed ({_short(old)} -> {_short(new)})"
    return f"{path.split('.', 1)[-1]}: {_show(old)} -> {_show(new)}"


def _short(digest: Any) -> str:
    return digest[:12] if isinstance(digest, str) else str(digest)


def _show(value: Any) -> str:
    return "null" if value is None else str(value).replace(" ", "")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves by dotted path; a list of scalars (a shape) stays one leaf so it reads as [1,3,224,224]."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def frozen_differences(dag: Dag, resolver: Resolver, lock: dict, all_node_ids: set[str]) -> list[str]:
    """Every way the plan differs from the lock, one line each; empty when they agree.

    Upstream outputs are taken from the lock, so this works on an empty store, before anything runs.
    """
    locked = {node_id: {"outputs": entry.outputs} for node_id, entry in lock.items()}
    lines = []
    for node in dag:
        entry = lock.get(node.id)
        components = resolver.components(node, locked) if entry else None
        if entry is None:
            lines.append(f"{node.id}: not in the lock (a new stage)")
        elif components is None:
            lines.append(f"{node.id}: an upstream stage is missing from the lock")
        elif stage_key(components) != entry.key:
            lines.extend(f"{node.id}: {change}" for change in diff_components(entry.components, components) or ["key differs"])
    recipes = {node.recipe for node in dag}
    gone = [node_id for node_id in lock if node_id not in all_node_ids and _recipe_of(node_id) in recipes | {None}]
    return lines + [f"{node_id}: in the lock but no longer in the project" for node_id in sorted(gone)]


def _recipe_of(node_id: str) -> Optional[str]:
    """`build:tiny/fp32/rtx-ada` -> `tiny`."""
    return node_id.split(":", 1)[1].split("/", 1)[0] if ":" in node_id else None
