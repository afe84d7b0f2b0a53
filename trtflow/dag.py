"""Expand a project into a DAG of stage nodes, in topological order.

For each recipe: cleanup -> one precision node per precision -> one build per (precision, target)
-> one verify per build -> package. For the recipe `tiny` with precision fp32 and targets rtx-ampere, rtx-ada:

    cleanup:tiny                  (input: the source model; proves its output equal to it)
    precision:tiny/fp32           (model <- cleanup:tiny; fp16/int8... convert or quantize here, shared by targets)
    build:tiny/fp32/rtx-ampere    (model <- precision:tiny/fp32)
    verify:tiny/fp32/rtx-ampere   (model <- precision, reference <- cleanup:tiny, engine <- the build)
    build:tiny/fp32/rtx-ada, verify:tiny/fp32/rtx-ada   (likewise)
    package:tiny                  (inputs engine:fp32/<target> and verify:fp32/<target> for each target)

A node's parameters and fingerprint hold only what changes its output: a target's *name* is not in a
build's key (renaming a target reuses its engines), its compute capabilities are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

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
    cleanup = _cleanup_node(item, project.root)
    precisions = {p: _precision_node(item, p, cleanup.id) for p in recipe.precisions}
    builds = [
        _build_node(recipe.name, precision, target, project.pipeline.targets[target], item, precisions[precision].id)
        for precision in recipe.precisions
        for target in item.target_names(project.pipeline)
    ]
    verifies = [_verify_node(build, item, cleanup.id) for build in builds]
    package = _package_node(recipe.name, builds, verifies, cleanup.id)
    return [cleanup, *precisions.values(), *[n for pair in zip(builds, verifies) for n in pair], package]


def _cleanup_node(item: RecipeFile, root: Path) -> Node:
    """Cleanup of the source ONNX; it proves its output equal to the source within the recipe's fp32 tolerances."""
    recipe = item.recipe
    return Node(
        id=f"cleanup:{recipe.name}",
        kind="cleanup",
        recipe=recipe.name,
        params={"profiles": plain_profiles(item), "verify": recipe.verify.model_dump()},
        fingerprint={"onnx": tool_version("onnx"), "onnxruntime": ort_version()},
        sources=(("model", item.source_path(root)),),
        info={"recipe_file": item.display},
    )


def _precision_node(item: RecipeFile, precision: str, model_node: str) -> Node:
    """One model per precision, shared by every target: fp32 passes the cleaned model through."""
    return Node(
        id=f"precision:{item.recipe.name}/{precision}",
        kind="precision",
        recipe=item.recipe.name,
        params={"precision": precision},
        fingerprint={},
        deps=(Dep("model", model_node, "model"),),
        info={"precision": precision},
    )


def ort_version() -> Optional[str]:
    """Whichever ONNX Runtime distribution is installed (the CPU one or the GPU one, never both)."""
    return tool_version("onnxruntime") or tool_version("onnxruntime-gpu")


def engine_tolerance(item: RecipeFile, precision: str) -> dict[str, float]:
    """rtol/atol for comparing an engine's outputs with the fp32 model (on a GPU): the recipe's for fp32."""
    if precision == "fp32":
        return {"rtol": item.recipe.verify.rtol, "atol": item.recipe.verify.atol}
    return dict(REDUCED_PRECISION_ENGINE_TOLERANCE[precision])


# Elementwise engine-vs-fp32 tolerances for reduced precision; the ONNX-level accuracy report is the real gate.
REDUCED_PRECISION_ENGINE_TOLERANCE = {
    "fp16": {"rtol": 1e-2, "atol": 1e-2},
    "bf16": {"rtol": 5e-2, "atol": 5e-2},
    "int8": {"rtol": 1e-1, "atol": 1e-1},
    "fp8": {"rtol": 1e-1, "atol": 1e-1},
}


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


def _verify_node(build: Node, item: RecipeFile, cleanup_id: str) -> Node:
    """Verification of one build; its fingerprint names the local GPUs, since they decide whether the engine runs."""
    verify = item.recipe.verify
    precision = build.info["precision"]
    return Node(
        id=build.id.replace("build:", "verify:", 1),
        kind="verify",
        recipe=build.recipe,
        params={"profiles": build.params["profiles"], "samples": verify.samples, "seed": verify.seed, "on_fail": verify.on_fail,
                **engine_tolerance(item, precision)},
        fingerprint={
            "onnxruntime": ort_version(),
            "local_gpus": list(local_compute_capabilities()),
            **{k: build.fingerprint[k] for k in ("backend", "backend_version", "compute_capabilities", "hardware_compatibility")},
        },
        deps=(Dep("model", f"precision:{item.recipe.name}/{precision}", "model"), Dep("reference", cleanup_id, "model"),
              Dep("engine", build.id, "engine")),
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
