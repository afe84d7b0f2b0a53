"""The schema of pipeline.yaml and recipes/*.yaml, and loading them into a validated Project.

Every error names the file, the line and the field:
`recipes/x.yaml:12: profiles[0].inputs.input.min: min must be <= opt in every dimension`.
Paths in recipes are relative to the project root (the folder holding pipeline.yaml).
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pydantic
from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator

from trtflow.errors import ProjectError
from trtflow.precisionspec import (PRECISION_MIN_COMPUTE_CAPABILITY, QUANTIZED_PRECISIONS, SUPPORTED_PRECISIONS, AccuracyOptions,
                                   AutocastOptions, Calibration, QuantizeOptions)
from trtflow.pymodule import ModuleNotFound, module_file
from trtflow.schemabase import Dim, FieldError, StrictModel
from trtflow.sourcespec import CleanupOptions, Source, TorchInput, TorchSource  # noqa: F401 (re-exported)
from trtflow.yamlsource import YamlDocument, load_yaml

PIPELINE_FILE = "pipeline.yaml"
# Compute capabilities TensorRT-RTX 1.7 can target (its trt.ComputeCapability enum).
RTX_COMPUTE_CAPABILITIES = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def _known_precision(value: str) -> str:
    if value not in SUPPORTED_PRECISIONS:
        raise ValueError(f"unknown precision {value!r} (supported: {', '.join(SUPPORTED_PRECISIONS)})")
    return value


Precision = Annotated[str, AfterValidator(_known_precision)]
def normalize_compute_capability(value: Any) -> str:
    """Accept `sm_86`, `sm86` or `8.6` and return the canonical `sm_86`."""
    text = str(value).strip().lower()
    match = re.fullmatch(r"sm_?(\d)(\d+)|(\d+)\.(\d+)", text)
    if not match:
        raise ValueError(f"compute capability {value!r} is not of the form sm_86 or 8.6")
    major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return f"sm_{int(major)}{int(minor)}"


class TargetSpec(StrictModel):
    """One kind of GPU in the fleet, and the backend that builds for it."""

    backend: Literal["tensorrt-rtx", "tensorrt"]
    compute_capabilities: list[str] = Field(min_length=1)
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    version_compatible: bool = False

    @field_validator("compute_capabilities", mode="before")
    @classmethod
    def _canonical_ccs(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        ccs = [normalize_compute_capability(item) for item in value]
        if len(set(ccs)) != len(ccs):
            raise ValueError("compute capabilities must not repeat")
        return sorted(ccs, key=lambda cc: int(cc[3:]))

    @model_validator(mode="after")
    def _backend_options(self) -> "TargetSpec":
        if self.backend == "tensorrt-rtx":
            unsupported = [cc for cc in self.compute_capabilities if cc not in RTX_COMPUTE_CAPABILITIES]
            if unsupported:
                supported = ", ".join(RTX_COMPUTE_CAPABILITIES)
                raise FieldError("compute_capabilities", f"tensorrt-rtx cannot target {', '.join(unsupported)} (it supports {supported})")
            if self.hardware_compatibility != "none" or self.version_compatible:
                raise FieldError("backend", "hardware_compatibility and version_compatible apply to the tensorrt backend only")
        return self


CREDENTIAL_KEY = re.compile(r"secret|password|passwd|token|credential|^key$|access_key|^username$", re.IGNORECASE)


def _credential_keys(value: Any, path: str = "options") -> list[str]:
    """Dotted paths of option keys that look like credentials, at any depth."""
    if not isinstance(value, dict):
        return []
    found = []
    for key, item in value.items():
        found += [f"{path}.{key}"] if CREDENTIAL_KEY.search(str(key)) else _credential_keys(item, f"{path}.{key}")
    return found


class CacheSpec(StrictModel):
    """`cache:` in pipeline.yaml: an optional remote cache shared by machines (any fsspec URL)."""

    remote: Optional[str] = None  # s3://bucket/prefix, file:///shared/dir, gs://...
    options: dict[str, Any] = Field(default_factory=dict)  # passed to the fsspec filesystem, e.g. endpoint_url

    @field_validator("remote")
    @classmethod
    def _url(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(r"^[a-z][a-z0-9+.-]*://.+", value):
            raise ValueError(f"remote {value!r} is not a URL such as s3://bucket/prefix or file:///shared/dir")
        if value is not None and value.startswith("file://") and not value.startswith("file:///"):
            raise ValueError(f"remote {value!r}: a file:// remote needs an absolute path (file:///shared/dir)")
        return value

    @field_validator("options")
    @classmethod
    def _no_credentials(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = _credential_keys(value)
        if found:
            raise ValueError(f"{', '.join(found)}: credentials do not belong in pipeline.yaml (it is committed); "
                             "set them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...) instead")
        return value


class Pipeline(StrictModel):
    """pipeline.yaml: where outputs go, the fleet's targets, and which recipe files belong to the project."""

    store: str = "artifacts/store"
    packages: str = "artifacts/packages"
    recipes: list[str] = Field(default_factory=lambda: ["recipes/*.yaml"], min_length=1)
    targets: dict[str, TargetSpec] = Field(min_length=1)
    cache: CacheSpec = Field(default_factory=CacheSpec)

    @field_validator("targets")
    @classmethod
    def _target_names(cls, value: dict[str, TargetSpec]) -> dict[str, TargetSpec]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"target name {name!r} must match {NAME_PATTERN}")
        return value


class InputShape(StrictModel):
    """The min/opt/max shape of one input in one profile; `shape:` is shorthand for a static input."""

    min: Optional[list[Dim]] = None
    opt: Optional[list[Dim]] = None
    max: Optional[list[Dim]] = None
    shape: Optional[list[Dim]] = None

    @model_validator(mode="after")
    def _consistent(self) -> "InputShape":
        if self.shape is not None:
            if any(v is not None for v in (self.min, self.opt, self.max)):
                raise FieldError("shape", "give either shape or min/opt/max, not both")
            return self
        for name in ("min", "opt", "max"):
            if getattr(self, name) is None:
                raise FieldError(name, f"{name} is required (or give a static shape:)")
        if not len(self.min) == len(self.opt) == len(self.max):
            raise FieldError("max", "min, opt and max must have the same rank")
        if any(a > b for a, b in zip(self.min, self.opt)):
            raise FieldError("min", "min must be <= opt in every dimension")
        if any(a > b for a, b in zip(self.opt, self.max)):
            raise FieldError("max", "opt must be <= max in every dimension")
        return self

    def triple(self) -> tuple[list[int], list[int], list[int]]:
        """(min, opt, max), with a static shape repeated three times."""
        if self.shape is not None:
            return list(self.shape), list(self.shape), list(self.shape)
        return list(self.min), list(self.opt), list(self.max)  # type: ignore[arg-type]


class Profile(StrictModel):
    inputs: dict[str, InputShape] = Field(min_length=1)


class BuildOptions(StrictModel):
    """Builder settings that change the engine (and so its key)."""

    workspace_mib: Optional[int] = Field(default=None, gt=0)
    optimization_level: int = Field(default=3, ge=0, le=5)


class VerifyOptions(StrictModel):
    """How the ONNX the engine is built from is compared with the source model (and the engine, on a GPU)."""

    rtol: float = Field(default=1e-3, ge=0)
    atol: float = Field(default=1e-4, ge=0)
    samples: int = Field(default=6, ge=1, le=10_000)
    seed: int = 0
    on_fail: Literal["fail", "warn"] = "fail"


class Recipe(StrictModel):
    """One model: its source, precisions, shapes, targets and builder options."""

    name: str = Field(pattern=NAME_PATTERN)
    source: Source
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)
    targets: Optional[list[str]] = Field(default=None, min_length=1)
    profiles: list[Profile] = Field(default_factory=list)
    build: BuildOptions = Field(default_factory=BuildOptions)
    verify: VerifyOptions = Field(default_factory=VerifyOptions)
    cleanup: CleanupOptions = Field(default_factory=CleanupOptions)
    calibration: Optional[Calibration] = None  # required by int8 and fp8
    autocast: AutocastOptions = Field(default_factory=AutocastOptions)
    quantize: QuantizeOptions = Field(default_factory=QuantizeOptions)
    accuracy: AccuracyOptions = Field(default_factory=AccuracyOptions)

    @field_validator("precisions")
    @classmethod
    def _unique_precisions(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("precisions must not repeat")
        return value

    @model_validator(mode="after")
    def _profiles_name_same_inputs(self) -> "Recipe":
        if self.profiles:
            first = set(self.profiles[0].inputs)
            for profile in self.profiles[1:]:
                if set(profile.inputs) != first:
                    raise FieldError("profiles", "every profile must name the same inputs")
        return self


@dataclass(frozen=True)
class RecipeFile:
    """A validated recipe with where it came from, so later checks can still point at a line."""

    recipe: Recipe
    path: Path
    display: str
    document: YamlDocument

    def where(self, *loc: Any) -> str:
        """`recipes/x.yaml:7: source.onnx` for error messages."""
        return f"{self.display}:{self.document.line_of(loc)}: {format_loc(loc)}"

    def target_names(self, pipeline: Pipeline) -> list[str]:
        return list(self.recipe.targets) if self.recipe.targets else list(pipeline.targets)

    def source_path(self, root: Path) -> Path:
        """The ONNX source file (a torch source has none: its model comes from the export stage)."""
        return (root / self.recipe.source.onnx).resolve()

    def factory_file(self, root: Path) -> Path:
        """The torch factory's module file, found without importing it; ProjectError if there is none."""
        module = self.recipe.source.torch.factory.split(":")[0]
        try:
            return module_file(module, root)
        except ModuleNotFound as exc:
            raise ProjectError(f"{self.where('source', 'torch', 'factory')}: {exc}") from None


@dataclass(frozen=True)
class Project:
    """pipeline.yaml plus its recipes, validated and cross-checked."""

    root: Path
    pipeline: Pipeline
    recipes: tuple[RecipeFile, ...]

    @property
    def store_dir(self) -> Path:
        return self.root / self.pipeline.store

    @property
    def packages_dir(self) -> Path:
        return self.root / self.pipeline.packages

    def recipe(self, name: str) -> RecipeFile:
        for item in self.recipes:
            if item.recipe.name == name:
                return item
        known = ", ".join(r.recipe.name for r in self.recipes) or "none"
        raise ProjectError(f"no recipe named {name!r} (recipes: {known})")


def recipe_json_schema() -> dict:
    """The recipe schema for editors (yaml-language-server); `name` is optional there: it defaults to the file name."""
    schema = Recipe.model_json_schema()
    schema["required"] = [field for field in schema.get("required", []) if field != "name"]
    return schema


def format_loc(loc: tuple) -> str:
    """('profiles', 0, 'inputs', 'x') -> 'profiles[0].inputs.x'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_lines(document: YamlDocument, display: str, exc: pydantic.ValidationError) -> list[str]:
    """One `file:line: field: message` per problem, in file order."""
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        message = str(cause) if cause is not None else error["msg"]
        if isinstance(cause, FieldError):
            loc = loc + (cause.field,)
        elif error["type"] == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] == "literal_error":
            message = f"{error['input']!r} is not one of {error['ctx']['expected']}"
        message = message.removeprefix("Value error, ")
        lines.append((document.line_of(loc), f"{display}:{document.line_of(loc)}: {format_loc(loc)}: {message}"))
    return [text for _, text in sorted(lines, key=lambda item: item[0])]


def _validate(model: type[BaseModel], document: YamlDocument, display: str, extra: dict | None = None) -> Any:
    if not isinstance(document.data, dict):
        raise ProjectError(f"{display}:1: the file must hold a mapping of keys")
    data = {**(extra or {}), **document.data}
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ProjectError("\n".join(_error_lines(document, display, exc))) from None


def load_project(root: Path) -> Project:
    """Load and cross-check pipeline.yaml and every recipe it names; raises ProjectError on any problem."""
    root = root.resolve()
    if not (root / PIPELINE_FILE).is_file():
        raise ProjectError(f"{PIPELINE_FILE}: not found in {root} (run trtflow in the project folder or pass -C DIR)")
    pipeline_doc = load_yaml(root / PIPELINE_FILE, PIPELINE_FILE)
    pipeline = _validate(Pipeline, pipeline_doc, PIPELINE_FILE)
    recipes = tuple(_load_recipe(root, path, pipeline) for path in _recipe_paths(root, pipeline, pipeline_doc))
    _check_unique_names(recipes)
    return Project(root=root, pipeline=pipeline, recipes=recipes)


def _recipe_paths(root: Path, pipeline: Pipeline, document: YamlDocument) -> list[Path]:
    paths: list[Path] = []
    for index, pattern in enumerate(pipeline.recipes):
        matches = sorted(Path(p) for p in glob.glob(str(root / pattern), recursive=True))
        if not matches:
            raise ProjectError(f"{PIPELINE_FILE}:{document.line_of(('recipes', index))}: recipes[{index}]: no file matches {pattern!r}")
        paths.extend(m for m in matches if m not in paths)
    return paths


def _load_recipe(root: Path, path: Path, pipeline: Pipeline) -> RecipeFile:
    display = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    document = load_yaml(path, display)
    recipe = _validate(Recipe, document, display, extra={"name": path.stem})
    item = RecipeFile(recipe=recipe, path=path, display=display, document=document)
    _check_targets(item, pipeline)
    _check_source_exists(item, root)
    _check_precisions(item, pipeline)
    return item


def _check_targets(item: RecipeFile, pipeline: Pipeline) -> None:
    for index, name in enumerate(item.recipe.targets or []):
        if name not in pipeline.targets:
            known = ", ".join(pipeline.targets)
            raise ProjectError(f"{item.where('targets', index)}: unknown target {name!r} (pipeline.yaml defines: {known})")


def _check_precisions(item: RecipeFile, pipeline: Pipeline) -> None:
    """Before any work: int8/fp8 have calibration data, and every target's GPUs run each precision."""
    recipe = item.recipe
    for index, precision in enumerate(recipe.precisions):
        if precision in QUANTIZED_PRECISIONS and recipe.calibration is None:
            raise ProjectError(f"{item.where('precisions', index)}: {precision} needs calibration data: add calibration: {{data: ...}} "
                               "(or calibration: {random: true} to calibrate on random inputs, recorded in the manifest)")
        for name in item.target_names(pipeline):
            problem = _capability_problem(recipe, precision, name, pipeline.targets[name])
            if problem:
                raise ProjectError(f"{item.where('precisions', index)}: {problem}")


def _capability_problem(recipe: Recipe, precision: str, target: str, spec: TargetSpec) -> Optional[str]:
    """`fp8 needs compute capability >= 8.9, target rtx-ampere is sm_86`, or None when every GPU of the target fits."""
    needs = PRECISION_MIN_COMPUTE_CAPABILITY.get(precision)
    reason = ""
    if precision in QUANTIZED_PRECISIONS and recipe.quantize.high_precision == "bf16" and _cc(needs or "sm_0") < _cc("sm_80"):
        needs, reason = "sm_80", " (quantize.high_precision is bf16)"
    if needs is None:
        return None
    lowest = "sm_80" if spec.hardware_compatibility == "ampere_plus" else spec.compute_capabilities[0]
    if _cc(lowest) >= _cc(needs):
        return None
    how = "runs on sm_80 and newer (hardware_compatibility ampere_plus)" if lowest != spec.compute_capabilities[0] else \
        ("is " if len(spec.compute_capabilities) == 1 else "includes ") + lowest
    return f"{precision} needs compute capability >= {needs[3:-1]}.{needs[-1]}{reason}, target {target} {how}"


def _cc(name: str) -> int:
    """sm_89 -> 89, sm_120 -> 120: comparable as integers."""
    return int(name[3:])


def _check_source_exists(item: RecipeFile, root: Path) -> None:
    if item.recipe.source.torch is not None:
        _check_torch_source(item, root)
        return
    path = item.source_path(root)
    if not path.is_file():
        raise ProjectError(f"{item.where('source', 'onnx')}: model file not found: {item.recipe.source.onnx}")


def _check_torch_source(item: RecipeFile, root: Path) -> None:
    """The factory's module and every named file exist, and the inputs agree with the profiles."""
    torch = item.recipe.source.torch
    item.factory_file(root)
    for loc, path in ((("weights",), torch.weights), *((("files", i), p) for i, p in enumerate(torch.files))):
        if path is not None and not (root / path).is_file():
            raise ProjectError(f"{item.where('source', 'torch', *loc)}: file not found: {path}")
    declared = {spec.name: index for index, spec in enumerate(torch.inputs)}
    for index, profile in enumerate(item.recipe.profiles):
        for name, shape in profile.inputs.items():
            if name not in declared:
                raise ProjectError(f"{item.where('profiles', index, 'inputs', name)}: the model has no input {name!r} "
                                   f"(source.torch.inputs: {', '.join(declared)})")
            _check_torch_rank(item, ("profiles", index, "inputs", name), torch.inputs[declared[name]], shape)
    profiled = set(item.recipe.profiles[0].inputs) if item.recipe.profiles else set()
    for index, spec in enumerate(torch.inputs):
        if spec.shape is None and spec.name not in profiled:
            raise ProjectError(f"{item.where('source', 'torch', 'inputs', index)}: input {spec.name!r} needs a shape: "
                               "give shape: [...] or its min/opt/max in the profiles")
        _check_torch_example(item, index, spec)


def _check_torch_rank(item: RecipeFile, loc: tuple, spec: TorchInput, shape: InputShape) -> None:
    if spec.shape is not None and len(shape.triple()[0]) != len(spec.shape):
        field = "shape" if shape.shape is not None else "min"
        raise ProjectError(f"{item.where(*loc, field)}: rank {len(shape.triple()[0])} but source.torch.inputs "
                           f"gives {spec.name!r} rank {len(spec.shape)}")


def _check_torch_example(item: RecipeFile, index: int, spec: TorchInput) -> None:
    """A declared example shape lies within the range the profiles span (the range the export makes dynamic)."""
    shapes = [s for p in item.recipe.profiles if spec.name in p.inputs for s in p.inputs[spec.name].triple()]
    if spec.shape is None or not shapes:
        return
    low, high = [min(dims) for dims in zip(*shapes)], [max(dims) for dims in zip(*shapes)]
    if not all(a <= s <= b for a, s, b in zip(low, spec.shape, high)):
        raise ProjectError(f"{item.where('source', 'torch', 'inputs', index, 'shape')}: {spec.shape} is outside the "
                           f"profiles' range for {spec.name!r}: {low}..{high}")


def _check_unique_names(recipes: tuple[RecipeFile, ...]) -> None:
    seen: dict[str, RecipeFile] = {}
    for item in recipes:
        name = item.recipe.name
        if name in seen:
            raise ProjectError(f"{item.where('name')}: recipe name {name!r} is also used by {seen[name].display}")
        seen[name] = item
