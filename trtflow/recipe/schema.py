"""The schema of pipeline.yaml and recipes/*.yaml: pydantic models, strict (unknown keys are errors).

Loading and cross-checking them (with file and line in every error) is trtflow.recipe.load.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from trtflow.errors import required
from trtflow.recipe.base import Dim, FieldError, StrictModel
from trtflow.recipe.build import BuildSettings
from trtflow.recipe.precision import (
    SUPPORTED_PRECISIONS,
    AccuracyOptions,
    AutocastOptions,
    Calibration,
    QuantizeOptions,
)
from trtflow.recipe.source import CleanupOptions, Source
from trtflow.util.cc import ComputeCapability, parse_ccs

# Compute capabilities TensorRT-RTX 1.7 can target (its trt.ComputeCapability enum).
RTX_COMPUTE_CAPABILITIES = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
# a file name on every system: packages and engines are named after it
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


def _known_precision(value: str) -> str:
    if value not in SUPPORTED_PRECISIONS:
        raise ValueError(f"unknown precision {value!r} (supported: {', '.join(SUPPORTED_PRECISIONS)})")
    return value


Precision = Annotated[str, AfterValidator(_known_precision)]


class TargetSpec(StrictModel):
    """One kind of GPU in the fleet, and the backend that builds for it."""

    backend: Literal["tensorrt-rtx", "tensorrt"]
    compute_capabilities: list[ComputeCapability] = Field(min_length=1)
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    version_compatible: bool = False
    # Ray node labels this target's builds need (`--executor ray`), e.g. {gpu-class: l4} or
    # {ray.io/accelerator-type: A100}: where a build runs, never what it makes (not in any key)
    runs_on: dict[str, str] = Field(default_factory=dict)

    @field_validator("runs_on")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?$", key) or not re.match(
                r"^[A-Za-z0-9._-]{1,63}$", label
            ):
                raise ValueError(
                    f"runs_on: {key}: {label} is not a Ray node label (letters, digits, '.', '_', '-'; keys may hold "
                    "'/')"
                )
        return value

    @field_validator("compute_capabilities", mode="before")
    @classmethod
    def _canonical_ccs(cls, value: Any) -> Any:
        return parse_ccs(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _backend_options(self) -> TargetSpec:
        if self.backend == "tensorrt-rtx":
            unsupported = [cc for cc in self.compute_capabilities if cc not in RTX_COMPUTE_CAPABILITIES]
            if unsupported:
                supported = ", ".join(RTX_COMPUTE_CAPABILITIES)
                raise FieldError(
                    "compute_capabilities",
                    f"tensorrt-rtx cannot target {', '.join(unsupported)} (it supports {supported})",
                )
            if self.hardware_compatibility != "none" or self.version_compatible:
                raise FieldError(
                    "backend", "hardware_compatibility and version_compatible apply to the tensorrt backend only"
                )
        return self


CREDENTIAL_KEY = re.compile(
    r"secret|password|passwd|token|credential|^key$|access_?key|account_?key|connection_?string|"
    r"sse_?customer_?key|customer_?key|sas|^username$|^user$|^auth",
    re.IGNORECASE,
)
URL_USERINFO = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@]*@", re.IGNORECASE)  # scheme://user:pass@host


def _credential_keys(value: Any, path: str = "options") -> list[str]:
    """Dotted paths of option keys that look like credentials, at any depth."""
    if not isinstance(value, dict):
        return []
    found = []
    for key, item in value.items():
        in_url = isinstance(item, str) and URL_USERINFO.match(item)  # endpoint_url: https://user:pass@host
        found += (
            [f"{path}.{key}"] if CREDENTIAL_KEY.search(str(key)) or in_url else _credential_keys(item, f"{path}.{key}")
        )
    return found


class CacheSpec(StrictModel):
    """`cache:` in pipeline.yaml: an optional remote cache shared by machines (any fsspec URL)."""

    remote: str | None = None  # s3://bucket/prefix, file:///shared/dir, gs://...
    options: dict[str, Any] = Field(default_factory=dict)  # passed to the fsspec filesystem, e.g. endpoint_url
    # Ed25519 public keys (PEM files, relative to the project) whose signed records are accepted from the remote;
    # set, unsigned or otherwise signed records are rejected and built locally (see signing.py)
    trust: list[str] = Field(default_factory=list)

    @field_validator("remote")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[a-z][a-z0-9+.-]*://.+", value):
            raise ValueError(f"remote {value!r} is not a URL such as s3://bucket/prefix or file:///shared/dir")
        if value is not None and URL_USERINFO.match(value):
            raise ValueError(
                "remote: a user or password in the URL is a credential; pipeline.yaml is committed: "
                "set credentials in the environment instead"
            )
        if value is not None and value.startswith("file://") and not value.startswith("file:///"):
            raise ValueError(f"remote {value!r}: a file:// remote needs an absolute path (file:///shared/dir)")
        return value

    @field_validator("options")
    @classmethod
    def _no_credentials(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = _credential_keys(value)
        if found:
            raise ValueError(
                f"{', '.join(found)}: credentials do not belong in pipeline.yaml (it is committed); "
                "set them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...) instead"
            )
        return value


class RaySpec(StrictModel):
    """`executor: {ray: ...}`: run stages as Ray tasks on a cluster (or a local Ray instance)."""

    address: str | None = None  # host:port of the head, `auto`, or none: start a local instance
    # where stage inputs and outputs travel between machines (any fsspec URL, or an absolute folder every node
    # sees); default: the remote cache, else <store>/exchange (one machine, or a store on a shared file system)
    exchange: str | None = None


class ExecutorSpec(StrictModel):
    """`executor:` in pipeline.yaml: where stages run (the local process pool unless `ray` is given)."""

    ray: RaySpec | None = None


class Pipeline(StrictModel):
    """pipeline.yaml: where outputs go, the fleet's targets, and which recipe files belong to the project."""

    store: str = "artifacts/store"
    packages: str = "artifacts/packages"
    recipes: list[str] = Field(default_factory=lambda: ["recipes/*.yaml"], min_length=1)
    targets: dict[str, TargetSpec] = Field(min_length=1)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)

    @field_validator("targets")
    @classmethod
    def _target_names(cls, value: dict[str, TargetSpec]) -> dict[str, TargetSpec]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"target name {name!r} must match {NAME_PATTERN}")
        return value


MAX_VOLUME = 2**31 - 1  # elements of one input: TensorRT's int32 volume, and 8 GiB of fp32 for a single sample


def _bounded_volume(field: str, shape: list[int]) -> None:
    volume = math.prod(shape)
    if volume > MAX_VOLUME:
        raise FieldError(
            field,
            f"{shape} holds {volume:.3g} elements, more than {MAX_VOLUME} ({MAX_VOLUME * 4 / 2**30:.0f} GiB of fp32 "
            "for one sample): trtflow refuses an input that size; lower it",
        )


class InputShape(StrictModel):
    """The min/opt/max shape of one input in one profile; `shape:` is shorthand for a static input."""

    min: list[Dim] | None = None
    opt: list[Dim] | None = None
    max: list[Dim] | None = None
    shape: list[Dim] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> InputShape:
        if self.shape is not None:
            if any(v is not None for v in (self.min, self.opt, self.max)):
                raise FieldError("shape", "give either shape or min/opt/max, not both")
            _bounded_volume("shape", self.shape)
            return self
        for name in ("min", "opt", "max"):
            if getattr(self, name) is None:
                raise FieldError(name, f"{name} is required (or give a static shape:)")
        assert self.min is not None and self.opt is not None and self.max is not None  # each checked just above
        if not len(self.min) == len(self.opt) == len(self.max):
            raise FieldError("max", "min, opt and max must have the same rank")
        if any(a > b for a, b in zip(self.min, self.opt, strict=True)):
            raise FieldError("min", "min must be <= opt in every dimension")
        if any(a > b for a, b in zip(self.opt, self.max, strict=True)):
            raise FieldError("max", "opt must be <= max in every dimension")
        _bounded_volume("max", self.max)
        return self

    def triple(self) -> tuple[list[int], list[int], list[int]]:
        """(min, opt, max), with a static shape repeated three times."""
        if self.shape is not None:
            return list(self.shape), list(self.shape), list(self.shape)
        low, mid, high = (required(bound, "a profile's min, opt or max") for bound in (self.min, self.opt, self.max))
        return list(low), list(mid), list(high)


class Profile(StrictModel):
    """One optimization profile: the shape range (or static shape) of each model input, by name."""

    inputs: dict[str, InputShape] = Field(min_length=1)


class InputValues(StrictModel):
    """The values trtflow draws for one integer input, where the graph does not say (or says wrong):

    inputs: {token_type_ids: {values: [0, 1]}}    # integers from 0 to 1, both included
    """

    values: tuple[int, int]

    @field_validator("values")
    @classmethod
    def _ordered(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] > value[1]:
            raise ValueError(f"values: [{value[0]}, {value[1]}]: the first is the lowest value, the second the highest")
        return value


class VerifyOptions(StrictModel):
    """How the ONNX the engine is built from is compared with the source model (and the engine, on a GPU)."""

    rtol: float = Field(default=1e-3, ge=0)
    atol: float = Field(default=1e-4, ge=0)
    # default: an engine is verified at each profile's opt, min and max shape once; cleanup proves its rewrite at
    # opt and min (rewrite_samples_for)
    samples: int | None = Field(default=None, ge=1, le=10_000)
    seed: int = 0
    on_fail: Literal["fail", "warn"] = "fail"

    def samples_for(self, profiles: int) -> int:
        """The samples to run: as given, else three per profile (opt, min, max), at least three."""
        return self.samples or 3 * max(profiles, 1)

    def rewrite_samples_for(self, profiles: list[dict[str, dict[str, list[int]]]]) -> int:
        """The samples that prove a rewritten graph (cleanup) equal to its source on the same runtime: as given, else
        two per profile (its opt and min shapes) when those differ on every dynamic axis, three otherwise.

        A rewrite that bakes a shape into the graph is caught as soon as one axis takes two values, so opt and min
        prove what opt, min and max would; the max shape is the costliest to run (torchvision's ResNet-18 at batch
        32: 2.8 of a 3.9 s proof). An engine is still verified at all three shapes (samples_for)."""
        if self.samples:
            return self.samples
        opt_and_min_differ = all(
            low != mid
            for profile in profiles
            for shape in profile.values()
            for low, mid, high in zip(shape["min"], shape["opt"], shape["max"], strict=True)
            if low != high
        )
        return (2 if opt_and_min_differ else 3) * max(len(profiles), 1)


class Exclude(StrictModel):
    """One (precision, target) pair, or every pair of a precision or of a target, not to build (as CI matrices
    exclude)."""

    precision: str | None = None
    target: str | None = None

    @model_validator(mode="after")
    def _names_something(self) -> Exclude:
        if self.precision is None and self.target is None:
            raise FieldError("precision", "an exclude entry names a precision, a target, or both")
        return self

    def matches(self, precision: str, target: str) -> bool:
        """Whether this entry drops the (precision, target) pair."""
        return self.precision in (None, precision) and self.target in (None, target)


class PackageOptions(StrictModel):
    """`package:` in a recipe: what its package holds besides the engines."""

    # `list`: the manifest names each plugin library an engine needs (name, sha256, size) and the device must have it;
    # `carry`: the package also holds the libraries (plugins/<sha256>-<name>) and provision installs them beside the
    # engine
    plugins: Literal["list", "carry"] = "list"
    # also write `<recipe>.tar.gz` (the folder's files, reproducible): a second copy of every engine on disk, so only
    # for a recipe whose package is shipped as one file; `trtflow provision` and `publish` read the folder
    archive: bool = False


class Recipe(StrictModel):
    """One model: its source, precisions, shapes, targets and builder options."""

    name: str = Field(pattern=NAME_PATTERN)
    source: Source
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)
    targets: list[str] | None = Field(default=None, min_length=1)
    profiles: list[Profile] = Field(default_factory=list)
    inputs: dict[str, InputValues] = Field(default_factory=dict)  # integer inputs' values, where inference fails
    build: BuildSettings = Field(default_factory=BuildSettings)
    package: PackageOptions = Field(default_factory=PackageOptions)
    verify: VerifyOptions = Field(default_factory=VerifyOptions)
    cleanup: CleanupOptions = Field(default_factory=CleanupOptions)
    calibration: Calibration | None = None  # required by int8 and fp8
    autocast: AutocastOptions = Field(default_factory=AutocastOptions)
    quantize: QuantizeOptions = Field(default_factory=QuantizeOptions)
    accuracy: AccuracyOptions = Field(default_factory=AccuracyOptions)
    exclude: list[Exclude] = Field(default_factory=list)  # (precision, target) pairs not to build

    def excluded(self, precision: str, target: str) -> bool:
        """Whether an `exclude:` entry drops this (precision, target) pair."""
        return any(rule.matches(precision, target) for rule in self.exclude)

    @field_validator("precisions")
    @classmethod
    def _unique_precisions(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("precisions must not repeat")
        return value

    @model_validator(mode="after")
    def _profiles_name_same_inputs(self) -> Recipe:
        if self.profiles:
            first = set(self.profiles[0].inputs)
            for profile in self.profiles[1:]:
                if set(profile.inputs) != first:
                    raise FieldError("profiles", "every profile must name the same inputs")
        return self


def recipe_json_schema() -> dict:
    """The recipe schema for editors (yaml-language-server); `name` is optional there: it defaults to the file name."""
    schema = Recipe.model_json_schema()
    schema["required"] = [field for field in schema.get("required", []) if field != "name"]
    return schema
