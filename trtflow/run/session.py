"""One project opened for planning or running: the wiring between recipes, DAG, store and runner.

The CLI, the tests and the benchmarks all go through this, so a no-op run costs the same everywhere.
Nothing is written until `run` has planned and pre-checked every model it is about to use, except the
run's lease on an existing store (a lock and a tmp dir), taken as soon as the plan has work (then the plan is made
again, so gc cannot have deleted what it finds). A run that finds everything cached writes nothing at all.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.backends.base import BACKENDS
from trtflow.calibration import check_calibration_data
from trtflow.errors import EnvironmentProblem, ProjectError, required
from trtflow.executors.local import LocalExecutor
from trtflow.hashing import FileDigests
from trtflow.modelcheck import check_builder_options, check_exported_model, check_recipe_model
from trtflow.recipe.load import load_project
from trtflow.recipe.project import Project
from trtflow.recipe.refusals import Refusal
from trtflow.recipe.schema import RaySpec
from trtflow.run.admission import default_budget
from trtflow.run.dag import Dag, dag_from_project, dag_node
from trtflow.run.frozen import locked_entries
from trtflow.run.lockupdate import update_lock
from trtflow.run.options import RunOptions
from trtflow.run.plan import Resolver, imports_to_run, kinds_to_run, plan
from trtflow.run.result import RunResult, frozen_mapping
from trtflow.run.runner import Listener, Runner
from trtflow.signing import Signer, signer_from_environment
from trtflow.stages import build as build_stage
from trtflow.stages.base import NodeId, Placement
from trtflow.stages.package import earlier_packages
from trtflow.states import PULLED, NodeState
from trtflow.store import Store
from trtflow.store.lockfile import LOCK_FILE, LockEntry
from trtflow.store.locks import LazyLease
from trtflow.store.records import StageRecord
from trtflow.store.store import EXCHANGE_DIR
from trtflow.taskdata import check_task_data

if TYPE_CHECKING:
    from trtflow.executors import Executor
    from trtflow.store.remote import Remote


class Session:
    """A loaded project, its (selected) DAG, its store and the resolver that plans and runs it."""

    def __init__(self, project: Project, recipes: Iterable[str] = ()):
        self.project = project
        names = list(recipes)
        for name in names:
            project.recipe(name)  # raises a ProjectError naming the known recipes
        full = dag_from_project(project)
        self.all_node_ids = set(full.nodes)
        self.dag: Dag = full.for_recipes(names) if names else full
        self.store: Store | None = Store.existing(project.store_dir)
        digests = self.store.memos.file_digests() if self.store else FileDigests()
        self.resolver = Resolver(self.store, digests)
        self.signer: Signer | None = None  # the environment's signing key, read when a run starts

    @classmethod
    def open(cls, root: Path, recipes: Iterable[str] = (), keep_refusals: bool = False) -> Session:
        """Load the project at `root` (ProjectError naming file and line on any problem; pairs that cannot be built
        are kept for `validate` to list with the ones the models show, if `keep_refusals`)."""
        return cls(load_project(root, keep_refusals), recipes)

    def plan(self, force: bool = False) -> dict[str, NodeState]:
        """Every selected node's state, without writing anything."""
        return plan(self.dag, self.resolver, force)

    def _new_resolver(self, retry_failed: bool) -> None:
        """Plan afresh (a gc may have run since the last plan), with recorded failures run again if asked."""
        self.resolver = Resolver(self.store, self.resolver.digests, retry_failed)

    def check_models(self, states: dict[str, NodeState] | None = None) -> list[Refusal]:
        """Parse every model that will be used (all of them if `states` is None) against its recipe; the pairs
        the graphs show cannot be built, of every recipe (`validate` lists them, `run` refuses them all at once)."""
        refusals = []
        builds: dict[str, list[str]] = {}  # recipe -> its builds (a scan per recipe: 12 s at 10,003 stages)
        for build in (n for n in self.dag if n.kind == "build"):
            builds.setdefault(build.recipe, []).append(build.id)
        for item in self.project.recipes:
            node = self.dag.nodes.get(NodeId.of("cleanup", item.recipe.name))
            if node is not None and (states is None or not states[node.id].settled):
                refusals += check_recipe_model(item, self.project.root, self.project.pipeline)
                exported = self._cached_export(item.recipe.name)
                refusals += check_exported_model(item, exported, self.project.pipeline) if exported else []
            if any(states is None or not states[n].settled for n in builds.get(item.recipe.name, [])):
                check_builder_options(item, self.project.pipeline)
            reduced = [NodeId.of("precision", item.recipe.name, p) for p in item.recipe.precisions if p != "fp32"]
            if item.recipe.calibration is not None and any(self._will_run(n, states) for n in reduced):
                check_calibration_data(item, self.project.root)
            if item.recipe.accuracy.data is not None and any(self._will_run(n, states) for n in reduced):
                check_task_data(item, self.project.root)
        return refusals

    def _cached_export(self, recipe: str) -> Path | None:
        """The ONNX a recipe's export stage made for its current key, if the store has it."""
        node = self.dag.nodes.get(NodeId.of("export", recipe))
        output = self.resolver.resolve(node, {}).output if node is not None and self.store is not None else None
        return self.store.objects.path(output["outputs"]["model"]) if output and self.store is not None else None

    def _will_run(self, node_id: str, states: dict[str, NodeState] | None) -> bool:
        return node_id in self.dag.nodes and (states is None or not states[node_id].settled)

    @property
    def lock_path(self) -> Path:
        """The project's trtflow.lock: what --frozen checks the plan against and a run rewrites."""
        return self.project.root / LOCK_FILE

    def frozen_keys(self) -> dict[str, LockEntry]:
        """The lock's entry per node, after checking the plan matches it (ProjectError naming each change)."""
        return locked_entries(self.lock_path, self.dag, self.resolver, self.all_node_ids)

    def run(
        self, options: RunOptions, listener: Listener | None = None, early: LocalExecutor | None = None
    ) -> RunResult:
        """Plan, pre-check the models that will be read, then execute what is not cached (in `early`, servers started
        before the project was loaded, if the run is local); update the lock. The run's result, as one value."""
        started = time.perf_counter()
        with self.resolver.digests.for_one_run():  # each source is read once however often the run plans
            return self._run(options, listener, early, started)

    def run_exports(self, listener: Listener | None = None) -> RunResult:
        """Only the export stages, run as `run` runs them (cached, in the lock): validate then reads their models."""
        whole, self.dag = self.dag, self.dag.of_kind("export")
        try:
            return self.run(RunOptions(), listener)
        finally:
            self.dag = whole
            self._new_resolver(False)  # one that finds the exports just made

    def _run(
        self, options: RunOptions, listener: Listener | None, early: LocalExecutor | None, started: float
    ) -> RunResult:
        expected = self.frozen_keys() if options.frozen else None
        self.signer = signer_from_environment()
        remote = self._remote(options)
        lease = LazyLease(self.store.root, self.store.notes) if self.store is not None else None
        executor: Executor | None = None
        try:
            if options.retry_failed:
                self._new_resolver(True)
            planned = self.plan(options.force)
            if lease is not None and (options.check_repro or not all(s.settled for s in planned.values())):
                # its workers start while the run leases and plans again
                executor = self._executor(options, planned, early)
                executor.prepare(kinds_to_run(planned), imports_to_run(self.dag, planned))
                # Work ahead: gc must not delete what the plan uses, so lease first, then plan again from scratch (a gc
                # may have run since). A run that finds everything cached (or failed the same way) writes nothing.
                lease.tmp()
                self._new_resolver(options.retry_failed)
                planned = self.plan(options.force)
            executor = executor or self._executor(options, planned, early)
            executor.prepare(kinds_to_run(planned), imports_to_run(self.dag, planned))  # the models checked meanwhile
            self.project.refuse(self.check_models(planned))
            check_backends(planned)
            if self.store is not None and lease is not None:  # what a killed run left beside the packages and the lock
                from trtflow.store.housekeeping import sweep_leftovers

                sweep_leftovers(
                    self.store,
                    self.project.packages_dir,
                    self.project.root,
                    lease.tmp().name if lease.taken else None,
                    runs_died=True if lease.swept else None,
                )
            if self.store is None or lease is None:  # no store yet (so no lease either)
                store = self._create_store()
                lease = LazyLease(store.root, store.notes)
                lease.tmp()
            else:
                store = self.store
            placement = Placement(store, self.project.packages_dir, self.resolver.digests, self.signer)
            runner = Runner(
                self.dag,
                store,
                self.resolver,
                placement,
                _with_memory_budget(options, executor),
                executor,
                listener,
                expected,
                remote=remote,
                workroot=lease.tmp,
            )
            if listener is not None:
                listener("plan", self.estimates(planned))
            states = runner.run()
            warnings = list(runner.warnings)
            for message in earlier_packages(states.values(), self.project.packages_dir):
                warnings.append(message)
                if listener is not None:
                    listener("warning", message)
            result = RunResult(
                tuple(states.values()),
                0.0,
                options.jobs,
                warnings=tuple(warnings),
                records=frozen_mapping(runner.finished),
                timeline=frozen_mapping(runner.timeline),
                planned=frozen_mapping(planned),
                frozen=self._frozen_summary(runner) if options.frozen else None,
            )
            if not options.frozen:
                update_lock(self.lock_path, self.all_node_ids, store, result)
            keys = [record["key"] for record in runner.finished.values()]
            keys += [state.key for state in states.values() if state.recorded and state.key]
            if store.runs.changes(keys):
                lease.tmp()  # a run that placed only cached outputs writes here too: under a lease, as any writer
                store.runs.record(keys)
            if options.check_repro:
                result = dataclasses.replace(
                    result,
                    repro=tuple(self._check_repro(store, runner.finished, options, listener)),
                    repro_skipped=frozen_mapping(
                        (n, s.label) for n, s in states.items() if s.node.kind == "build" and n not in runner.finished
                    ),
                )
        finally:
            if executor is not None:
                executor.shutdown()  # already done by the runner, unless a check refused the run first
            if lease is not None:
                lease.close()
        return dataclasses.replace(result, seconds=time.perf_counter() - started)

    def _frozen_summary(self, runner: Runner) -> dict:
        """--frozen: how many outputs are the lock's byte for byte, which engines are only equivalent, and each engine's
        digests against the lock's."""
        return {
            "identical": len(runner.frozen.identical),
            "equivalent": sorted(runner.frozen.equivalent),
            "engines": runner.frozen.engines([node.id for node in self.dag.of_kind("build")]),
        }

    def estimates(self, planned: dict[str, NodeState]) -> dict[str, float | None]:
        """Seconds each node that will run took the last time it ran (from the store's records; None: never ran), for
        an ETA."""
        guesses: dict[str, float | None] = {}
        for node_id, state in planned.items():
            if state.settled:
                continue
            last = self.store.memos.last_run(node_id) if self.store is not None else None
            key = last.get("key") if last else None
            record = self.store.records.get(key) if self.store is not None and isinstance(key, str) else None
            guesses[node_id] = record.get("seconds") if isinstance(record, dict) else None
        return guesses

    def _check_repro(
        self, store: Store, finished: dict[str, StageRecord], options: RunOptions, listener: Listener | None
    ) -> list:
        """Rebuild every engine of the run `options.check_repro` times in hermetic workers (the release gate)."""
        from trtflow.run.repro import check_builds

        progress = (lambda check: listener("repro", check)) if listener is not None else None
        return check_builds(self.dag, finished, store, self.resolver, options.check_repro, options.jobs, progress)

    def _create_store(self) -> Store:
        self.store = store = Store.create(self.project.store_dir)
        digests = store.memos.file_digests()
        digests.adopt(self.resolver.digests)
        self.resolver = Resolver(store, digests)
        return store

    def _remote(self, options: RunOptions) -> Remote | None:
        """The remote cache pipeline.yaml names, if any (fsspec is imported only then)."""
        url = self.project.pipeline.cache.remote
        if url is None:
            if options.remote_required:
                raise ProjectError(
                    "--remote-required: pipeline.yaml names no remote cache (add cache: {remote: s3://bucket/prefix})"
                )
            return None
        from trtflow.store.remote import Remote

        return Remote(
            url,
            self.project.pipeline.cache.options,
            required=options.remote_required,
            signer=self.signer,
            trust=self.project.trusted_keys(),
        )

    def _executor(self, options: RunOptions, planned: dict[str, NodeState], early: LocalExecutor | None) -> Executor:
        """The local executor (`early`'s, if the CLI started one), or a Ray executor (--executor ray, or executor.ray in
        pipeline.yaml; `early` is then ended) checked to have a node for every label set the stages to run need."""
        spec = self.project.pipeline.executor.ray
        stale = {s.node.id for s in planned.values() if not s.settled}
        if (options.executor or ("ray" if spec is not None else "local")) == "local" or not stale:
            return early or LocalExecutor(options.jobs)  # nothing to run: no cluster to join (corrupt stages run here)
        if early is not None:
            early.shutdown()
        from trtflow.executors.ray import RayExecutor

        spec = spec or RaySpec()
        cache = self.project.pipeline.cache
        exchange = spec.exchange or cache.remote or str(self.project.store_dir / EXCHANGE_DIR)
        labels: dict[str, dict[str, str]] = {
            node.id: self.project.pipeline.targets[required(node.info.target, node.id)].runs_on
            for node in self.dag
            if node.kind == "build"
        }
        executor = RayExecutor(
            options.jobs,
            options.ray_address or spec.address,
            exchange,
            labels,
            cache.options if exchange == cache.remote else None,
        )
        try:
            executor.check_labels(
                {f"target {self.dag.nodes[n].info.target} ({n})": labels[n] for n in sorted(stale & labels.keys())}
            )
        except BaseException:
            executor.shutdown()
            raise
        return executor

    def remembers_no_op(self, result: RunResult) -> bool:
        """Whether this finished run may be remembered as the project's no-op (runmemo): every stage found cached
        locally (or its recorded failure found, or skipped below one), no warning, and no remote cache (a run with
        one talks to it)."""
        return (
            self.store is not None
            and self.project.pipeline.cache.remote is None
            and not result.warnings
            and all(s.settled and s.reason != PULLED for s in result.nodes)
        )

    def idle_recipes(self) -> list[str]:
        """One line per recipe whose `exclude:` drops every (precision, target) pair: it has no stage at all."""
        built = {node.recipe for node in self.dag}
        return [
            f"{item.display}: exclude: drops every (precision, target) pair: it builds no engine and writes no package"
            for item in self.project.recipes
            if item.recipe.name not in built
        ]

    def store_notes(self) -> list[str]:
        """What the store did on its own while planning (a cache started anew, a malformed record set aside)."""
        return self.store.take_notes() if self.store is not None else []

    def close(self) -> None:
        """Close the store's cache."""
        if self.store is not None:
            self.store.close()


def _with_memory_budget(options: RunOptions, executor: Executor) -> RunOptions:
    """Local stages share this machine's memory: without --memory, a share of what is available now. A Ray cluster
    schedules by its own resources (None: no budget here)."""
    if options.memory is not None or not isinstance(executor, LocalExecutor):
        return options
    return dataclasses.replace(options, memory=default_budget())


def check_backends(states: dict[str, NodeState]) -> None:
    """Before any work: every build that will run has its target's backend installed (else exit 4, one line)."""
    for state in states.values():
        node = dag_node(state)
        if node.kind != "build" or state.settled:
            continue
        params = node.params_as(build_stage.Params)
        if params.backend_version is None:
            raise EnvironmentProblem(
                f"target {node.info.target} of recipe {node.recipe}: its backend {params.backend} is not "
                f"installed here: pip install 'trtflow[{BACKENDS[params.backend].extra}]'"
            )
