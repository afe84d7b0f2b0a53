"""Planning: which nodes are cached, which are stale and why. Planning never writes anything.

Every question about a node goes through one memoized `Resolution` (its key components, key, cached record,
explanation), keyed by the node and the digests of its inputs: `plan`, the `--frozen` check and the runner
ask the same resolver, so nothing is computed twice for the same inputs. A node's key can be computed once
every input's digest is known: source files are hashed (through the stat cache), upstream outputs come from
the upstream's store record. A node whose upstream must run is stale until that upstream has run; the
runner resolves it again then, and if the upstream's output came out byte-identical the node is found
cached after all (early cut-off).

Explaining compares a node's key components with the ones it had at its last run:

    >>> diff_components({"params": {"opt_level": 3}}, {"params": {"opt_level": 5}})
    ['params.opt_level: 3 -> 5']
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.errors import ProjectError, required
from trtflow.hashing import FileDigests, stage_key
from trtflow.run.dag import Dag, Node
from trtflow.stages import stage
from trtflow.stages.base import NodeId
from trtflow.stages.modelfile import MODEL, companions, external_data_locations
from trtflow.states import CACHED, FAILED, NEW, SKIPPED, STALE, NodeState, recorded_failure
from trtflow.store.lockfile import LockEntry
from trtflow.store.records import StageRecord
from trtflow.store.store import Store

CANONICAL_PREFIX = "canonical:"


@dataclass
class Resolution:
    """What one node resolves to, given its upstream outputs: components and key (None while an upstream has
    no output yet), the cached record for that key, and why it must run if it is not cached."""

    node: Node
    components: dict | None
    key: str | None
    record: StageRecord | None
    waiting_on: tuple[str, ...]
    force: bool
    resolver: Resolver = field(repr=False)
    missing: dict[str, str] = field(default_factory=dict)  # upstream node id -> why it has no output

    @functools.cached_property
    def state(self) -> NodeState:
        """`cached`, or `new` / `stale: <first change>` with every change listed, computed once."""
        failure = recorded_failure(self.record)
        if failure is not None:
            return NodeState(
                self.node,
                FAILED,
                failure_shown(self.node, failure),
                key=self.key,
                components=self.components,
                record=self.record,
                exit_code=1,
                recorded=True,
                from_cache=True,
            )
        if self.record is not None:
            return NodeState(self.node, CACHED, key=self.key, components=self.components, record=self.record)
        return self.resolver.stale_state(self)

    @property
    def output(self) -> StageRecord | None:
        """The record of the node's outputs when it is cached with some (not a recorded failure), else None."""
        return self.record if self.record is not None and recorded_failure(self.record) is None else None

    def lock_differences(self, locked_key: str | None, locked_components: dict) -> list[str]:
        """How this resolution differs from a lock entry, one line each; empty when the keys agree."""
        if self.key == locked_key:
            return []
        pending = frozenset() if self.components else frozenset(dep.role for dep in self.node.deps)
        changes = diff_components(locked_components, self.components or self.node.known_parts, pending)
        return changes or ["key differs"]


class Resolver:
    """Resolves nodes against the store: keys from input digests, cached records, explanations (memoized)."""

    def __init__(self, store: Store | None, digests: FileDigests, retry_failed: bool = False):
        self.store = store
        self.digests = digests
        self.retry_failed = retry_failed  # a recorded failure counts as no record: the stage runs again
        self._memo: dict[tuple, Resolution] = {}
        # node -> (identities of the upstream records it was resolved from, its Resolution): a run finishing a node
        # with the records planning found resolves it without re-hashing its sources. The records stay referenced
        # by the memo, so their identities are not reused.
        self._same_upstream: dict[tuple, tuple[tuple, Resolution]] = {}
        self._last_runs: dict[str, dict | None] = {}

    def resolve(
        self, node: Node, finished: dict[str, StageRecord], force: bool = False, missing: dict[str, str] | None = None
    ) -> Resolution:
        """The node's Resolution given the finished upstream records (`finished[node id]["outputs"]`).

        `missing`: upstream node id -> why it has no output, for a stage that runs without some inputs (a
        package of the engines that built); the reason stands in the key where the digest would.
        """
        upstream = tuple(id(finished.get(dep.node)) for dep in node.deps)  # the very records: the run reuses the plan's
        same = self._same_upstream.get((node.id, force))
        if not missing and same is not None and same[0] == upstream:
            return same[1]
        inputs = self.inputs(node, finished, missing or {})
        memo_key = (node.id, force, tuple(sorted(inputs.items())) if inputs is not None else None)
        found = self._memo.get(memo_key)
        if found is None:
            components = {**node.known_parts, "inputs": inputs} if inputs is not None else None
            key = stage_key(components) if components is not None else None
            record = self.store.records.get(key, components) if key and self.store and not force else None
            record = None if self.retry_failed and recorded_failure(record) is not None else record
            # one upstream, several roles: once
            waiting = tuple(dict.fromkeys(dep.node for dep in node.deps if dep.node not in finished))
            found = self._memo[memo_key] = Resolution(
                node, components, key, record, waiting, force, self, dict(missing or {})
            )
        if not missing:
            self._same_upstream[(node.id, force)] = (upstream, found)
        return found

    def forget(self, node_id: str) -> None:
        """Drop what is remembered about a node (its cached output turned out corrupt: it must be looked up again)."""
        self._memo = {k: v for k, v in self._memo.items() if k[0] != node_id}
        self._same_upstream = {k: v for k, v in self._same_upstream.items() if k[0] != node_id}

    def inputs(self, node: Node, finished: dict[str, StageRecord], missing: dict[str, str]) -> dict[str, str] | None:
        """Input role -> digest (`missing: <reason>` for a missing one), or None while an upstream has no record yet."""
        inputs: dict[str, str] = {}
        for role, path in node.sources:
            inputs.update(self.source_digests(node, role, path))
        for dep in node.deps:
            if dep.node in missing:
                inputs[dep.role] = f"missing: {missing[dep.node]}"
                continue
            if dep.node not in finished:
                return None
            outputs = finished[dep.node]["outputs"]
            inputs[dep.role] = keyed_digest(finished[dep.node], dep.output)
            for name, digest in companions(outputs, dep.output).items():  # a model's external data is part of it
                inputs[dep.role + name[len(dep.output) :]] = digest
        return inputs

    def source_digests(self, node: Node, role: str, path: Path) -> dict[str, str]:
        """A source file's digest; a source model's also one per external data file its graph names.

        {"model": <model.onnx>, "model.data:weights.bin": <weights.bin>}
        """
        if role != MODEL:
            return {role: self.digests.digest(path)}
        try:
            found = self.digests.digest_with_companions(path, external_data_locations)
        except (OSError, ValueError) as exc:
            raise ProjectError(f"{node.info.where or node.id}: {_source_problem(exc, Path(path))}") from exc
        return {(f"{role}.data:{name}" if name else role): digest for name, digest in found.items()}

    def last_run(self, node: Node) -> dict | None:
        """The key components the node had when it last finished (for explanations), remembered per node."""
        if node.id not in self._last_runs:
            self._last_runs[node.id] = self.store.memos.last_run(node.id) if self.store else None
        return self._last_runs[node.id]

    def stale_state(self, resolution: Resolution) -> NodeState:
        """Why a node that is not cached must run, in the fixed vocabulary."""
        node, key, components = resolution.node, resolution.key, resolution.components
        last = self.last_run(node)
        if last is None:
            return NodeState(node, NEW, key=key, components=components)
        if resolution.force:
            return NodeState(node, STALE, "forced", key=key, components=components)
        pending = frozenset() if components else frozenset(dep.role for dep in node.deps)
        changes = diff_components(last["components"], components or node.known_parts, pending)
        if not changes:
            waiting_on = resolution.waiting_on
            changes = (
                [f"upstream {', '.join(waiting_on)} will run first"]
                if waiting_on
                else ["output missing from the store"]
            )
        reason = changes[0] + (f" (+{len(changes) - 1} more)" if len(changes) > 1 else "")
        return NodeState(node, STALE, reason, key=key, components=components, changes=changes)


def _source_problem(exc: Exception, model: Path) -> str:
    """What went wrong reading a source model or the weights files beside it, in the words modelcheck uses."""
    if not isinstance(exc, FileNotFoundError) or not exc.filename:
        return str(exc)
    if Path(exc.filename) == Path(os.path.abspath(model)):
        return f"model file not found: {model.name}"
    return f"external data file {os.path.relpath(exc.filename, model.parent)} not found beside {model.name}"


def failure_shown(node: Node, reason: str) -> str:
    """A stage's failure as the user reads it: with what its stage knows to add about the node (an exclude hint)."""
    hint = stage(node.kind).failure_hint
    return hint(node, reason) if hint is not None else reason


def upstream_outcome(node: Node, ended: dict[str, str]) -> tuple[str | None, str | None, dict[str, str]]:
    """What the upstreams that ended without output mean for a node: (why it is skipped, the root failure behind
    that), or (None, None, {upstream id: root failure}) for the inputs it goes on without (a package of the engines
    that built). `ended`: node id -> `<id of the failed node>: <its reason>` of every node that ended without output.

        >>> upstream_outcome(package_node, {"build:m/fp32/t": "build:m/fp32/t: FP32 GEMM is not supported"})
        (None, None, {"build:m/fp32/t": "build:m/fp32/t: FP32 GEMM is not supported"})
    """
    failed = [dep for dep in node.deps if dep.node in ended]
    if not failed:
        return None, None, {}
    roles = stage(node.kind).required_roles
    blocking = [dep.node for dep in failed if roles is None or dep.role in roles]
    if blocking or roles is None:  # (every role required: `failed` blocks)
        return f"upstream {blocking[0]} failed or was skipped", ended[blocking[0]], {}
    optional = [dep for dep in node.deps if dep.role not in roles]
    if all(dep.node in ended for dep in optional):
        return f"every upstream it could use failed (first: {failed[0].node})", ended[failed[0].node], {}
    return None, None, {dep.node: ended[dep.node] for dep in failed}


def plan(dag: Dag, resolver: Resolver, force: bool = False) -> dict[str, NodeState]:
    """The state of every node as of now, resolving keys as far as cached upstreams allow; below a recorded
    failure, what the run would skip is shown skipped."""
    finished: dict[str, StageRecord] = {}
    ended: dict[str, str] = {}
    states: dict[str, NodeState] = {}
    for node in dag:
        skip, root, missing = upstream_outcome(node, ended)
        if skip is not None:
            states[node.id] = NodeState(node, SKIPPED, skip)
            ended[node.id] = required(root, f"{node.id}: the failure it is skipped below")
            continue
        resolution = resolver.resolve(node, finished, force, missing)
        states[node.id] = resolution.state
        if resolution.output is not None:
            finished[node.id] = resolution.output
        elif resolution.state.status == FAILED:
            ended[node.id] = f"{node.id}: {resolution.state.reason}"
    return states


def kinds_to_run(planned: dict[str, NodeState]) -> set[str]:
    """The stage kinds of the nodes a plan still has to run (what workers to start)."""
    return {state.node.kind for state in planned.values() if not state.settled}


def imports_to_run(dag: Dag, planned: dict[str, NodeState]) -> dict[str, set[str]]:
    """Per stage kind, the modules the nodes a plan still has to run import beyond the kind's own (ModelOpt for a
    reduced precision): what their workers may import ahead."""
    found: dict[str, set[str]] = {}
    for node_id, state in planned.items():
        imports = stage(state.node.kind).imports if not state.settled else None
        if imports is not None:
            found.setdefault(state.node.kind, set()).update(imports(dag.nodes[node_id].params))
    return found


def diff_components(old: dict, new: dict, pending: frozenset[str] = frozenset()) -> list[str]:
    """Human lines naming each leaf that differs, e.g. `fingerprint.backend_version: 1.7.1 -> 1.8.0`; `pending`: the
    input roles not resolved yet (upstream nodes that will run: said separately), not reported as removed."""
    before, after = _flatten(old), _flatten(new)
    lines = []
    for path in sorted(set(before) | set(after), key=_component_order):
        if path.startswith("inputs.") and path not in after and path.removeprefix("inputs.") in pending:
            continue
        if before.get(path, ABSENT) != after.get(path, ABSENT):
            lines.append(_describe(path, before.get(path, ABSENT), after.get(path, ABSENT)))
    return lines


def keyed_digest(record: StageRecord, output: str) -> str:
    """What an upstream output contributes to a key: its sha256, or for an engine with a canonical digest
    (backends.engine_identity) `canonical:<digest>`, so an engine rebuilt equivalent (only the backend's generated
    numbering differs) re-keys nothing made from it: verify and package keep their keys, and `--frozen` holds them to
    the lock through it."""
    canonical = ((record.get("record") or {}).get("canonical_sha256") or {}).get(output)
    return f"{CANONICAL_PREFIX}{canonical}" if canonical else record["outputs"][output]


ABSENT = "default"  # a setting at its default is not in a key (StageParams.key_parts): shown as `default -> 5`


def _component_order(path: str) -> tuple:
    rank = {"version": 0, "fingerprint": 1, "params": 2, "inputs": 3}
    return (rank.get(path.split(".")[0].split("[")[0], 9), path)


def _describe(path: str, old: Any, new: Any) -> str:
    if path == "version":
        return f"stage code version {old} -> {new}"
    if path.startswith("inputs."):
        role = path.removeprefix("inputs.")
        if old is ABSENT or new is ABSENT:
            return f"input {role} {'added' if old is ABSENT else 'removed'}"
        return f"input {role} changed ({_short(old)} -> {_short(new)})"
    return f"{path.split('.', 1)[-1]}: {_show(old)} -> {_show(new)}"


def _short(digest: Any) -> str:
    """A digest's first 12 digits (`canonical:` kept); a missing input's reason (`missing: <failed node>: <why>`) up to
    100 characters."""
    if isinstance(digest, str) and digest.startswith("missing: "):
        return digest[:100] + ("..." if len(digest) > 100 else "")
    if isinstance(digest, str) and digest.startswith(CANONICAL_PREFIX):
        return CANONICAL_PREFIX + digest[len(CANONICAL_PREFIX) :][:12]
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


def frozen_differences(dag: Dag, resolver: Resolver, lock: dict[str, LockEntry], all_node_ids: set[str]) -> list[str]:
    """Every way the plan differs from the lock, one line each; empty when they agree.

    Upstream outputs are taken from the lock, so this works on an empty store, before anything runs. A stage the lock
    records as failed must still have its key (it is expected to fail again, the same way); one it records as skipped
    must still be below a failure of the lock.
    """
    locked = {node_id: entry.as_record() for node_id, entry in lock.items() if entry.built}
    ended = {node_id: f"{node_id}: {entry.failed}" for node_id, entry in lock.items() if entry.failed is not None}
    lines = []
    for node in dag:
        entry = lock.get(node.id)
        if entry is None:
            lines.append(f"{node.id}: not in the lock (a new stage)")
            continue
        skip, root, missing = upstream_outcome(node, ended)
        if skip is not None or entry.skipped is not None:
            lines += (
                []
                if skip is not None and entry.skipped is not None
                else [f"{node.id}: {_skip_difference(entry, skip)}"]
            )
            ended[node.id] = root or f"{node.id}: skipped"
            continue
        resolution = resolver.resolve(node, locked, missing=missing)
        if resolution.components is None:
            lines.append(f"{node.id}: an upstream stage is missing from the lock")
        else:
            lines.extend(f"{node.id}: {change}" for change in resolution.lock_differences(entry.key, entry.components))
    recipes = {node.recipe for node in dag}
    gone = [node_id for node_id in lock if node_id not in all_node_ids and NodeId(node_id).recipe in recipes | {None}]
    return lines + [f"{node_id}: in the lock but no longer in the project" for node_id in sorted(gone)]


def _skip_difference(entry: LockEntry, skip: str | None) -> str:
    """Why a node's skip in the lock and in the plan disagree."""
    if skip is None:
        return f"trtflow.lock has it skipped ({entry.skipped}), but its upstreams no longer fail there"
    return f"would be skipped ({skip}), but trtflow.lock has it {'failed' if entry.failed else 'built'}"
