"""The local executor: worker processes on this machine (`trtflow run -j N`).

Processes, not threads: TensorRT-RTX builds are single-threaded and hold the GIL, so processes are what lets
`-j 2` use both cores, and a crash inside a native library fails one node instead of the whole run (the
pool is then replaced). Workers are spawned, never forked from this process: the runner holds SQLite handles. Builds
run each in a hermetic process of its own (executors.hermetic), forked by a build server that did its imports once:
their output must not depend on what the process did before. Cleanup and precision stages are forked by a plain
worker server (executors.forking): what the model tools leave behind leaves with each child. Exports, which run user
code, are forked by a plain server of their own. Every worker starts with the hash seed and locale pinned
(util.settings.PINNED): AutoCast's value_info followed string hashing. The runner keeps at most -j tasks running in
all.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
from collections.abc import Mapping

from trtflow.executors import StageResult, StageTask, run_task, warm_up
from trtflow.executors.forking import BUILD_SERVED, FORKS, TOOLS_SERVED, USER_CODE_SERVED, ForkServers, run_forked
from trtflow.executors.hermetic import run_hermetic, run_isolated
from trtflow.stages import stage
from trtflow.util.proc import die_with_parent
from trtflow.util.settings import Settings, pinned_environ

HERMETIC_KINDS = frozenset(BUILD_SERVED)
# run user code: a child of the user code's server each, or where processes cannot fork (and on Ray) a fresh process
# each, so a crash names itself
ISOLATED_KINDS = frozenset(USER_CODE_SERVED)
# Kinds forked by servers, and the group each one's server imports for (the model tools' leftovers leave with each
# child, and each stage's peak memory is its own).
SERVED = {kind: group for group in (BUILD_SERVED, TOOLS_SERVED, USER_CODE_SERVED) for kind in group}


class LocalExecutor:
    """Up to `jobs` stages at once: builds forked by hermetic build servers, cleanup and precision forked by plain
    worker servers, exports forked by the user code's server, the rest in a pool of spawned worker processes."""

    def __init__(self, jobs: int, settings: Settings | None = None):
        self.jobs = jobs
        self.settings = settings or Settings.from_environ()
        self._threads: futures.ThreadPoolExecutor | None = None  # each waits on one child process
        self._pool: futures.ProcessPoolExecutor | None = None
        self._broken = False  # set from the pool's thread when a worker died; the pool is replaced on the next submit
        self._servers: dict[tuple[str, ...], ForkServers] = {}
        self._later: dict[tuple[str, ...], tuple[str, ...]] = {}  # per server group: its next task's server imports

    def submit(self, task: StageTask) -> futures.Future[StageResult]:
        """Start the task in a worker; a worker that dies resolves the future to a failure, never an exception."""
        servers = self._fork_servers(task.kind)
        if task.kind in HERMETIC_KINDS:
            return self._waiting().submit(run_hermetic, task, self.settings, servers)
        if servers is not None:
            imports = stage(task.kind).imports
            own = imports(task.params) if imports else ()
            later = tuple(module for module in self._later.pop(SERVED[task.kind], ()) if module not in own)
            return self._waiting().submit(run_forked, task, servers, own, later)
        if task.kind in ISOLATED_KINDS:
            return self._waiting().submit(run_isolated, task)
        outer: futures.Future[StageResult] = futures.Future()
        inner = self._workers().submit(run_task, task)
        inner.add_done_callback(lambda done: outer.set_result(self._result(done)))
        return outer

    def _waiting(self) -> futures.ThreadPoolExecutor:
        """The threads that wait on child processes, one per job."""
        if self._threads is None:
            self._threads = futures.ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="process")
        return self._threads

    @classmethod
    def started_early(cls, jobs: int, cold: bool) -> LocalExecutor:
        """An executor whose first servers start before the project is even loaded: their imports overlap the run's
        own imports and first plan. For a project with no store yet, the model tools' server first (cleanup comes
        first); then build servers. As many as leave a core to the run itself (on 2 cores, one: two starting beside
        the run made a run with everything cached 0.3 s slower at 3,000 stages). The first `prepare` starts the rest
        and ends those the plan does not need."""
        executor = cls(jobs)
        try:
            executor.prepare({"build", "cleanup"} if cold else {"build"}, at_most=max(1, (os.cpu_count() or 1) - 1))
        except BaseException:
            executor.shutdown()  # the servers that did start
            raise
        return executor

    def prepare(
        self, kinds: set[str], imports: Mapping[str, set[str]] | None = None, at_most: int | None = None
    ) -> None:
        """Start servers (a build server per job, one for user code, one for the model tools; `at_most` in all, in the
        DAG's order: exports come first, then cleanup) and a pool worker, their imports done while the run still plans
        and checks; end the idle servers of groups no kind in `kinds` needs. `imports`: per kind, the modules its
        tasks will import beyond the kind's own (ModelOpt for a reduced precision): the server of the group's next
        task imports them while that task's child runs (the export or cleanup before them, on the core it leaves)."""
        wanted = {SERVED[kind] for kind in kinds if kind in SERVED}
        if imports is not None:
            for group in wanted:
                self._later[group] = tuple(sorted({module for kind in group for module in imports.get(kind, ())}))
        for group in set(self._servers) - wanted:
            self._servers.pop(group).close()
        budget = at_most
        for group in sorted(wanted, key=(USER_CODE_SERVED, TOOLS_SERVED, BUILD_SERVED).index):  # in the DAG's order
            count = self.jobs if group == BUILD_SERVED else 1
            count = count if budget is None else min(count, budget)
            servers = self._fork_servers(group[0]) if count > 0 else None
            if servers is not None:
                servers.fill(count)  # another starts when a task finds none idle
                budget = None if budget is None else budget - count
        pooled = sorted(kinds - HERMETIC_KINDS - ISOLATED_KINDS - (SERVED.keys() if FORKS else set()))
        if pooled and (not wanted or self.jobs < (os.cpu_count() or 1)):
            # nothing waits for it: the first task queues behind it. Not beside a server per core: two pool workers
            # starting beside two builds on 2 cores slowed both by 40%; the pool then starts with its first task
            self._workers().submit(warm_up, pooled)

    def _fork_servers(self, kind: str) -> ForkServers | None:
        """The servers that fork tasks of `kind` (up to one per job), or None: a kind no server runs, or processes
        cannot fork here (builds and exports then run in fresh processes, cleanup and precision in the pool)."""
        group = SERVED.get(kind)
        if group is None or not FORKS:
            return None
        if group not in self._servers:
            self._servers[group] = ForkServers(group, self.settings, hermetic=group == BUILD_SERVED)
        return self._servers[group]

    def _result(self, done: futures.Future) -> StageResult:
        try:
            return done.result()
        except Exception as exc:  # the worker died (e.g. a native crash) or could not be reached
            self._broken = True
            return StageResult.failure(f"worker process failed: {type(exc).__name__}: {exc}")

    def _workers(self) -> futures.ProcessPoolExecutor:
        if self._broken:
            self._drop()
        if self._pool is None:
            with pinned_environ():  # a spawned worker inherits the environment as it is when it starts: all start now
                self._pool = futures.ProcessPoolExecutor(
                    max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent
                )
                # each submit starts one more worker while none is idle (every start method but fork)
                for _ in range(self.jobs):
                    self._pool.submit(warm_up, [])
        return self._pool

    def _drop(self) -> None:
        """Forget a broken pool (the next task starts a new one)."""
        self._broken = False
        if self._pool is not None:
            _end_pool(self._pool)
            self._pool = None

    def shutdown(self) -> None:
        """Stop the workers; tasks not started are cancelled. Idle servers and pool workers are killed (they hold no
        task by then) rather than left to unload their libraries."""
        if self._threads is not None:
            self._threads.shutdown(cancel_futures=True)
            self._threads = None
        for servers in self._servers.values():
            servers.close()
        self._servers.clear()
        if self._pool is not None:
            _end_pool(self._pool)
            self._pool = None


def _end_pool(pool: futures.ProcessPoolExecutor) -> None:
    """Stop a pool without waiting for its workers to unload their libraries: they are killed (a run's tasks are all
    done by then; an interrupted run's are abandoned), then its manager thread is joined, so it is gone before the
    interpreter exits (CPython 3.11's exit hook can otherwise write to the wakeup pipe that thread is closing: a
    `Bad file descriptor` traceback after a run that stopped early)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown(wait=False) forgets it: join it ourselves
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.kill()
    if manager is not None:
        manager.join(timeout=30)
