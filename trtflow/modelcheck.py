"""Check a recipe against its ONNX model before any work: parseable, and profiles that fit its inputs.

For a torch source: the factory's module parses and defines the callable (its code is not run here). A TensorFlow
or Keras source is checked for its files when the recipe loads; its inputs only the export stage can read.

Runs in `trtflow validate` and before `trtflow run` touches the store, so a bad model or a profile
naming a missing input is one clear error naming the recipe field, with nothing written.
Only the graph is read (external weights are not loaded, only looked for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.backends.base import backend_version, get_backend
from trtflow.backends.limits import describe, unbuildable_nodes, unsupported_nodes, way_out
from trtflow.errors import ProjectError, required
from trtflow.recipe.precision import QUANTIZED_PRECISIONS
from trtflow.recipe.project import RecipeFile
from trtflow.recipe.pymodule import top_level_names
from trtflow.recipe.refusals import Refusal
from trtflow.recipe.schema import Pipeline, TargetSpec
from trtflow.stages.modelfile import external_locations
from trtflow.util.onnxio import model_io

Dims = list[int | None]  # None marks a dynamic dimension
# What ModelOpt's ONNX PTQ places Q/DQ on (int8's and fp8's compute ops; the rest only follows them): a graph with
# none of these comes out with nothing quantized (measured: a 2-layer LSTM, ModelOpt 0.47).
PTQ_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def check_recipe_model(item: RecipeFile, root: Path, pipeline: Pipeline) -> list[Refusal]:
    """Raise ProjectError if the model does not parse or the profiles do not fit its inputs; return the pairs that
    cannot be built, known from the graph (a target's backend cannot compile its fp32 graph; int8/fp8 of a graph
    with no node ModelOpt quantizes). An exported or reduced-precision graph is checked by the build stage."""
    if item.recipe.source.torch is not None:
        check_torch_factory(item, root)
        return []
    if item.recipe.source.exported:  # a SavedModel or Keras file: only TensorFlow can read it, in the export stage
        return []
    model = _load(item, item.source_path(root))
    refusals = _backend_limit_refusals(item, model, pipeline) + _quantizable_refusals(item, model, pipeline)
    inputs = {t.name: t.static_dims for t in model_io(model).inputs}
    _check_profile_names(item, inputs)
    _check_dynamic_inputs_covered(item, inputs)
    for index, profile in enumerate(item.recipe.profiles):
        for name, shape in profile.inputs.items():
            _check_shape(item, ("profiles", index, "inputs", name), inputs[name], shape.triple())
    _check_shared_axes(item, {t.name: t.dims or [] for t in model_io(model).inputs})
    _check_input_values(item, model)
    return refusals


def _check_input_values(item: RecipeFile, model: Any) -> None:
    """`inputs:` names integer inputs of the model: values for a float input or a typo are refused by name."""
    from trtflow.util.inputvalues import inferred_values

    integers = set(inferred_values(model))
    names = [t.name for t in model_io(model).inputs]
    for name in item.recipe.inputs:
        if name not in integers:
            problem = "is not an integer input: values apply to integer inputs" if name in names else "is no input"
            raise ProjectError(
                f"{item.where('inputs', name)}: {name!r} {problem} of the model (its inputs: {', '.join(names)})"
            )


def unknown_integer_inputs(item: RecipeFile, root: Path) -> list[str]:
    """One line per integer input of an ONNX source whose values neither its graph nor the recipe tells: trtflow
    draws 0-7 for it, which may be wrong."""
    from trtflow.util.inputvalues import inferred_values

    if item.recipe.source.onnx is None:
        return []
    found = inferred_values(_load(item, item.source_path(root)))
    return [
        f"{item.display}: integer input {name!r} indexes no table and is used as no mask: trtflow draws 0-7 for it; "
        f"set inputs: {{{name}: {{values: [LOWEST, HIGHEST]}}}} if the model takes other values"
        for name, values in found.items()
        if values is None and name not in item.recipe.inputs
    ]


def _check_shared_axes(item: RecipeFile, dims: dict[str, list]) -> None:
    """Axes the graph names alike (`batch`, `sequence` of input_ids and attention_mask) take one size in each of a
    profile's min, opt and max: the runtime would refuse the pair of shapes the engine was built for."""
    for index, profile in enumerate(item.recipe.profiles):
        for which in ("min", "opt", "max"):
            seen: dict[str, tuple[str, int]] = {}
            for name, shape in profile.inputs.items():
                triple = dict(zip(("min", "opt", "max"), shape.triple(), strict=True))
                for axis, symbol in enumerate(dims.get(name, [])):
                    if not isinstance(symbol, str) or axis >= len(triple[which]):
                        continue
                    size = triple[which][axis]
                    first, first_size = seen.setdefault(symbol, (name, size))
                    if size != first_size:
                        raise ProjectError(
                            f"{item.where('profiles', index, 'inputs', name, which)}: axis {axis} is {symbol!r} in "
                            f"the model, shared with {first}, which is {first_size} there, not {size}"
                        )


def check_exported_model(item: RecipeFile, exported: Path, pipeline: Pipeline) -> list[Refusal]:
    """The pairs a torch, Hugging Face or TensorFlow source cannot be built for, read from its cached export (the
    source itself only its framework can read): the same refusals an ONNX source gets."""
    from trtflow.util.onnxio import load_graph_only

    model = load_graph_only(exported)
    return _backend_limit_refusals(item, model, pipeline) + _quantizable_refusals(item, model, pipeline)


def check_builder_options(item: RecipeFile, pipeline: Pipeline) -> None:
    """Every `build:` option the recipe sets exists in the installed backend of each of its targets (a one-line
    error naming the option, the backend and its version; the backend is imported only when an option is set)."""
    names = set(item.recipe.build.model_dump(exclude_defaults=True))
    for target in item.target_names(pipeline) if names else []:
        backend = pipeline.targets[target].backend
        version = backend_version(backend)
        # absent: check_backends
        missing = get_backend(backend).unsupported_options(names) if version is not None else []
        if missing:
            raise ProjectError(
                f"{item.where('build', missing[0])}: {backend} {version} (target {target}) has no {missing[0]} "
                f"setting; remove it, or use a {backend} release that has it (see docs: builder options)"
            )


def check_torch_factory(item: RecipeFile, root: Path) -> None:
    """The factory's module parses and binds the callable's name: read, never run (the export stage runs it).

    The inputs were checked against the profiles when the recipe loaded; whether the model accepts them
    only running it can tell.
    """
    module, attribute = required(item.recipe.source.torch, "source.torch").factory.split(":")
    path = item.factory_file(root)
    shown = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    where = item.where("source", "torch", "factory")
    try:
        names = top_level_names(path)
    except SyntaxError as exc:
        raise ProjectError(f"{where}: cannot import {module!r}: {shown}:{exc.lineno}: SyntaxError: {exc.msg}") from exc
    except (OSError, ValueError) as exc:
        raise ProjectError(f"{where}: cannot read {shown}: {exc}") from exc
    if names is not None and attribute.split(".")[0] not in names:
        raise ProjectError(f"{where}: module {module!r} ({shown}) defines no {attribute.split('.')[0]!r}")


def _load(item: RecipeFile, path: Path) -> Any:
    """The source model's graph (weights not loaded), with every external data file it names present."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:
        raise ProjectError(
            f"{item.where('source', 'onnx')}: cannot parse ONNX model {item.recipe.source.onnx}: {_first_line(exc)}"
        ) from exc
    if not model.graph.node and not model.graph.output:
        raise ProjectError(f"{item.where('source', 'onnx')}: {item.recipe.source.onnx} holds no ONNX graph")
    _check_external_data(item, model, path)
    _check_acyclic(item, model)
    return model


def _check_acyclic(item: RecipeFile, model: Any) -> None:
    """A node that (through others) consumes its own output makes a cycle no tool can order: refuse it by name."""
    producers = {output: index for index, node in enumerate(model.graph.node) for output in node.output if output}
    waiting = {
        index: {producers[name] for name in node.input if name in producers}
        for index, node in enumerate(model.graph.node)
    }
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
        raise ProjectError(
            f"{item.where('source', 'onnx')}: the graph has a cycle through node {node.name or node.op_type!r} "
            f"({len(waiting)} node(s) depend on their own outputs): not a valid ONNX model"
        )


def _backend_limit_refusals(item: RecipeFile, model: Any, pipeline: Pipeline) -> list[Refusal]:
    """Each pair whose target's backend cannot build an op of the graph at all (NMS on TensorRT-RTX), and each fp32
    pair whose target cannot compile some node, naming the nodes."""
    refusals = []
    for precision, target in item.pairs(pipeline):
        problem = _pair_problem(precision, target, pipeline.targets[target], model)
        if problem:
            where = item.where("precisions", item.recipe.precisions.index(precision))
            refusals.append(Refusal(item.display, where, precision, target, problem))
    return refusals


def _pair_problem(precision: str, target: str, spec: TargetSpec, model: Any) -> str | None:
    """Why the graph cannot be built for this (precision, target), with the way out; None when nothing says so."""
    never = unbuildable_nodes(spec.backend, model)
    if never:
        return (
            f"{precision} cannot build for target {target} with {spec.backend}: {describe(never)} "
            f"({way_out(spec.backend, never)}; or exclude the pair)"
        )
    for cc in spec.compute_capabilities if precision == "fp32" else []:
        nodes = unsupported_nodes(spec.backend, cc, model)
        if nodes:
            return (
                f"{precision} cannot build for target {target} ({cc}) with {spec.backend}: {describe(nodes)} "
                "(build fp16 for it, or exclude the pair)"
            )
    return None


def _quantizable_refusals(item: RecipeFile, model: Any, pipeline: Pipeline) -> list[Refusal]:
    """int8/fp8 of a graph with no node of the kinds ModelOpt's PTQ quantizes (an LSTM-only model): refused before
    calibration is run for nothing."""
    ops = {node.op_type for node in model.graph.node}
    if ops & set(PTQ_OP_TYPES):
        return []
    built = {precision for precision, _ in item.pairs(pipeline)}
    shown = ", ".join(sorted(ops)[:6]) + (" ..." if len(ops) > 6 else "")
    return [
        Refusal(
            item.display,
            item.where("precisions", index),
            precision,
            None,
            f"{precision}: ModelOpt PTQ quantizes {', '.join(PTQ_OP_TYPES)} nodes and this model has none (its ops: "
            f"{shown})",
        )
        for index, precision in enumerate(item.recipe.precisions)
        if precision in QUANTIZED_PRECISIONS and precision in built
    ]


def _check_external_data(item: RecipeFile, model: Any, path: Path) -> None:
    """Every weights file the graph names is beside it (the message planning gives too, see plan.Resolver)."""
    try:
        locations = external_locations(model, path)
    except ValueError as exc:
        raise ProjectError(f"{item.where('source', 'onnx')}: {exc}") from exc
    for location in locations:
        if not (path.parent / location).is_file():
            raise ProjectError(
                f"{item.where('source', 'onnx')}: external data file {location} not found beside {path.name}"
            )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _check_profile_names(item: RecipeFile, inputs: dict[str, Dims]) -> None:
    for index, profile in enumerate(item.recipe.profiles):
        for name in profile.inputs:
            if name not in inputs:
                known = ", ".join(inputs) or "none"
                raise ProjectError(
                    f"{item.where('profiles', index, 'inputs', name)}: the model has no input {name!r} (its inputs: "
                    f"{known})"
                )


def _check_dynamic_inputs_covered(item: RecipeFile, inputs: dict[str, Dims]) -> None:
    named = set(item.recipe.profiles[0].inputs) if item.recipe.profiles else set()
    for name, dims in inputs.items():
        if None in dims and name not in named:
            shown = "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"
            raise ProjectError(
                f"{item.where('profiles')}: input {name!r} has dynamic shape {shown}: give its min/opt/max in every "
                "profile"
            )


def _check_shape(item: RecipeFile, loc: tuple, dims: Dims, triple: tuple) -> None:
    for field, shape in zip(("min", "opt", "max"), triple, strict=True):
        if len(shape) != len(dims):
            raise ProjectError(
                f"{item.where(*loc, field)}: rank {len(shape)} but the model's input has rank {len(dims)}"
            )
        for axis, (want, have) in enumerate(zip(dims, shape, strict=True)):
            if want is not None and want != have:
                raise ProjectError(
                    f"{item.where(*loc, field)}: dimension {axis} is fixed to {want} in the model, not {have}"
                )
