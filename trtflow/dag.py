"""Expand a project into a DAG of stage nodes, in topological order.

For each recipe: [export, for a torch source] -> cleanup -> one precision node per precision -> one build per
(precision, target) -> one verify per build -> package. For the recipe `tiny` with precision fp32 and targets
rtx-ampere, rtx-ada:

    export:tiny                   (torch sources only; inputs: the factory's module file, the weights, `files`)
    cleanup:tiny                  (input: the source model and its external data files, or export's model; proves its output equal to it)
    precision:tiny/fp32           (model <- cleanup:tiny; fp16/int8... convert or quantize here, shared by targets)
    build:tiny/fp32/rtx-ampere    (model <- precision:tiny/fp32)
    verify:tiny/fp32/rtx-ampere   (model <- precision, reference <- cleanup:tiny, engine <- the build)
    build:tiny/fp32/rtx-ada, verify:tiny/fp32/rtx-ada   (likewise)
    package:tiny                  (inputs engine:fp32/<target> and verify:fp32/<target> for each target)

With int8 and calibration files, `precision:tiny/int8` also has one source per file it reads
(`calib:<path>`, `holdout:<path>`, chosen by trtflow.calibration), outputs `model` and `report`, and its
verify nodes and the package also take that report (accuracy, calibration digest) as an input.

A node's parameters and fingerprint hold only what changes its output: a target's *name* is not in a
build's key (renaming a target reuses its engines), its compute capabilities are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Optional

from trtflow import calibration
from trtflow.backends.base import backend_version
from trtflow.device import local_compute_capabilities
from trtflow.precisionspec import AUTOCAST_PRECISIONS, QUANTIZED_PRECISIONS
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
    export = _export_node(item, project.root) if recipe.source.torch is not None else None
    cleanup = _cleanup_node(item, project.root, export)
    selection = calibration.plan_split(item, project.root) if set(recipe.precisions) - {"fp32"} else None
    precisions = {p: _precision_node(item, p, cleanup.id, selection, project.root) for p in recipe.precisions}
    builds = [
        _build_node(recipe.name, precision, target, project.pipeline.targets[target], item, precisions[precision].id)
        for precision in recipe.precisions
        for target in item.target_names(project.pipeline)
    ]
    verifies = [_verify_node(build, item, cleanup.id) for build in builds]
    package = _package_node(recipe.name, builds, verifies, cleanup.id)
    return [*([export] if export else []), cleanup, *precisions.values(), *[n for pair in zip(builds, verifies) for n in pair], package]


def _cleanup_node(item: RecipeFile, root: Path, export: Optional[Node]) -> Node:
    """Cleanup of the source ONNX (or of the export's); it proves its output equal to its input within the fp32 tolerances.

    An ONNX source is read in place, with every external data file its graph names (hashed as inputs
    `model.data:<location>`); `where` lets planning name the recipe field when one of them is missing.
    """
    recipe = item.recipe
    node = Node(
        id=f"cleanup:{recipe.name}",
        kind="cleanup",
        recipe=recipe.name,
        params={"profiles": plain_profiles(item), "verify": recipe.verify.model_dump(), "options": recipe.cleanup.model_dump()},
        fingerprint={"onnx": tool_version("onnx"), "onnxruntime": ort_version(), "onnxslim": tool_version("onnxslim")},
        info={"recipe_file": item.display},
    )
    if export is not None:
        return replace(node, deps=(Dep("model", export.id, "model"),))
    return replace(node, sources=(("model", item.source_path(root)),), info={**node.info, "where": item.where("source", "onnx")})


def _export_node(item: RecipeFile, root: Path) -> Node:
    """PyTorch -> ONNX. Its inputs are the factory's module file, the weights and the listed `files`, not the whole
    project: editing an unrelated file re-exports nothing. Dynamic axes come from the profiles (export_dims)."""
    spec = item.recipe.source.torch
    sources = [("factory", item.factory_file(root))]
    sources += [("weights", (root / spec.weights).resolve())] if spec.weights else []
    sources += [(f"files[{index}]", (root / path).resolve()) for index, path in enumerate(spec.files)]
    inputs, dynamic = export_dims(item)
    return Node(
        id=f"export:{item.recipe.name}",
        kind="export",
        recipe=item.recipe.name,
        params={"factory": spec.factory, "kwargs": spec.kwargs, "inputs": inputs, "dynamic": dynamic, "outputs": spec.outputs,
                "opset": spec.opset, "optimize": spec.optimize,
                "check": {k: item.recipe.verify.model_dump()[k] for k in ("rtol", "atol", "seed", "on_fail")}},
        fingerprint={"torch": tool_version("torch"), "onnx": tool_version("onnx"), "onnxscript": tool_version("onnxscript")},
        sources=tuple(sources),
        info={"recipe_file": item.display},
    )


def export_dims(item: RecipeFile) -> tuple[list[dict], dict[str, dict[str, list[int]]]]:
    """The example inputs (shape: given, else the first profile's opt) and the dynamic axes with their ranges.

    An axis is dynamic when any profile's min, opt or max differs on it; its range spans every profile:

        profiles [{x: min [1,3] opt [4,3] max [8,3]}, {x: shape [32,3]}] -> x axis 0 in [1, 32], axis 1 static
    """
    profiles = plain_profiles(item)
    inputs, dynamic = [], {}
    for spec in item.recipe.source.torch.inputs:
        shapes = [shape for profile in profiles if spec.name in profile for shape in profile[spec.name].values()]
        inputs.append({"name": spec.name, "dtype": spec.dtype, "shape": spec.shape or profiles[0][spec.name]["opt"]})
        axes = {str(axis): [min(s[axis] for s in shapes), max(s[axis] for s in shapes)]
                for axis in range(len(shapes[0]) if shapes else 0) if len({s[axis] for s in shapes}) > 1}
        if axes:
            dynamic[spec.name] = axes
    return inputs, dynamic


def _precision_node(item: RecipeFile, precision: str, model_node: str, selection: Optional[calibration.Split], root: Path) -> Node:
    """One model per precision, shared by every target: fp32 passes the cleaned model through.

    fp16/bf16 (AutoCast) read only the held-out calibration files (for their accuracy report); int8/fp8
    (PTQ) read the calibration files too, so adding a calibration sample re-quantizes without re-running AutoCast.
    """
    node = Node(id=f"precision:{item.recipe.name}/{precision}", kind="precision", recipe=item.recipe.name, params={"precision": precision},
                fingerprint={}, deps=(Dep("model", model_node, "model"),), info={"precision": precision})
    if precision == "fp32":
        return node
    spec = item.recipe.calibration
    params = {**node.params, "profiles": plain_profiles(item), "on_fail": item.recipe.verify.on_fail,
              "accuracy": {"samples": item.recipe.accuracy.samples, "seed": item.recipe.accuracy.seed,
                           "tolerance": item.recipe.accuracy.tolerance(precision)},
              "data": calibration.reading_params(spec)}
    if precision in AUTOCAST_PRECISIONS:
        params["autocast"] = item.recipe.autocast.model_dump()
    else:
        params["quantize"] = {**item.recipe.quantize.model_dump(), "method": spec.method_for(precision), "seed": spec.seed,
                              "percentile": spec.percentile_value(),
                              "samples": spec.samples if spec.random else None}
    fingerprint = {"modelopt": tool_version("nvidia-modelopt"), "onnx": tool_version("onnx"), "onnxruntime": ort_version(),
                   "numpy": tool_version("numpy")}  # numpy: calibration histograms and the accuracy numbers
    if params["data"] is not None and params["data"]["kind"] == "images":
        fingerprint["pillow"] = tool_version("pillow")
    sources = calibration.sources(selection, root, quantized=precision in QUANTIZED_PRECISIONS)
    return replace(node, params=params, fingerprint=fingerprint, sources=sources)


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
        info={"target": target, "precision": precision, "bit_reproducible": precision not in UNREPRODUCIBLE_ENGINE_PRECISIONS},
    )


# TensorRT-RTX 1.7 gives Q/DQ (int8/fp8) engines kernel names taken from memory addresses: two builds of
# the same ONNX differ in a few bytes (measured; fp32/fp16/bf16 engines are byte-identical).
UNREPRODUCIBLE_ENGINE_PRECISIONS = ("int8", "fp8")


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
              Dep("engine", build.id, "engine"), *_precision_report(item, precision)),
        info=build.info,
    )


def _precision_report(item: RecipeFile, precision: str) -> tuple[Dep, ...]:
    """A reduced precision's accuracy report (and calibration record) is an output: verify carries it into the manifest."""
    return () if precision == "fp32" else (Dep("precision_report", f"precision:{item.recipe.name}/{precision}", "report"),)


def _package_node(recipe: str, builds: list[Node], verifies: list[Node], cleanup_id: str) -> Node:
    engines = [
        {"role": f"engine:{b.info['precision']}/{b.info['target']}", "verify_role": f"verify:{b.info['precision']}/{b.info['target']}",
         "target": b.info["target"], **b.params, **b.fingerprint}
        for b in builds
    ]
    deps = [Dep(e["role"], b.id, "engine") for e, b in zip(engines, builds)]
    deps += [Dep(e["verify_role"], v.id, "report") for e, v in zip(engines, verifies)]
    # int8/fp8: the manifest records how each was calibrated, from the precision node's report
    quantized = sorted({b.info["precision"] for b in builds} & set(QUANTIZED_PRECISIONS))
    deps += [Dep(f"precision:{p}", f"precision:{recipe}/{p}", "report") for p in quantized]
    return Node(
        id=f"package:{recipe}",
        kind="package",
        recipe=recipe,
        params={"recipe": recipe, "engines": engines},
        fingerprint={},
        deps=(Dep("model", cleanup_id, "model"), *deps),
    )
