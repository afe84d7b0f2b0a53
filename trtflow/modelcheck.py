"""Check a recipe against its ONNX model before any work: parseable, and profiles that fit its inputs.

For a torch source: the factory's module parses and defines the callable (its code is not run here). A TensorFlow
or Keras source is checked for its files when the recipe loads; its inputs only the export stage can read.

Runs in `trtflow validate` and before `trtflow run` touches the store, so a bad model or a profile
naming a missing input is one clear error naming the recipe field, with nothing written.
Only the graph is read (external weights are not loaded, only looked for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from trtflow.errors import ProjectError
from trtflow.recipe.pymodule import top_level_names
from trtflow.backends.limits import describe, unsupported_nodes
from trtflow.recipe.load import RecipeFile
from trtflow.recipe.schema import Pipeline
from trtflow.stages.modelfile import external_locations
from trtflow.util.onnxio import model_io

Dims = list[Optional[int]]  # None marks a dynamic dimension


def check_recipe_model(item: RecipeFile, root: Path, pipeline: Pipeline) -> None:
    """Raise ProjectError if the model does not parse, the profiles do not fit its inputs, or a target's backend
    cannot compile its fp32 graph (an exported or reduced-precision graph is checked by the build stage)."""
    if item.recipe.source.torch is not None:
        check_torch_factory(item, root)
        return
    if item.recipe.source.exported:  # a SavedModel or Keras file: only TensorFlow can read it, in the export stage
        return
    model = _load(item, item.source_path(root))
    _check_backend_limits(item, model, pipeline)
    inputs = {t.name: t.static_dims for t in model_io(model).inputs}
    _check_profile_names(item, inputs)
    _check_dynamic_inputs_covered(item, inputs)
    for index, profile in enumerate(item.recipe.profiles):
        for name, shape in profile.inputs.items():
            _check_shape(item, ("profiles", index, "inputs", name), inputs[name], shape.triple())


def check_torch_factory(item: RecipeFile, root: Path) -> None:
    """The factory's module parses and binds the callable's name: read, never run (the export stage runs it).

    The inputs were checked against the profiles when the recipe loaded; whether the model accepts them
    only running it can tell.
    """
    module, attribute = item.recipe.source.torch.factory.split(":")
    path = item.factory_file(root)
    shown = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    where = item.where("source", "torch", "factory")
    try:
        names = top_level_names(path)
    except SyntaxError as exc:
        raise ProjectError(f"{where}: cannot import {module!r}: {shown}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise ProjectError(f"{where}: cannot read {shown}: {exc}") from None
    if names is not None and attribute.split(".")[0] not in names:
        raise ProjectError(f"{where}: module {module!r} ({shown}) defines no {attribute.split('.')[0]!r}")


def _load(item: RecipeFile, path: Path) -> Any:
    """The source model's graph (weights not loaded), with every external data file it names present."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:
        raise ProjectError(f"{item.where('source', 'onnx')}: cannot parse ONNX model {item.recipe.source.onnx}: {_first_line(exc)}") from None
    if not model.graph.node and not model.graph.output:
        raise ProjectError(f"{item.where('source', 'onnx')}: {item.recipe.source.onnx} holds no ONNX graph")
    _check_external_data(item, model, path)
    _check_acyclic(item, model)
    return model


def _check_acyclic(item: RecipeFile, model: Any) -> None:
    """A node that (through others) consumes its own output makes a cycle no tool can order: refuse it by name."""
    producers = {output: index for index, node in enumerate(model.graph.node) for output in node.output if output}
    waiting = {index: {producers[name] for name in node.input if name in producers} for index, node in enumerate(model.graph.node)}
    ready = [index for index, deps in waiting.items() if not deps]
    consumers: dict[int, list[int]] = {}
    for index, deps in waiting.items():
        for dep in deps:
            consumers.setdefault(dep, []).append(index)
    while ready:
        done = ready.pop()
        for user in consumers.get(done, []):
            waiting[user].discard(done)
            if not waiting[user]:
                ready.append(user)
        waiting.pop(done)
    if waiting:
        node = model.graph.node[min(waiting)]
        raise ProjectError(f"{item.where('source', 'onnx')}: the graph has a cycle through node {node.name or node.op_type!r} "
                           f"({len(waiting)} node(s) depend on their own outputs): not a valid ONNX model")


def _check_backend_limits(item: RecipeFile, model: Any, pipeline: Pipeline) -> None:
    """An fp32 pair whose target cannot compile some node of the graph: name the nodes and how to drop the pair."""
    for precision, target in item.pairs(pipeline):
        spec = pipeline.targets[target]
        found = {cc: unsupported_nodes(spec.backend, cc, model) for cc in spec.compute_capabilities} if precision == "fp32" else {}
        for cc, nodes in found.items():
            if nodes:
                index = item.recipe.precisions.index(precision)
                raise ProjectError(f"{item.where('precisions', index)}: {precision} cannot build for target {target} ({cc}) with "
                                   f"{spec.backend}: {describe(nodes)}; drop the pair with "
                                   f"exclude: [{{precision: {precision}, target: {target}}}], or build fp16 for it")


def _check_external_data(item: RecipeFile, model: Any, path: Path) -> None:
    """Every weights file the graph names is beside it (the message planning gives too, see plan.Resolver)."""
    try:
        locations = external_locations(model, path)
    except ValueError as exc:
        raise ProjectError(f"{item.where('source', 'onnx')}: {exc}") from None
    for location in locations:
        if not (path.parent / location).is_file():
            raise ProjectError(f"{item.where('source', 'onnx')}: external data file {location} not found beside {path.name}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _check_profile_names(item: RecipeFile, inputs: dict[str, Dims]) -> None:
    for index, profile in enumerate(item.recipe.profiles):
        for name in profile.inputs:
            if name not in inputs:
                known = ", ".join(inputs) or "none"
                raise ProjectError(f"{item.where('profiles', index, 'inputs', name)}: the model has no input {name!r} (its inputs: {known})")


def _check_dynamic_inputs_covered(item: RecipeFile, inputs: dict[str, Dims]) -> None:
    named = set(item.recipe.profiles[0].inputs) if item.recipe.profiles else set()
    for name, dims in inputs.items():
        if None in dims and name not in named:
            shown = "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"
            raise ProjectError(f"{item.where('profiles')}: input {name!r} has dynamic shape {shown}: give its min/opt/max in every profile")


def _check_shape(item: RecipeFile, loc: tuple, dims: Dims, triple: tuple) -> None:
    for field, shape in zip(("min", "opt", "max"), triple):
        if len(shape) != len(dims):
            raise ProjectError(f"{item.where(*loc, field)}: rank {len(shape)} but the model's input has rank {len(dims)}")
        for axis, (want, have) in enumerate(zip(dims, shape)):
            if want is not None and want != have:
                raise ProjectError(f"{item.where(*loc, field)}: dimension {axis} is fixed to {want} in the model, not {have}")
