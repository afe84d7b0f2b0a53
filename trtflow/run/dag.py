"""Expand a project into a DAG of stage nodes, in topological order, asking each stage for its nodes.

For each recipe: [export, for a torch source] -> cleanup -> one precision node per precision -> one build per
(precision, target) -> one verify per build -> package. For the recipe `tiny` with precision fp32 and targets
rtx-ampere, rtx-ada:

    export:tiny                   (torch sources only; inputs: the factory's module file, the weights, `files`)
    cleanup:tiny                  (input: the source model and its external data files, or export's model;
                                  proves its output equal to it)
    precision:tiny/fp32           (model <- cleanup:tiny; fp16/int8... convert or quantize here, shared by targets)
    build:tiny/fp32/rtx-ampere    (model <- precision:tiny/fp32)
    verify:tiny/fp32/rtx-ampere   (model <- precision, reference <- cleanup:tiny, engine <- the build)
    build:tiny/fp32/rtx-ada, verify:tiny/fp32/rtx-ada   (likewise)
    package:tiny                  (inputs engine:fp32/<target> and verify:fp32/<target> for each target)

With int8 and calibration files, `precision:tiny/int8` also has one source per file it reads
(`calib:<path>`, `holdout:<path>`, chosen by trtflow.calibration), outputs `model` and `report`, and its
verify nodes and the package also take that report (accuracy, calibration digest) as an input.

This module knows the order of the stages and which upstream nodes each one is handed; what a node's
params are is the stage's business (stages/<kind>.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from trtflow.errors import InternalError
from trtflow.recipe.project import Project
from trtflow.stages import build, cleanup, export, package, precision, verify
from trtflow.stages.base import Node, RecipeContext
from trtflow.states import NodeState


class Dag:
    """Nodes in topological order (every node after all of its dependencies)."""

    def __init__(self, nodes: Iterable[Node]):
        self.nodes: dict[str, Node] = {node.id: node for node in nodes}

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def heights(self) -> dict[str, int]:
        """Each node's longest chain of nodes waiting on it, itself included: a package 1, its verify 2, ... a cleanup
        5. The runner starts the ready node of the longest chain first, so the longest path through a run starts
        early (with -j 2, the third model's cleanup before the first model's builds). Nodes come in dependency order,
        so walking them backwards sees every dependent of a node before the node."""
        height: dict[str, int] = {}
        below: dict[str, int] = {}
        for node in reversed(list(self)):
            height[node.id] = 1 + below.get(node.id, 0)
            for dep in node.deps:
                below[dep.node] = max(below.get(dep.node, 0), height[node.id])
        return height

    def downstream(self, node_id: str) -> list[str]:
        """Every node that depends on `node_id`, directly or not."""
        found: set[str] = {node_id}
        for node in self:
            if any(dep.node in found for dep in node.deps):
                found.add(node.id)
        return [n for n in self.nodes if n in found and n != node_id]

    def of_kind(self, kind: str) -> Dag:
        """The nodes of one stage kind (export nodes have no upstream, so they stand alone)."""
        return Dag(node for node in self if node.kind == kind)

    def for_recipes(self, names: Iterable[str]) -> Dag:
        """The nodes of the named recipes only (recipes never share nodes)."""
        wanted = set(names)
        return Dag(node for node in self if node.recipe in wanted)


def dag_node(state: NodeState) -> Node:
    """The DAG node of a state the run engine made (only the no-op memo's states hold a remembered node, and those never
    reach the engine)."""
    if not isinstance(state.node, Node):
        raise InternalError(f"{state.node.id}: a remembered node reached the run engine")
    return state.node


def dag_from_project(project: Project) -> Dag:
    """All nodes of all recipes; recipes are independent, so their nodes never cross."""
    nodes: list[Node] = []
    for item in project.recipes:
        nodes.extend(recipe_nodes(RecipeContext(item, project.root, project.pipeline)))
    return Dag(nodes)


def recipe_nodes(ctx: RecipeContext) -> list[Node]:
    """One recipe's nodes in topological order, each made by its stage from the recipe and its upstream nodes."""
    exported = export.node(ctx)
    cleaned = cleanup.node(ctx, exported)
    models = precision.nodes(ctx, cleaned)
    builds = build.nodes(ctx, models)
    if not builds:  # every pair excluded: no engine, so nothing to clean, convert or package (validate says so)
        return []
    verifies = verify.nodes(ctx, builds, cleaned)
    packaged = package.node(ctx, builds, verifies, cleaned)
    pairs = [n for pair in zip(builds, verifies, strict=True) for n in pair]
    return [*([exported] if exported else []), cleaned, *models.values(), *pairs, packaged]
