"""Expand a project into a DAG of stage nodes, in topological order.

For each recipe: cleanup -> one build per (precision, target) -> one verify per build -> package.
For the recipe `tiny` with precision fp32 and targets rtx-ampere, rtx-ada:

    cleanup:tiny
    build:tiny/fp32/rtx-ampere    (input model <- cleanup:tiny)
    verify:tiny/fp32/rtx-ampere   (inputs source file, model <- cleanup:tiny, engine <- the build)
    build:tiny/fp32/rtx-ada, verify:tiny/fp32/rtx-ada   (likewise)
    package:tiny                  (inputs engine:fp32/<target> and verify:fp32/<target> for each target)

A node's parameters and fingerprint hold only what changes its output: a target's *name* is not in a
build's key (renaming a target reuses its engines), its compute capabilities are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from trtflow.backends.base import backend_version
from trtflow.device import local_compute_capabilities
from trtflow.recipe import Project, RecipeFile, TargetSpec
from trtflow.stages import STAGE_VERSIONS, tool_version


@dataclass(frozen=True)
class Dep:
    """One input of a node that another node produces: `role` <- `node`'s output `output`."""

    role: str
    node: str
    output: str


@dataclass(frozen=True)
class Node:
    id: str
    kind: str
    recipe: str
    params: dict[str, Any]
    fingerprint: dict[str, Any]
    deps: tuple[Dep, ...] = ()
    sources: tuple[tuple[str, Path], ...] = ()  # (role, file outside the store)
    info: dict[str, Any] = field(default_factory=dict)  # shown to the user, not part of the key

    @property
    def version(self) -> int:
        return STAGE_VERSIONS[self.kind]


class Dag:
    """Nodes in topological order (every node after all of its dependencies)."""

    def __init__(self, nodes: Iterable[Node]):
        self.nodes: dict[str, Node] = {node.id: node for node in nodes}

    def __iter__(self):
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def downstream(self, node_id: str) -> list[str]:
        """Every node that depends on `node_id`, directly or not."""
        found: set[str] = {node_id}
        for node in self:
            if any(dep.node in found for dep in node.deps):
                found.add(node.id)
        return [n for n in self.nodes if n in found and n != node_id]

    def for_recipes(self, names: Iterable[str]) -> "Dag":
        wanted = set(names)
        return Dag(node for node in self if node.recipe in wanted)


def dag_from_project(project: Project) -> Dag:
    """All nodes of all recipes; recipes are independent, so their nodes never cross."""
    nodes: list[Node] = []
    for item in project.recipes:
        nodes.extend(_recipe_nodes(project, item))
    return Dag(nodes)


def _recipe_nodes(project: Project, item: RecipeFile) -> list[Node]:
    recipe = item.recipe
    cleanup = Node(
        id=f"cleanup:{recipe.name}",
        kind="cleanup",
        recipe=recipe.name,
        params={},
        fingerprint={"onnx": tool_version("onnx")},
        sources=(("model", item.source_path(project.root)),),
        info={"recipe_file": item.display},
    )
    builds = [
        _build_node(recipe.name, precision, target, project.pipeline.targets[target], item, cleanup.id)
        for precision in recipe.precisions
        for target in item.target_names(project.pipeline)
    ]
    verifies = [_verify_node(build, item, project.root, cleanup.id) for build in builds]
    return [cleanup, *[n for pair in zip(builds, verifies) for n in pair], _package_node(recipe.name, builds, verifies, cleanup.id)]


def plain_profiles(item: RecipeFile) -> list[dict[str, dict[str, list[int]]]]:
    """Profiles as [{input: {min, opt, max}}], the plain form keys, backends and manifests use."""
    return [
        {name: dict(zip(("min", "opt", "max"), shape.triple())) for name, shape in profile.inputs.items()}
        for profile in item.recipe.profiles
    ]


def _build_node(recipe: str, precision: str, target: str, spec: TargetSpec, item: RecipeFile, model_node: str) -> Node:
    return Node(
        id=f"build:{recipe}/{precision}/{target}",
        kind="build",
        recipe=recipe,
        params={
            "precision": precision,
            "profiles": plain_profiles(item),
            "workspace_mib": item.recipe.build.workspace_mib,
            "optimization_level": item.recipe.build.optimization_level,
        },
        fingerprint={
            "backend": spec.backend,
            "backend_version": backend_version(spec.backend),
            "compute_capabilities": spec.compute_capabilities,
            "hardware_compatibility": spec.hardware_compatibility,
            "version_compatible": spec.version_compatible,
        },
        deps=(Dep("model", model_node, "model"),),
        info={"target": target, "precision": precision},
    )


def _verify_node(build: Node, item: RecipeFile, root: Path, model_node: str) -> Node:
    """Verification of one build; its fingerprint names the local GPUs, since they decide whether the engine runs."""
    return Node(
        id=build.id.replace("build:", "verify:", 1),
        kind="verify",
        recipe=build.recipe,
        params={"profiles": build.params["profiles"], **item.recipe.verify.model_dump()},
        fingerprint={
            "onnxruntime": tool_version("onnxruntime") or tool_version("onnxruntime-gpu"),
            "local_gpus": list(local_compute_capabilities()),
            **{k: build.fingerprint[k] for k in ("backend", "backend_version", "compute_capabilities", "hardware_compatibility")},
        },
        deps=(Dep("model", model_node, "model"), Dep("engine", build.id, "engine")),
        sources=(("source", item.source_path(root)),),
        info=build.info,
    )


def _package_node(recipe: str, builds: list[Node], verifies: list[Node], cleanup_id: str) -> Node:
    engines = [
        {"role": f"engine:{b.info['precision']}/{b.info['target']}", "verify_role": f"verify:{b.info['precision']}/{b.info['target']}",
         "target": b.info["target"], **b.params, **b.fingerprint}
        for b in builds
    ]
    deps = [Dep(e["role"], b.id, "engine") for e, b in zip(engines, builds)]
    deps += [Dep(e["verify_role"], v.id, "report") for e, v in zip(engines, verifies)]
    return Node(
        id=f"package:{recipe}",
        kind="package",
        recipe=recipe,
        params={"recipe": recipe, "engines": engines},
        fingerprint={},
        deps=(Dep("model", cleanup_id, "model"), *deps),
    )
