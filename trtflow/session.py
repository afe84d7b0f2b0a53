"""One project opened for planning or running: the wiring between recipes, DAG, store and runner.

The CLI, the tests and the benchmarks all go through this, so a no-op run costs the same everywhere.
Nothing is written until `run` has planned and pre-checked every model it is about to use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from trtflow.dag import Dag, dag_from_project
from trtflow.hashing import FileDigests
from trtflow.modelcheck import check_recipe_model
from trtflow.plan import CACHED, NodeState, Resolver, plan
from trtflow.recipe import Project, load_project
from trtflow.runner import Listener, RunOptions, Runner
from trtflow.store import Store


class Session:
    def __init__(self, project: Project, recipes: Iterable[str] = ()):
        self.project = project
        names = list(recipes)
        for name in names:
            project.recipe(name)  # raises a ProjectError naming the known recipes
        full = dag_from_project(project)
        self.dag: Dag = full.for_recipes(names) if names else full
        self.store: Optional[Store] = Store.existing(project.store_dir)
        digests = self.store.file_digests() if self.store else FileDigests()
        self.resolver = Resolver(self.store, digests)

    @classmethod
    def open(cls, root: Path, recipes: Iterable[str] = ()) -> "Session":
        return cls(load_project(root), recipes)

    def plan(self, force: bool = False) -> dict[str, NodeState]:
        return plan(self.dag, self.resolver, force)

    def check_models(self, states: Optional[dict[str, NodeState]] = None) -> None:
        """Parse every model that will be used (all of them if `states` is None) against its recipe."""
        for item in self.project.recipes:
            node = self.dag.nodes.get(f"cleanup:{item.recipe.name}")
            if node is not None and (states is None or states[node.id].status != CACHED):
                check_recipe_model(item, self.project.root)

    def run(self, options: RunOptions, listener: Optional[Listener] = None) -> dict[str, NodeState]:
        """Plan, pre-check the models that will be read, then execute what is not cached."""
        self.check_models(self.plan(options.force))
        if self.store is None:
            self.store = Store.create(self.project.store_dir)
            digests = self.store.file_digests()
            digests.adopt(self.resolver.digests)
            self.resolver = Resolver(self.store, digests)
        runner = Runner(self.dag, self.store, self.resolver, self.project.packages_dir, options, listener)
        return runner.run()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
