"""Execute a DAG: skip cached nodes, run stale ones in worker processes, move outputs into the store.

Stages run in separate processes: TensorRT-RTX builds are single-threaded and hold the GIL, so
processes are what lets `-j 2` use both cores, and a crash inside a native library fails one node
instead of the whole run. A failed node skips its downstream nodes only; unrelated recipes go on.

Runs that share a store build each stage key once: a node that must run first takes its key's lock
(without blocking the dispatcher: a busy key is polled), then looks again, and uses the record another
run (or the remote cache) made meanwhile. The lock is released once the record is written.
"""

from __future__ import annotations

import concurrent.futures as futures
import errno
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from trtflow.archive import extract_tar, replace_dir_atomically
from trtflow.dag import Dag, Node
from trtflow.hashing import stage_key
from trtflow.lockfile import LockEntry
from trtflow.plan import BUILT, CACHED, FAILED, SKIPPED, NodeState, Resolver
from trtflow.stages import Upstream, execute
from trtflow.stages.modelfile import companions, place_side_by_side
from trtflow.store import Store, write_failure
from trtflow.storelock import KeyLocks, holding

if TYPE_CHECKING:
    from trtflow.remote import Remote

# ("start" | "done" | "wait", NodeState), or ("warning", message): a remote that is down, a corrupt object
Listener = Callable[[str, Any], None]
LOCK_POLL_SECONDS = 0.05  # how often a key another run is building is looked at again
PULLED = "pulled from the remote cache"  # the reason of a cached node the remote supplied
# A stage that fails with one of these could not write its output: the store is full, not the stage wrong.
STORE_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)


@dataclass(frozen=True)
class RunOptions:
    jobs: int = 1
    force: bool = False
    frozen: bool = False
    remote_required: bool = False


@dataclass
class _Running:
    node: Node
    key: str
    components: dict
    workdir: Path
    started: float


class Runner:
    """Runs one DAG against one store; `run()` returns the final state of every node."""

    def __init__(self, dag: Dag, store: Store, resolver: Resolver, packages_dir: Path, options: RunOptions,
                 listener: Optional[Listener] = None, expected_keys: Optional[dict[str, LockEntry]] = None,
                 planned: Optional[dict[str, NodeState]] = None, remote: Optional["Remote"] = None,
                 workroot: Optional[Path] = None):
        self.dag, self.store, self.resolver = dag, store, resolver
        self.expected_keys = expected_keys  # --frozen: every node must resolve to the key the lock holds
        self.planned = planned or {}  # cached nodes found by planning are not looked up twice
        self.packages_dir = packages_dir
        self.options = options
        self.listener = listener or (lambda event, state: None)
        self.finished: dict[str, dict] = {}
        self.states: dict[str, NodeState] = {}
        self._pool: Optional[futures.ProcessPoolExecutor] = None
        self.remote = remote
        self.workroot = workroot or store.tmp  # the run lease's tmp dir: swept if this process dies
        self.keys = KeyLocks(store.locks)
        self.run_id = f"{os.getpid()}-{time.time_ns()}"
        self.warnings: list[str] = []
        self._built_here: dict[str, dict] = {}  # key -> record built by this run (two nodes, one key)
        self._reopened: list[Node] = []  # finished nodes whose output turned out corrupt: to run again
        self._lock_waits = 0
        self._waited: set[str] = set()
        self._reported = 0

    def run(self) -> dict[str, NodeState]:
        waiting = list(self.dag)
        running: dict[futures.Future, _Running] = {}
        try:
            while waiting or running:
                waiting = self._dispatch(waiting, running)
                self._report()
                if running:
                    poll = LOCK_POLL_SECONDS if self._lock_waits else None
                    done, _ = futures.wait(running, timeout=poll, return_when=futures.FIRST_COMPLETED)
                    for future in done:
                        self._collect(running.pop(future), future)
                elif self._lock_waits:
                    time.sleep(LOCK_POLL_SECONDS)
            if self.remote is not None:
                self.remote.finish()
        finally:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
            self.keys.release_all()
            if self.remote is not None:
                self.remote.close()
        self._report()
        return {node.id: self.states[node.id] for node in self.dag}

    def _dispatch(self, waiting: list[Node], running: dict) -> list[Node]:
        """Settle every node whose upstreams are done: skip, find cached, or start (up to -j)."""
        still: list[Node] = []
        self._lock_waits = 0
        for node in waiting:
            blocked = [d.node for d in node.deps if self.states.get(d.node) and self.states[d.node].status in (FAILED, SKIPPED)]
            if blocked:
                self._settle(NodeState(node, SKIPPED, f"upstream {blocked[0]} failed or was skipped"))
            elif any(d.node not in self.finished for d in node.deps) or len(running) >= self.options.jobs:
                still.append(node)
            elif not self._off_lock(node) and not self._use_planned(node) and not self._resolve(node, running):
                still.append(node)
        still.extend(self._reopened)
        self._reopened = []
        return still

    def _off_lock(self, node: Node) -> bool:
        """Under --frozen, fail a node whose key left the lock (an upstream built different bytes)."""
        if self.expected_keys is None:
            return False
        key = stage_key(self.resolver.components(node, self.finished))
        locked = self.expected_keys[node.id].key
        if key == locked or self._locked_key_through_unreproducible(node) == locked:
            return False
        self._settle(NodeState(node, FAILED, "key differs from trtflow.lock: an upstream stage produced different bytes", key=key))
        return True

    def _locked_key_through_unreproducible(self, node: Node) -> Optional[str]:
        """The node's key with the lock's outputs standing in for upstream builds whose bytes are not reproducible.

        TensorRT-RTX 1.7 names int8/fp8 kernels after memory addresses, so those engines differ from build to
        build even from identical inputs (measured). The build itself must still match the lock; what consumes
        its engine may differ from the lock through that engine alone.
        """
        unreproducible = [d.node for d in node.deps if not self.dag.nodes[d.node].info.get("bit_reproducible", True)]
        if not unreproducible:
            return None
        standing_in = {**self.finished, **{n: {"outputs": self.expected_keys[n].outputs} for n in unreproducible}}
        return stage_key(self.resolver.components(node, standing_in))

    def _use_planned(self, node: Node) -> bool:
        """A node planning found cached is finished without resolving it again."""
        planned = self.planned.get(node.id)
        if planned is None or planned.status != CACHED or self.options.force:
            return False
        self._finish(NodeState(node, CACHED, key=planned.key, components=planned.components), planned.record)
        return True

    def _resolve(self, node: Node, running: dict) -> bool:
        """Key the node once its upstreams are done: use a cached record, or claim and start it; False: wait."""
        components = self.resolver.components(node, self.finished)
        key = stage_key(components)
        record = None if self.options.force else self.resolver.cached_record(key)
        if record is not None:
            self._finish(NodeState(node, CACHED, key=key, components=components), record)
            return True
        return self._claim(node, components, key, running)

    def _claim(self, node: Node, components: dict, key: str, running: dict) -> bool:
        """Start `node` holding its key's lock, or use what was made meanwhile; False: wait (key busy, input corrupt)."""
        if not self.keys.claim(key):
            self._lock_waits += 1
            if node.id not in self._waited:
                self._waited.add(node.id)
                self.listener("wait", NodeState(node, "waiting", "another run is building the same stage", key=key))
            return False
        record, reason = self._made_meanwhile(node, key)
        if record is None and node.kind == "package" and self._reopen_corrupt_inputs(node):
            self.keys.release(key)
            return False
        if record is not None:
            self.keys.release(key)
            self._finish(NodeState(node, CACHED, reason, key=key, components=components), record)
            return True
        future, job = self._start(node, components)
        running[future] = job
        return True

    def _made_meanwhile(self, node: Node, key: str) -> tuple[Optional[dict], str]:
        """With the key's lock held: the record this run, another run or the remote cache has for it."""
        if key in self._built_here:
            return self._built_here[key], "same stage as another node of this run"
        if self.options.force:
            return None, ""
        record = self.store.stage_record(key)
        if record is not None:
            return record, "built by another run meanwhile"
        if self.remote is not None:
            record = self.remote.pull(key, node.id, self.store, self.workroot)
        return record, PULLED

    def _reopen_corrupt_inputs(self, node: Node) -> bool:
        """Re-hash what a package is about to ship; a corrupt object is quarantined and its producer runs again."""
        bad = [dep.node for dep in node.deps if not all(self.store.verify_object(d) for d in self.finished[dep.node]["outputs"].values())]
        for producer in dict.fromkeys(bad):
            for node_id in [producer, *self.dag.downstream(producer)]:
                if self.finished.pop(node_id, None) is not None:
                    self.states.pop(node_id, None)
                    self.planned.pop(node_id, None)
                    self._reopened.append(self.dag.nodes[node_id])
        return bool(bad)

    def _report(self) -> None:
        """Pass on, once each, the objects the store quarantined and the remote cache's warnings."""
        messages = [f"object {digest} was corrupt (its bytes no longer match its name): moved to {self.store.corrupt}; "
                    "what needs it is rebuilt" for digest in self.store.quarantined[self._reported:]]
        self._reported = len(self.store.quarantined)
        messages += self.remote.take_warnings() if self.remote is not None else []
        for message in messages:
            self.warnings.append(message)
            self.listener("warning", message)

    def _start(self, node: Node, components: dict) -> tuple[futures.Future, _Running]:
        state = self.resolver.stale_state(node, components, self.options.force, [])
        self.listener("start", state)
        workdir = Path(tempfile.mkdtemp(dir=self.workroot, prefix=node.id.replace(":", "-").replace("/", "_") + "-"))
        params = {**node.params, **node.fingerprint}
        future = self._executor().submit(execute, node.kind, params, self._inputs(node, components, workdir), workdir)
        return future, _Running(node, state.key, components, workdir, time.perf_counter())

    def _inputs(self, node: Node, components: dict, workdir: Path) -> dict[str, Upstream]:
        inputs = {role: Upstream(files={role: path}, sha256=companions(components["inputs"], role) | {role: components["inputs"][role]})
                  for role, path in node.sources}  # a source model's digests include its external data files'
        for dep in node.deps:
            record = self.finished[dep.node]
            files = {name: self.store.object_path(digest) for name, digest in record["outputs"].items()}
            if companions(files, dep.output):
                files.update(place_side_by_side(files, dep.output, workdir / "inputs" / dep.role))
            inputs[dep.role] = Upstream(files=files, record=record["record"], key=record["key"], sha256=record["outputs"])
        return inputs

    def _collect(self, job: _Running, future: futures.Future) -> None:
        seconds = round(time.perf_counter() - job.started, 3)
        try:
            result = future.result()
        except Exception as exc:  # the worker died (e.g. a native crash) or could not be reached
            result = {"error": f"worker process failed: {type(exc).__name__}: {exc}", "detail": ""}
            self._drop_pool()
        try:
            if "error" in result:
                self._raise_if_store_full(job, result.get("errno"))
                self._settle(NodeState(job.node, FAILED, result["error"], key=job.key, seconds=seconds, detail=result.get("detail", "")))
                return
            outputs = {name: self.store.add_object(Path(path)) for name, path in result["files"].items()}
            record = {"key": job.key, "node": job.node.id, "outputs": outputs, "record": result["record"], "components": job.components,
                      "seconds": seconds, "built_by": {"run": self.run_id, "pid": os.getpid()}}
            record = self.store.put_stage_record(job.key, record)
            self._built_here[job.key] = record
            self._finish(NodeState(job.node, BUILT, key=job.key, components=job.components, seconds=seconds), record)
            if self.remote is not None:
                self.remote.push(job.key, record, self.store)
        finally:
            self.keys.release(job.key)
            shutil.rmtree(job.workdir, ignore_errors=True)

    def _raise_if_store_full(self, job: _Running, code: Optional[int]) -> None:
        """A stage that could not write its output fails the run with one line, not every stage after it."""
        if code in STORE_FULL_ERRNOS:
            raise write_failure(self.store.root, OSError(code, os.strerror(code)), f"({job.node.id} writing its output)")

    def _finish(self, state: NodeState, record: dict) -> None:
        self.finished[state.node.id] = record
        self.store.set_last_run(state.node.id, {"key": state.key, "components": state.components})
        if state.node.kind == "package":
            checkout_package(self.store, record["outputs"]["package"], self.packages_dir, state.node.recipe, self.resolver)
        self._settle(state)

    def _settle(self, state: NodeState) -> None:
        self.states[state.node.id] = state
        self.listener("done", state)

    def _executor(self) -> futures.ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")  # no fork of a process holding sqlite handles
            self._pool = futures.ProcessPoolExecutor(max_workers=self.options.jobs, mp_context=context)
        return self._pool

    def _drop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def checkout_package(store: Store, digest: str, packages_dir: Path, recipe: str, resolver: Resolver) -> bool:
    """Make `<packages>/<recipe>.tar.gz` and its extracted folder match the package object; False if they did."""
    if _package_in_place(digest, packages_dir, recipe, resolver):
        return False
    with holding(store.locks / f"package-{recipe}.lock"):  # concurrent runs write the same package folder
        return _checkout_package(store, digest, packages_dir, recipe, resolver)


def _package_in_place(digest: str, packages_dir: Path, recipe: str, resolver: Resolver) -> bool:
    archive, folder = packages_dir / f"{recipe}.tar.gz", packages_dir / recipe
    return archive.is_file() and folder.is_dir() and resolver.digests.digest(archive) == digest


def _checkout_package(store: Store, digest: str, packages_dir: Path, recipe: str, resolver: Resolver) -> bool:
    archive, folder = packages_dir / f"{recipe}.tar.gz", packages_dir / recipe
    if _package_in_place(digest, packages_dir, recipe, resolver):
        return False  # another run put it in place while this one waited
    packages_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=packages_dir, prefix=f".{recipe}.incoming-"))
    try:
        shutil.copyfile(store.object_path(digest), staging / "package.tar.gz")
        extract_tar(staging / "package.tar.gz", staging / "extracted")
        replace_dir_atomically(staging / "extracted" / recipe, folder)
        os.replace(staging / "package.tar.gz", archive)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True
