"""Execute a DAG: skip cached nodes, run stale ones in worker processes, move outputs into the store.

Stages run in separate processes: TensorRT-RTX builds are single-threaded and hold the GIL, so
processes are what lets `-j 2` use both cores, and a crash inside a native library fails one node
instead of the whole run. A failed node skips its downstream nodes only; unrelated recipes go on.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from trtflow.archive import extract_tar, replace_dir_atomically
from trtflow.dag import Dag, Node
from trtflow.hashing import stage_key
from trtflow.plan import BUILT, CACHED, FAILED, SKIPPED, NodeState, Resolver
from trtflow.stages import Upstream, execute
from trtflow.stages.modelfile import FILE_NAMES, companions
from trtflow.store import Store

Listener = Callable[[str, NodeState], None]  # ("start" | "done", state)


@dataclass(frozen=True)
class RunOptions:
    jobs: int = 1
    force: bool = False
    frozen: bool = False


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
                 listener: Optional[Listener] = None, expected_keys: Optional[dict[str, str]] = None,
                 planned: Optional[dict[str, NodeState]] = None):
        self.dag, self.store, self.resolver = dag, store, resolver
        self.expected_keys = expected_keys  # --frozen: every node must resolve to the key the lock holds
        self.planned = planned or {}  # cached nodes found by planning are not looked up twice
        self.packages_dir = packages_dir
        self.options = options
        self.listener = listener or (lambda event, state: None)
        self.finished: dict[str, dict] = {}
        self.states: dict[str, NodeState] = {}
        self._pool: Optional[futures.ProcessPoolExecutor] = None

    def run(self) -> dict[str, NodeState]:
        waiting = list(self.dag)
        running: dict[futures.Future, _Running] = {}
        try:
            while waiting or running:
                waiting = self._dispatch(waiting, running)
                if running:
                    done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
                    for future in done:
                        self._collect(running.pop(future), future)
        finally:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
        return {node.id: self.states[node.id] for node in self.dag}

    def _dispatch(self, waiting: list[Node], running: dict) -> list[Node]:
        """Settle every node whose upstreams are done: skip, find cached, or start (up to -j)."""
        still: list[Node] = []
        for node in waiting:
            blocked = [d.node for d in node.deps if self.states.get(d.node) and self.states[d.node].status in (FAILED, SKIPPED)]
            if blocked:
                self._settle(NodeState(node, SKIPPED, f"upstream {blocked[0]} failed or was skipped"))
            elif any(d.node not in self.finished for d in node.deps) or len(running) >= self.options.jobs:
                still.append(node)
            elif not self._off_lock(node) and not self._use_cached(node):
                job = self._start(node)
                running[job[0]] = job[1]
        return still

    def _off_lock(self, node: Node) -> bool:
        """Under --frozen, fail a node whose key left the lock (an upstream built different bytes)."""
        if self.expected_keys is None:
            return False
        key = stage_key(self.resolver.components(node, self.finished))
        if key == self.expected_keys.get(node.id):
            return False
        self._settle(NodeState(node, FAILED, "key differs from trtflow.lock: an upstream stage produced different bytes", key=key))
        return True

    def _use_cached(self, node: Node) -> bool:
        planned = self.planned.get(node.id)
        if planned is not None and planned.status == CACHED and not self.options.force:
            self._finish(NodeState(node, CACHED, key=planned.key, components=planned.components), planned.record)
            return True
        components = self.resolver.components(node, self.finished)
        key = stage_key(components)
        record = None if self.options.force else self.resolver.cached_record(key)
        if record is None:
            return False
        self._finish(NodeState(node, CACHED, key=key, components=components), record)
        return True

    def _start(self, node: Node) -> tuple[futures.Future, _Running]:
        components = self.resolver.components(node, self.finished)
        state = self.resolver.stale_state(node, components, self.options.force, [])
        self.listener("start", state)
        workdir = Path(tempfile.mkdtemp(dir=self.store.tmp, prefix=node.id.replace(":", "-").replace("/", "_") + "-"))
        params = {**node.params, **node.fingerprint}
        future = self._executor().submit(execute, node.kind, params, self._inputs(node, components, workdir), workdir)
        return future, _Running(node, state.key, components, workdir, time.perf_counter())

    def _inputs(self, node: Node, components: dict, workdir: Path) -> dict[str, Upstream]:
        inputs = {role: Upstream(files={role: path}, sha256={role: components["inputs"][role]}) for role, path in node.sources}
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
                self._settle(NodeState(job.node, FAILED, result["error"], key=job.key, seconds=seconds, detail=result.get("detail", "")))
                return
            outputs = {name: self.store.add_object(Path(path)) for name, path in result["files"].items()}
            record = {"key": job.key, "node": job.node.id, "outputs": outputs, "record": result["record"], "components": job.components, "seconds": seconds}
            self.store.put_stage_record(job.key, record)
            self._finish(NodeState(job.node, BUILT, key=job.key, components=job.components, seconds=seconds), record)
        finally:
            shutil.rmtree(job.workdir, ignore_errors=True)

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


def place_side_by_side(files: dict[str, Path], output: str, folder: Path) -> dict[str, Path]:
    """Link an output and its companions (a model's external data) into one folder under the names the graph expects."""
    folder.mkdir(parents=True, exist_ok=True)
    placed = {}
    for name in (output, *companions(files, output)):
        placed[name] = folder / FILE_NAMES.get(name, name)
        try:
            os.link(files[name], placed[name])
        except OSError:  # another filesystem: a copy is slower but correct
            shutil.copyfile(files[name], placed[name])
    return placed


def checkout_package(store: Store, digest: str, packages_dir: Path, recipe: str, resolver: Resolver) -> bool:
    """Make `<packages>/<recipe>.tar.gz` and its extracted folder match the package object; False if they did."""
    archive, folder = packages_dir / f"{recipe}.tar.gz", packages_dir / recipe
    if archive.is_file() and folder.is_dir() and resolver.digests.digest(archive) == digest:
        return False
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
