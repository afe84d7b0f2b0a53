"""Execute a DAG: skip cached nodes, hand stale ones to an Executor, move outputs into the store.

The runner resolves every node through the same Resolver that planned it (plan.Resolution), starts what is
not cached on an Executor (the local process pool, or another that implements executors.Executor), and knows
nothing of what a stage does: stages declare what the runner must do for them (`verify_inputs`, a `finish`
hook). A failed node skips its downstream nodes only; unrelated recipes go on.

Runs that share a store build each stage key once: a node that must run first takes its key's lock
(without blocking the dispatcher: a busy key is polled), then looks again, and uses the record another
run (or the remote cache) made meanwhile. The lock is released once the record is written.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.errors import TrtflowError, required
from trtflow.executors import Executor, StageResult, StageTask
from trtflow.run.admission import MemoryAdmission, beside_builds
from trtflow.run.dag import Dag, Node, dag_node
from trtflow.run.frozen import FrozenCheck
from trtflow.run.jobs import Job, as_lack_of_memory, failure_record, raise_if_store_full, store_outputs, task_inputs
from trtflow.run.options import RunOptions
from trtflow.run.placing import Beside, run_here, stored_beside
from trtflow.run.plan import Resolution, Resolver, failure_shown, upstream_outcome
from trtflow.run.result import Slot
from trtflow.stages import stage
from trtflow.stages.base import Placement
from trtflow.states import (
    BUILT,
    CACHED,
    FAILED,
    PULLED,
    SKIPPED,
    WAITING,
    NodeState,
    failed_as_recorded,
    recorded_failure,
)
from trtflow.store import Store
from trtflow.store.lockfile import LockEntry
from trtflow.store.locks import KeyLocks
from trtflow.store.records import StageRecord
from trtflow.util.memory import oom_kills

if TYPE_CHECKING:
    from trtflow.store.remote import Remote

# ("start" | "done" | "wait", NodeState), ("warning", message): a remote that is down, a corrupt object; or
# ("workdir", (node id, its work directory)): where a started node's stage says what it is doing (stage_progress)
Listener = Callable[[str, Any], None]
LOCK_POLL_SECONDS = 0.05  # how often a key another run is building is looked at again


class Runner:
    """Runs one DAG against one store through an Executor; `run()` returns the final state of every node."""

    def __init__(
        self,
        dag: Dag,
        store: Store,
        resolver: Resolver,
        placement: Placement,
        options: RunOptions,
        executor: Executor,
        listener: Listener | None = None,
        expected_keys: dict[str, LockEntry] | None = None,
        remote: Remote | None = None,
        workroot: Callable[[], Path] | None = None,
    ):
        self.dag, self.store, self.resolver, self.placement = dag, store, resolver, placement
        self.frozen = FrozenCheck(expected_keys, store)  # --frozen: every node held to trtflow.lock
        self.options, self.executor = options, executor
        self.listener = listener or (lambda event, state: None)
        self.finished: dict[str, StageRecord] = {}
        self.states: dict[str, NodeState] = {}
        # node id -> `<failed node id>: <reason>` behind each node that ended without output
        self.ended: dict[str, str] = {}
        self.remote = remote
        # the run lease's tmp dir (taken on first use): swept if this process dies
        self._workroot = workroot or (lambda: store.tmp)
        self.keys = KeyLocks(store.locks)
        self.run_id = f"{os.getpid()}-{time.time_ns()}"
        self.warnings: list[str] = []
        self.memory = MemoryAdmission(options.memory, store)
        self._memory_noted: set[str] = set()
        self._built_here: dict[str, StageRecord] = {}  # key -> record built by this run (two nodes, one key)
        self._reopened: list[Node] = []  # finished nodes whose output turned out corrupt: to run again
        self.storing: Beside[tuple[Job, StageResult, float]] = Beside("storing")  # finished stages' outputs
        self.placements: Beside[tuple[NodeState, StageRecord]] = Beside("placing")  # finish hooks placing packages
        self._lock_waits = 0
        self._waited: set[str] = set()
        self._reported = 0
        self._running_jobs: list[Job] = []
        self.t0 = time.perf_counter()
        self.timeline: dict[str, Slot] = {}  # node id -> when it ran (s from the run's start), its slot and peak RSS

    def run(self) -> dict[str, NodeState]:
        """Dispatch every node as its upstreams finish (of those ready, the one with the longest chain waiting on it
        first), until all are settled; returns each node's final state."""
        heights = self.dag.heights()
        waiting = sorted(self.dag, key=lambda node: -heights[node.id])
        running: dict[futures.Future, Job] = {}
        self.t0 = time.perf_counter()
        try:
            while waiting or running or self._beside():
                waiting = self._dispatch(waiting, running)
                self._report()
                if running or self._beside():
                    poll = LOCK_POLL_SECONDS if self._lock_waits else None
                    pending = [*running, *self.storing.pending, *self.placements.pending]
                    done, _ = futures.wait(pending, timeout=poll, return_when=futures.FIRST_COMPLETED)
                    for future in done:
                        if future in running:
                            self._collect(running.pop(future), future.result())
                        elif future in self.storing.pending:
                            self._stored(*self.storing.take(future), future)
                        else:
                            self._placed(*self.placements.take(future), future)
                elif self._lock_waits:
                    time.sleep(LOCK_POLL_SECONDS)
            if self.remote is not None:
                self.remote.finish()
        finally:
            self.storing.close()
            self.placements.close()
            self.executor.shutdown()
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
            skip, root, missing = upstream_outcome(node, self.ended)
            if skip is not None:
                self._settle(NodeState(node, SKIPPED, skip), root)
            elif (
                any(d.node not in self.finished and d.node not in self.ended for d in node.deps)
                or len(running) >= self.options.jobs
            ):
                still.append(node)
            elif not self._resolved(node, running, missing):
                still.append(node)
        still.extend(self._reopened)
        self._reopened = []
        return still

    def _resolved(self, node: Node, running: dict, missing: dict[str, str]) -> bool:
        """Key the node now that its upstreams are done: fail it off the lock, use a cached record (a recorded failure
        included), or claim and start it; False: wait (key busy, input corrupt)."""
        resolution = self.resolver.resolve(node, self.finished, self.options.force, missing)
        off_lock = self.frozen.off_lock(resolution)
        if off_lock is not None:
            self._settle(off_lock)
            return True
        if resolution.record is not None:
            self._finish(resolution.state, resolution.record)
            return True
        return self._claim(resolution, running)

    def _claim(self, resolution: Resolution, running: dict) -> bool:
        """Start the node holding its key's lock, or use what was made meanwhile; False: wait (key busy, input
        corrupt)."""
        node, key = resolution.node, required(resolution.key, f"{resolution.node.id}: the key")  # upstreams are done
        if key in {job.key for job in [*self._running_jobs, *(job for job, _, _ in self.storing.pending.values())]}:
            return False  # another node of this run makes the same stage: its record is used once stored
        if not self.keys.claim(key):
            self._lock_waits += 1
            if node.id not in self._waited:
                self._waited.add(node.id)
                self.listener("wait", NodeState(node, WAITING, "another run is building the same stage", key=key))
            return False
        record, reason = self._made_meanwhile(node, key)
        if record is None and stage(node.kind).verify_inputs and self._reopen_corrupt_inputs(node):
            self.keys.release(key)
            return False
        if record is not None:
            self.keys.release(key)
            self._finish(NodeState(node, CACHED, reason, key=key, components=resolution.components), record)
            return True
        expected, kinds = self.memory.expected(resolution), [job.node.kind for job in self._running_jobs]
        if not self.memory.admits(expected, [job.expected for job in self._running_jobs]) or (
            self.options.builds_alone and not beside_builds(node.kind, kinds, self._beside())
        ):
            self.keys.release(key)  # a stage finishing makes room (or leaves a build alone): the dispatcher comes back
            return False
        self._note_alone(node, expected)
        future, job = self._start(resolution, expected)
        running[future] = job
        return True

    def _note_alone(self, node: Node, expected: int) -> None:
        """Warn, once, that a stage alone exceeds the run's memory budget (it runs with nothing beside it)."""
        warning = self.memory.alone_over(expected)
        if warning and node.id not in self._memory_noted:
            self._memory_noted.add(node.id)
            self._warn(f"{node.id} {warning}")

    def _made_meanwhile(self, node: Node, key: str) -> tuple[StageRecord | None, str]:
        """With the key's lock held: the record this run, another run or the remote cache has for it."""
        if key in self._built_here:
            return self._built_here[key], "same stage as another node of this run"
        if self.options.force:
            return None, ""
        record = self.store.records.get(key)
        if record is not None and not (self.options.retry_failed and recorded_failure(record) is not None):
            return record, "built by another run meanwhile"
        if self.remote is not None:
            return self.remote.pull(key, node.id, self.store, self._workroot()), PULLED
        return None, ""

    def _reopen_corrupt_inputs(self, node: Node) -> bool:
        """Re-hash the node's inputs (those this run hashed already only if their file changed since); a corrupt object
        is quarantined and its producer (and what follows) runs again."""
        present = [dep.node for dep in node.deps if dep.node in self.finished]
        objects = self.store.objects
        bad = [
            n for n in present if not all(objects.verified_this_run(d) for d in self.finished[n]["outputs"].values())
        ]
        for producer in dict.fromkeys(bad):
            for node_id in [producer, *self.dag.downstream(producer)]:
                if self.finished.pop(node_id, None) is not None:
                    self.states.pop(node_id, None)
                    self.resolver.forget(node_id)
                    self._reopened.append(self.dag.nodes[node_id])
        return bool(bad)

    def _report(self) -> None:
        """Pass on, once each, the objects the store quarantined, what it did on its own, and the remote cache's
        warnings."""
        messages = [
            f"object {digest} was corrupt (its bytes no longer match its name): moved to {self.store.corrupt}; "
            "what needs it is rebuilt"
            for digest in self.store.quarantined[self._reported :]
        ]
        self._reported = len(self.store.quarantined)
        messages += self.store.take_notes()
        messages += self.remote.take_warnings() if self.remote is not None else []
        for message in messages:
            self._warn(message)

    def _warn(self, message: str) -> None:
        """Keep a warning for the summary and show it now."""
        self.warnings.append(message)
        self.listener("warning", message)

    def _start(self, resolution: Resolution, expected: int = 0) -> tuple[futures.Future, Job]:
        """Hand the node to the executor with its inputs placed, in a fresh work directory of its own."""
        node = resolution.node
        self.listener("start", resolution.state)
        workdir = Path(tempfile.mkdtemp(dir=self._workroot(), prefix=node.id.replace(":", "-").replace("/", "_") + "-"))
        self.listener("workdir", (node.id, workdir))
        task = StageTask(
            node.id, node.kind, node.params, task_inputs(resolution, self.finished, self.store, workdir), workdir
        )
        busy = {job.slot for job in self._running_jobs}
        job = Job(
            node,
            required(resolution.key, f"{node.id}: the key"),
            required(resolution.components, f"{node.id}: the key's components"),
            workdir,
            time.perf_counter(),
            min(set(range(len(busy) + 1)) - busy),
            expected,
            oom_kills(),
        )
        self._running_jobs.append(job)
        return self.executor.submit(task), job

    def _collect(self, job: Job, result: StageResult) -> None:
        """Store a finished stage's outputs and record beside the next stages (the storing thread), or settle its
        failure; the key and work dir are released once the node is settled."""
        seconds = round(time.perf_counter() - job.started, 3)
        self._running_jobs.remove(job)
        start = round(job.started - self.t0, 3)
        self.timeline[job.node.id] = Slot(start, round(start + seconds, 3), job.slot, result.peak_rss)
        self.store.memos.remember_peak(job.node.id, result.peak_rss)
        result = as_lack_of_memory(job, result)
        if result.error is None:
            work = functools.partial(store_outputs, self.store, job, result, seconds, self.run_id)
            if stored_beside(result):
                self.storing.start(work, (job, result, seconds))
            else:
                self._stored(job, result, seconds, run_here(work))
            return
        try:
            raise_if_store_full(self.store, job, result.errno)
            recorded = result.deterministic and self._record_failure(job, result, seconds)
            self._settle(
                NodeState(
                    job.node,
                    FAILED,
                    result.error,
                    key=job.key,
                    components=job.components,
                    seconds=seconds,
                    detail=result.detail,
                    exit_code=result.exit_code,
                    where=result.node,
                    recorded=recorded,
                    peak_rss=result.peak_rss,
                )
            )
        finally:
            self._release(job)

    def _stored(self, job: Job, result: StageResult, seconds: float, stored: futures.Future) -> None:
        """A stage's outputs and record are in the store (a failure to write them fails the run, as before): the node
        is built."""
        try:
            record = stored.result()
            self._built_here[job.key] = record
            state = NodeState(
                job.node,
                BUILT,
                key=job.key,
                components=job.components,
                seconds=seconds,
                where=result.node,
                peak_rss=result.peak_rss,
            )
            self._finish(state, record)
            if self.remote is not None:
                self.remote.push(job.key, record, self.store)
        finally:
            self._release(job)

    def _release(self, job: Job) -> None:
        self.keys.release(job.key)
        shutil.rmtree(job.workdir, ignore_errors=True)

    def _beside(self) -> bool:
        """Whether outputs are being stored or packages placed beside the stages."""
        return bool(self.storing.pending or self.placements.pending)

    def _record_failure(self, job: Job, result: StageResult, seconds: float) -> bool:
        """Record a stage's own failure under its key: the same key fails the same way, so the next run reports it
        instead of doing the work again (until the key changes or --retry-failed). Never pushed to a remote cache."""
        record = failure_record(job, result, seconds, self.run_id)
        self._built_here[job.key] = self.store.records.put(job.key, record)
        self.store.memos.set_last_run(job.node.id, {"key": job.key, "components": job.components})
        return True

    def _finish(self, state: NodeState, record: StageRecord) -> None:
        """A node is done (built or cached): its stage's finish hook places what it made (or refuses a cached result
        the recipe's policy no longer accepts: the node fails), then it is remembered and reported. A recorded failure
        (found in the store, or made meanwhile by another run) settles the node as failed."""
        failure = recorded_failure(record)
        if failure is not None:
            self.store.memos.set_last_run(state.node.id, {"key": state.key, "components": state.components})
            self._settle(failed_as_recorded(state, failure, record))
            return
        kind = stage(state.node.kind)
        place = functools.partial(kind.finish, dag_node(state), record, self.placement) if kind.finish else lambda: None
        if kind.places_files:
            self.placements.start(place, (state, record))
        else:
            self._placed(state, record, run_here(place))

    def _placed(self, state: NodeState, record: StageRecord, finished: futures.Future) -> None:
        """After the finish hook (here or in the placing thread): fail the node it refused, warn of what it
        repaired, then hold the node to the lock (--frozen) and remember it."""
        try:
            repaired = finished.result()
        except TrtflowError as exc:
            self._settle(NodeState(state.node, FAILED, str(exc), key=state.key, exit_code=exc.exit_code))
            return
        if repaired:
            self._warn(repaired)
        state = self.frozen.verdict(state, record)
        if state.status == FAILED:
            self._settle(state)
            return
        self.finished[state.node.id] = record
        self.store.memos.set_last_run(state.node.id, {"key": state.key, "components": state.components})
        self._settle(state)

    def _settle(self, state: NodeState, root: str | None = None) -> None:
        """A node's final state; a node without output is remembered with the failure behind it (`root`, for a skip)."""
        if state.status == FAILED:
            state = dataclasses.replace(state, reason=failure_shown(dag_node(state), state.reason))
        if state.status in (FAILED, SKIPPED):
            self.ended[state.node.id] = root or f"{state.node.id}: {state.reason}"
            state = self.frozen.as_locked(state)
        self.states[state.node.id] = state
        self.listener("done", state)
