"""The backend protocol: turn an ONNX file into an engine for a set of compute capabilities.

Backends take plain values and paths (never recipe objects) and import their TensorRT module lazily,
so planning a no-op run never pays for loading TensorRT.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtflow.errors import EnvironmentProblem

Shape = list[int]


@dataclass(frozen=True)
class BuildRequest:
    """Everything a backend needs to build one engine."""

    onnx_path: Path
    engine_path: Path
    compute_capabilities: list[str]
    profiles: list[dict[str, tuple[Shape, Shape, Shape]]]
    options: dict[str, Any] = field(default_factory=dict)  # builder options by name (trt_common.BUILDER_OPTIONS)
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    # name -> shared library, loaded into the builder's plugin registry first
    plugins: dict[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorSpec:
    """One engine I/O tensor as the built network declares it (-1 marks a dynamic dimension)."""

    name: str
    mode: str  # "input" | "output"
    dtype: str
    shape: list[int]


@dataclass
class BuildResult:
    """What a build produced: backend and exact version, the engine's I/O tensors, its size, the builder's last
    warnings."""

    backend: str
    backend_version: str
    tensors: list[TensorSpec]
    engine_bytes: int
    log: list[str] = field(default_factory=list)
    # what the builder's network says of its layers (trt_common.network_facts)
    network: dict = field(default_factory=dict)

    def to_record(self) -> dict:
        """The result as plain JSON-ready values (tensors included), for the build stage's record."""
        return asdict(self)


class Backend(Protocol):
    """A TensorRT flavour: its name, the module it imports lazily, the pip extra that installs it, and how it builds
    and runs."""

    name: str
    module: str
    extra: str

    def engine_from_onnx(self, request: BuildRequest) -> BuildResult:
        """Build `request.onnx_path` into `request.engine_path` for the requested compute capabilities and profiles."""

    def outputs_from_engine(self, engine_path: Path, feeds: dict, plugins: dict[str, Path] | None = None) -> dict:
        """Run the engine once on the local GPU with `feeds` (input name -> array), `plugins` loaded; its outputs by
        name."""

    def unsupported_options(self, names: set[str]) -> list[str]:
        """The recipe `build:` options among `names` this backend's installed version has no API for."""


@dataclass(frozen=True)
class BackendInfo:
    """Where a backend lives: its trtflow module, the distribution that provides TensorRT, the extra that installs
    it."""

    module: str
    distribution: str
    extra: str


BACKENDS = {
    "tensorrt-rtx": BackendInfo("trtflow.backends.tensorrt_rtx", "tensorrt-rtx", "rtx"),
    "tensorrt": BackendInfo("trtflow.backends.tensorrt", "tensorrt", "tensorrt"),
}


@functools.cache
def backend_version(name: str) -> str | None:
    """Installed version of a backend's package without importing it (cheap enough for every plan)."""
    try:
        return importlib.metadata.version(BACKENDS[name].distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def get_backend(name: str) -> Backend:
    """The backend object; raises EnvironmentProblem with the install command if it is missing."""
    module = importlib.import_module(BACKENDS[name].module)
    backend = module.BACKEND
    backend.load()
    return backend


def import_or_explain(module: str, extra: str, why: str = ""):
    """Import a heavy optional module, or raise an EnvironmentProblem that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = f"pip install 'trtflow[{extra}]'" + (f" ({why})" if why else "")
        raise EnvironmentProblem(f"module {module!r} is required: {hint} [{exc}]") from exc
