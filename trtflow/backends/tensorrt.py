"""Full TensorRT (10/11): builds on the GPU it runs on, optionally hardware- and version-compatible.

Unlike TensorRT-RTX it cannot target another architecture: a build refuses to run unless the local
GPU's compute capability is one the target declares (or the target asks for a hardware-compatible
engine and every declared capability is Ampere or newer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.backends.base import BuildRequest, BuildResult, import_or_explain
from trtflow.backends.trt_common import build_engine, outputs_from_engine, unsupported_options
from trtflow.device import no_gpu_reason, query_compute_capabilities
from trtflow.errors import EnvironmentProblem, StageError
from trtflow.util.cc import ComputeCapability

HARDWARE_LEVELS = {"ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}


class TensorRTBackend:
    """Full TensorRT: builds on the local GPU, for its compute capability only (or Ampere+ when hardware-compatible)."""

    name = "tensorrt"
    module = "tensorrt"
    extra = "tensorrt"

    def __init__(self) -> None:
        self._trt: Any = None

    def load(self) -> None:
        """Import tensorrt once; EnvironmentProblem with the install command if it is missing."""
        if self._trt is None:
            self._trt = import_or_explain(self.module, self.extra, "from NVIDIA's package index, needs a GPU")

    def engine_from_onnx(self, request: BuildRequest) -> BuildResult:
        """Build on this machine's GPU after checking it matches the target, with the requested compatibility
        settings."""
        self.load()
        trt = self._trt
        _check_local_gpu(request)

        def configure(config: Any, logger: Any) -> None:
            """Set the hardware-compatibility level and the version-compatible flag the request asks for."""
            if request.hardware_compatibility != "none":
                level = HARDWARE_LEVELS[request.hardware_compatibility]
                config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)
            if request.version_compatible:
                config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)

        return build_engine(trt, request, configure, self.name)

    def unsupported_options(self, names: set[str]) -> list[str]:
        """The recipe `build:` options among `names` this installed version has no API for."""
        self.load()
        return unsupported_options(self._trt, names)

    def outputs_from_engine(self, engine_path: Path, feeds: dict, plugins: dict[str, Path] | None = None) -> dict:
        """Execute the engine on the local GPU with its plugin libraries loaded (verify calls this only where one
        exists)."""
        self.load()
        return outputs_from_engine(self._trt, engine_path, feeds, plugins)


def _check_local_gpu(request: BuildRequest) -> None:
    """Refuse to label an engine with capabilities the local GPU cannot produce."""
    local = list(query_compute_capabilities())
    if not local:
        raise EnvironmentProblem(f"the tensorrt backend builds on a GPU, and this machine has {no_gpu_reason()}")
    wanted = set(request.compute_capabilities)
    if request.hardware_compatibility == "ampere_plus":
        if all(ComputeCapability.parse(cc) >= "sm_80" for cc in wanted) and any(
            ComputeCapability.parse(cc) >= "sm_80" for cc in local
        ):
            return
        raise StageError(
            f"an ampere_plus engine needs an Ampere+ GPU here and Ampere+ targets (local: {local}, target: "
            f"{sorted(wanted)})"
        )
    if len(wanted) != 1 or not wanted <= set(local):
        raise StageError(
            f"the tensorrt backend builds for the local GPU ({', '.join(local)}); the target declares "
            f"{', '.join(sorted(wanted))}"
        )


BACKEND = TensorRTBackend()
