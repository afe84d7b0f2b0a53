"""Check a recipe against its ONNX model before any work: parseable, and profiles that fit its inputs.

For a torch source: the factory's module parses and defines the callable (its code is not run here).

Runs in `trtflow validate` and before `trtflow run` touches the store, so a bad model or a profile
naming a missing input is one clear error naming the recipe field, with nothing written.
Only the graph is read (external weights are not loaded, only looked for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from trtflow.errors import ProjectError
from trtflow.recipe.pymodule import top_level_names
from trtflow.recipe.load import RecipeFile
from trtflow.stages.modelfile import external_locations
from trtflow.util.onnxio import model_io

Dims = list[Optional[int]]  # None marks a dynamic dimension


def check_recipe_model(item: RecipeFile, root: Path) -> None:
    """Raise ProjectError if the model does not parse or the profiles do not fit its inputs."""
    if item.recipe.source.torch is not None:
        check_torch_factory(item, root)
        return
    inputs = model_inputs(item, item.source_path(root))
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


def model_inputs(item: RecipeFile, path: Path) -> dict[str, Dims]:
    """The model's real inputs (initializers excluded) and their dimensions."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:
        raise ProjectError(f"{item.where('source', 'onnx')}: cannot parse ONNX model {item.recipe.source.onnx}: {_first_line(exc)}") from None
    if not model.graph.node and not model.graph.output:
        raise ProjectError(f"{item.where('source', 'onnx')}: {item.recipe.source.onnx} holds no ONNX graph")
    _check_external_data(item, model, path)
    return {t.name: t.static_dims for t in model_io(model).inputs}


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
