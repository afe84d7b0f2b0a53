"""Load pipeline.yaml and every recipe it names into a validated, cross-checked Project.

Every error names the file, the line and the field:
`recipes/x.yaml:12: profiles[0].inputs.input.min: min must be <= opt in every dimension`.
Paths in recipes are relative to the project root (the folder holding pipeline.yaml).
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import os
import typing
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic
from pydantic import BaseModel

from trtflow.errors import ProjectError
from trtflow.recipe.base import FieldError
from trtflow.recipe.hftasks import TASKS
from trtflow.recipe.plugins import plugin_sources
from trtflow.recipe.precision import PRECISION_MIN_COMPUTE_CAPABILITY, QUANTIZED_PRECISIONS
from trtflow.recipe.project import PIPELINE_FILE, Project, RecipeFile, format_loc
from trtflow.recipe.refusals import Refusal
from trtflow.recipe.schema import InputShape, Pipeline, Recipe, TargetSpec
from trtflow.recipe.source import HuggingFaceSource, TensorFlowSource, TorchInput, TorchSource
from trtflow.recipe.yamlfile import YamlDocument, load_yaml
from trtflow.util.cc import ComputeCapability
from trtflow.util.reads import note_glob

if TYPE_CHECKING:
    pass

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def _models_in(annotation: Any) -> set[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, lists, dicts and unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    return set().union(*(_models_in(arg) for arg in typing.get_args(annotation)))


def _keys_at(model: type[BaseModel], path: tuple) -> set[str]:
    """The keys allowed where `path` points: the fields of the models found by following it (list indexes and dict
    keys along it are stepped over)."""
    current = {model}
    for part in path:
        fields = [m.model_fields[part] for m in current if isinstance(part, str) and part in m.model_fields]
        current = set().union(*(_models_in(field.annotation) for field in fields)) or current
    return set().union(*(set(m.model_fields) for m in current))


def _unknown_key(loc: tuple, model: Any) -> str:
    """`unknown key 'precison'; did you mean 'precisions'?` when a key allowed there is near."""
    keys = sorted(_keys_at(model, loc[:-1])) if isinstance(model, type) and issubclass(model, BaseModel) else []
    near = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    return f"unknown key {loc[-1]!r}" + (f"; did you mean {near[0]!r}?" if near else "")


def _error_lines(document: YamlDocument, display: str, exc: pydantic.ValidationError, model: Any = None) -> list[str]:
    """One `file:line: field: message` per problem, in file order."""
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        message = str(cause) if cause is not None else error["msg"]
        if isinstance(cause, FieldError):
            loc = loc + (cause.field,)
        elif error["type"] == "extra_forbidden":
            message = _unknown_key(loc, model)
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] == "literal_error":
            message = f"{error['input']!r} is not one of {error['ctx']['expected']}"
        message = message.removeprefix("Value error, ")
        lines.append((document.line_of(loc), f"{display}:{document.line_of(loc)}: {format_loc(loc)}: {message}"))
    return [text for _, text in sorted(lines, key=lambda item: item[0])]


def _validate(model: type[BaseModel], document: YamlDocument, display: str, extra: dict | None = None) -> Any:
    """Validate a file's mapping against its model; top-level `x-...` keys are the author's (YAML anchors live
    there)."""
    if not isinstance(document.data, dict):
        raise ProjectError(f"{display}:1: the file must hold a mapping of keys")
    data = {
        **(extra or {}),
        **{k: v for k, v in document.data.items() if not (isinstance(k, str) and k.startswith("x-"))},
    }
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ProjectError("\n".join(_error_lines(document, display, exc, model))) from exc


def load_project(root: Path, keep_refusals: bool = False) -> Project:
    """Load and cross-check pipeline.yaml and every recipe it names; raises ProjectError on any problem. Pairs that
    cannot be built are listed all at once (every recipe's), or kept in `RecipeFile.refusals` for `validate`."""
    root = root.resolve()
    if not os.path.lexists(root / PIPELINE_FILE):
        raise ProjectError(f"{PIPELINE_FILE}: not found in {root} (run trtflow in the project folder or pass -C DIR)")
    pipeline_doc = load_yaml(root / PIPELINE_FILE, PIPELINE_FILE)
    pipeline = _validate(Pipeline, pipeline_doc, PIPELINE_FILE)
    _check_output_folders(root, pipeline, pipeline_doc)
    recipes = tuple(_load_recipe(root, path, pipeline) for path in _recipe_paths(root, pipeline, pipeline_doc))
    _check_unique_names(recipes)
    project = Project(root=root, pipeline=pipeline, recipes=recipes)
    project.trusted_keys()  # a missing or malformed key is a project error now, not in the middle of a run
    if not keep_refusals:
        project.refuse([refusal for item in recipes for refusal in item.refusals])
    return project


def _check_output_folders(root: Path, pipeline: Pipeline, document: YamlDocument) -> None:
    """`store:` and `packages:` name folders (or nothing yet), not files; the lock file is a file."""
    for field in ("store", "packages"):
        path = root / getattr(pipeline, field)
        if path.exists() and not path.is_dir():
            raise ProjectError(
                f"{PIPELINE_FILE}:{document.line_of((field,))}: {field}: {getattr(pipeline, field)} is a file, not a "
                "folder"
            )
    lock = root / "trtflow.lock"
    if lock.exists() and not lock.is_file():
        raise ProjectError("trtflow.lock: not a regular file (remove it: `trtflow run` writes it)")


def _recipe_paths(root: Path, pipeline: Pipeline, document: YamlDocument) -> list[Path]:
    """The recipe files the patterns match, each once, never pipeline.yaml itself or a file under the outputs
    (a `**` pattern, perhaps through a symlink, would otherwise read them as recipes)."""
    paths: list[Path] = []
    seen = {(root / PIPELINE_FILE).resolve()}
    outputs = [(root / pipeline.store).resolve(), (root / pipeline.packages).resolve()]
    for index, pattern in enumerate(pipeline.recipes):
        found = glob.glob(str(root / pattern), recursive=True)
        note_glob("glob", str(root / pattern), found)
        matches = [Path(p) for p in sorted(found)]
        kept = [m for m in matches if _is_recipe_file(m, seen, outputs)]
        if not kept:
            raise ProjectError(
                f"{PIPELINE_FILE}:{document.line_of(('recipes', index))}: recipes[{index}]: no file matches {pattern!r}"
            )
        paths.extend(kept)
    return paths


def _is_recipe_file(path: Path, seen: set[Path], outputs: list[Path]) -> bool:
    """A file not seen yet (by its resolved path), outside the output folders; remembers it."""
    try:
        real = path.resolve()
    except (RuntimeError, OSError):  # a symlink loop: load_yaml names it
        return True
    if real in seen or any(real.is_relative_to(folder) for folder in outputs):
        return False
    seen.add(real)
    return True


def _load_recipe(root: Path, path: Path, pipeline: Pipeline) -> RecipeFile:
    display = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    document = load_yaml(path, display)
    recipe = _validate(Recipe, document, display, extra={"name": path.stem})
    item = RecipeFile(recipe=recipe, path=path, display=display, document=document)
    _check_targets(item, pipeline)
    _check_excludes(item, pipeline)
    _check_source_exists(item, root)
    plugin_sources(item, root)  # each library exists, a regular file, named plainly
    _check_calibration_declared(item)
    return dataclasses.replace(item, refusals=tuple(_capability_refusals(item, pipeline)))


def _check_targets(item: RecipeFile, pipeline: Pipeline) -> None:
    for index, name in enumerate(item.recipe.targets or []):
        if name not in pipeline.targets:
            known = ", ".join(pipeline.targets)
            raise ProjectError(
                f"{item.where('targets', index)}: unknown target {name!r} (pipeline.yaml defines: {known})"
            )


def _check_excludes(item: RecipeFile, pipeline: Pipeline) -> None:
    """Every `exclude:` entry drops at least one pair the recipe would build (a typo must not pass silently)."""
    recipe, targets = item.recipe, item.target_names(pipeline)
    for index, rule in enumerate(recipe.exclude):
        if not any(rule.matches(p, t) for p in recipe.precisions for t in targets):
            raise ProjectError(
                f"{item.where('exclude', index)}: matches nothing this recipe builds "
                f"(precisions: {', '.join(recipe.precisions)}; targets: {', '.join(targets)})"
            )


def _check_calibration_declared(item: RecipeFile) -> None:
    """Before any work: int8/fp8 have calibration data."""
    for index, precision in enumerate(item.recipe.precisions):
        if precision in QUANTIZED_PRECISIONS and item.recipe.calibration is None:
            raise ProjectError(
                f"{item.where('precisions', index)}: {precision} needs calibration data: add calibration: "
                f"{{data: ...}} "
                "(or calibration: {random: true} to calibrate on random inputs, recorded in the manifest)"
            )


def _capability_refusals(item: RecipeFile, pipeline: Pipeline) -> list[Refusal]:
    """Every (precision, target) pair not excluded whose target has a GPU too old for the precision."""
    refusals = []
    for index, precision in enumerate(item.recipe.precisions):
        for name in item.target_names(pipeline):
            problem = (
                None
                if item.recipe.excluded(precision, name)
                else _capability_problem(item.recipe, precision, name, pipeline.targets[name])
            )
            if problem:
                refusals.append(Refusal(item.display, item.where("precisions", index), precision, name, problem))
    return refusals


def _capability_problem(recipe: Recipe, precision: str, target: str, spec: TargetSpec) -> str | None:
    """`fp8 needs compute capability >= 8.9, target rtx-ampere is sm_86`, or None when every GPU of the target fits."""
    needs = PRECISION_MIN_COMPUTE_CAPABILITY.get(precision)
    reason = ""
    if (
        precision in QUANTIZED_PRECISIONS
        and recipe.quantize.high_precision == "bf16"
        and (needs is None or needs < "sm_80")
    ):
        needs, reason = ComputeCapability("sm_80"), " (quantize.high_precision is bf16)"
    if needs is None:
        return None
    lowest = (
        ComputeCapability("sm_80") if spec.hardware_compatibility == "ampere_plus" else spec.compute_capabilities[0]
    )
    if lowest >= needs:
        return None
    how = (
        "runs on sm_80 and newer (hardware_compatibility ampere_plus)"
        if lowest != spec.compute_capabilities[0]
        else ("is " if len(spec.compute_capabilities) == 1 else "includes ") + lowest
    )
    return f"{precision} needs compute capability >= {needs.dotted}{reason}, target {target} {how}"


def _check_source_exists(item: RecipeFile, root: Path) -> None:
    source = item.recipe.source
    if source.torch is not None:
        _check_torch_source(item, source.torch, root)
        return
    if source.huggingface is not None:
        _check_hf_folder(item, source.huggingface, root)
        return
    if source.tensorflow is not None:
        _check_saved_model(item, source.tensorflow, root)
        return
    if source.keras is not None:
        _check_keras_file(item, source.keras, root)
        return
    path = item.source_path(root)
    if not path.is_file():
        raise ProjectError(f"{item.where('source', 'onnx')}: model file not found: {item.recipe.source.onnx}")


def _check_hf_folder(item: RecipeFile, source: HuggingFaceSource, root: Path) -> None:
    """source.huggingface.path is a local save_pretrained folder, and the profiles name the task's inputs."""
    folder, where = root / source.path, item.where("source", "huggingface", "path")
    if not (folder / "config.json").is_file():
        problem = (  # a hub id (org/name) is no folder here either
            f"{source.path} is not a folder here; trtflow never downloads from a hub: save the model with "
            f"save_pretrained into a folder of the project (or huggingface-cli download --local-dir) and name it"
            if not folder.is_dir()
            else f"{source.path} holds no config.json: not a save_pretrained folder"
        )
        raise ProjectError(f"{where}: {problem}")
    task = TASKS[source.task]
    for index, profile in enumerate(item.recipe.profiles):
        known = [name for name, _ in task.inputs]
        for name in profile.inputs:
            if name not in known:
                raise ProjectError(
                    f"{item.where('profiles', index, 'inputs', name)}: task {source.task} has no input {name!r} "
                    f"(its inputs: {', '.join(known)})"
                )
        for name in task.required:
            if name not in profile.inputs:
                raise ProjectError(
                    f"{item.where('profiles', index, 'inputs')}: task {source.task} needs input {name!r}: give its "
                    "min/opt/max"
                )
    if not item.recipe.profiles:
        raise ProjectError(f"{item.where('profiles')}: a huggingface source needs a profile naming its inputs")


def _check_saved_model(item: RecipeFile, tensorflow: TensorFlowSource, root: Path) -> None:
    """source.tensorflow.saved_model is a SavedModel directory (saved_model.pb or .pbtxt inside)."""
    given = tensorflow.saved_model
    folder, where = root / given, item.where("source", "tensorflow", "saved_model")
    if not folder.is_dir():
        raise ProjectError(
            f"{where}: {'is a file, not a SavedModel directory' if folder.exists() else 'no such directory'}: {given}"
        )
    if not any((folder / name).is_file() for name in SAVED_MODEL_FILES):
        raise ProjectError(
            f"{where}: {given} is not a SavedModel directory (no saved_model.pb in it); save the model with "
            "tf.saved_model.save(model, dir) or Keras' model.export(dir)"
        )


def _check_keras_file(item: RecipeFile, given: str, root: Path) -> None:
    """source.keras is a Keras 3 .keras archive (a zip) or a legacy .h5 file."""
    where = item.where("source", "keras")
    path = root / given
    if path.is_dir():
        raise ProjectError(
            f"{where}: {given} is a directory, not a .keras or .h5 file (for a SavedModel directory use "
            "source.tensorflow.saved_model)"
        )
    if not path.is_file():
        raise ProjectError(f"{where}: model file not found: {given}")
    if path.suffix not in (".keras", ".h5"):
        raise ProjectError(
            f"{where}: {given} is not a .keras or .h5 file (for a SavedModel directory use "
            "source.tensorflow.saved_model)"
        )
    if path.suffix == ".keras" and not zipfile.is_zipfile(path):
        raise ProjectError(
            f"{where}: {given} is not a Keras 3 .keras archive (not a zip file); save it with model.save('{path.name}')"
        )


def _check_torch_source(item: RecipeFile, torch: TorchSource, root: Path) -> None:
    """The factory's module and every named file exist, and the inputs agree with the profiles."""
    item.factory_file(root)
    for loc, path in ((("weights",), torch.weights), *((("files", i), p) for i, p in enumerate(torch.files))):
        if path is not None and not (root / path).is_file():
            raise ProjectError(f"{item.where('source', 'torch', *loc)}: file not found: {path}")
    declared = {spec.name: index for index, spec in enumerate(torch.inputs)}
    for index, profile in enumerate(item.recipe.profiles):
        for name, shape in profile.inputs.items():
            if name not in declared:
                raise ProjectError(
                    f"{item.where('profiles', index, 'inputs', name)}: the model has no input {name!r} "
                    f"(source.torch.inputs: {', '.join(declared)})"
                )
            _check_torch_rank(item, ("profiles", index, "inputs", name), torch.inputs[declared[name]], shape)
    profiled = set(item.recipe.profiles[0].inputs) if item.recipe.profiles else set()
    for index, spec in enumerate(torch.inputs):
        if spec.shape is None and spec.name not in profiled:
            raise ProjectError(
                f"{item.where('source', 'torch', 'inputs', index)}: input {spec.name!r} needs a shape: "
                "give shape: [...] or its min/opt/max in the profiles"
            )
        _check_torch_example(item, index, spec)


def _check_torch_rank(item: RecipeFile, loc: tuple, spec: TorchInput, shape: InputShape) -> None:
    if spec.shape is not None and len(shape.triple()[0]) != len(spec.shape):
        field = "shape" if shape.shape is not None else "min"
        raise ProjectError(
            f"{item.where(*loc, field)}: rank {len(shape.triple()[0])} but source.torch.inputs "
            f"gives {spec.name!r} rank {len(spec.shape)}"
        )


def _check_torch_example(item: RecipeFile, index: int, spec: TorchInput) -> None:
    """A declared example shape lies within the range the profiles span (the range the export makes dynamic)."""
    shapes = [s for p in item.recipe.profiles if spec.name in p.inputs for s in p.inputs[spec.name].triple()]
    if spec.shape is None or not shapes:
        return
    low, high = [min(dims) for dims in zip(*shapes, strict=False)], [max(dims) for dims in zip(*shapes, strict=False)]
    if not all(a <= s <= b for a, s, b in zip(low, spec.shape, high, strict=False)):
        raise ProjectError(
            f"{item.where('source', 'torch', 'inputs', index, 'shape')}: {spec.shape} is outside the "
            f"profiles' range for {spec.name!r}: {low}..{high}"
        )


def _check_unique_names(recipes: tuple[RecipeFile, ...]) -> None:
    seen: dict[str, RecipeFile] = {}
    for item in recipes:
        name = item.recipe.name
        if name in seen:
            raise ProjectError(f"{item.where('name')}: recipe name {name!r} is also used by {seen[name].display}")
        seen[name] = item
