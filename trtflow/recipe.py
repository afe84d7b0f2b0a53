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
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from trtflow.errors import ProjectError
from trtflow.yamlsource import YamlDocument, load_yaml

PIPELINE_FILE = "pipeline.yaml"
SUPPORTED_PRECISIONS = ("fp32",)
# Compute capabilities TensorRT-RTX 1.7 can target (its trt.ComputeCapability enum).
RTX_COMPUTE_CAPABILITIES = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class FieldError(ValueError):
    """A model-level check that blames one field (pydantic would otherwise blame the model)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _known_precision(value: str) -> str:
    if value not in SUPPORTED_PRECISIONS:
        raise ValueError(f"unknown precision {value!r} (supported: {', '.join(SUPPORTED_PRECISIONS)})")
    return value


Precision = Annotated[str, AfterValidator(_known_precision)]
# A shape dimension: a real positive integer (YAML `true` or 1.0 are not dimensions), within int32.
Dim = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


class Pipeline(StrictModel):
    """pipeline.yaml: where outputs go, the fleet's targets, and which recipe files belong to the project."""

    store: str = "artifacts/store"
    packages: str = "artifacts/packages"
    recipes: list[str] = Field(default_factory=lambda: ["recipes/*.yaml"], min_length=1)
    targets: dict[str, TargetSpec] = Field(min_length=1)

    @field_validator("targets")
    @classmethod
    def _target_names(cls, value: dict[str, TargetSpec]) -> dict[str, TargetSpec]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"target name {name!r} must match {NAME_PATTERN}")
        return value


class OnnxSource(StrictModel):
    onnx: str


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
    source: OnnxSource
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)
    targets: Optional[list[str]] = Field(default=None, min_length=1)
    profiles: list[Profile] = Field(default_factory=list)
    build: BuildOptions = Field(default_factory=BuildOptions)
    verify: VerifyOptions = Field(default_factory=VerifyOptions)

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
        return (root / self.recipe.source.onnx).resolve()


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
    return item


def _check_targets(item: RecipeFile, pipeline: Pipeline) -> None:
    for index, name in enumerate(item.recipe.targets or []):
        if name not in pipeline.targets:
            known = ", ".join(pipeline.targets)
            raise ProjectError(f"{item.where('targets', index)}: unknown target {name!r} (pipeline.yaml defines: {known})")


def _check_source_exists(item: RecipeFile, root: Path) -> None:
    path = item.source_path(root)
    if not path.is_file():
        raise ProjectError(f"{item.where('source', 'onnx')}: model file not found: {item.recipe.source.onnx}")


def _check_unique_names(recipes: tuple[RecipeFile, ...]) -> None:
    seen: dict[str, RecipeFile] = {}
    for item in recipes:
        name = item.recipe.name
        if name in seen:
            raise ProjectError(f"{item.where('name')}: recipe name {name!r} is also used by {seen[name].display}")
        seen[name] = item
