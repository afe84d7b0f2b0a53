"""TensorRT-RTX: builds engines on the CPU, ahead of time, for the compute capabilities a target names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.backends.base import BuildRequest, BuildResult, import_or_explain
from trtflow.backends.trt_common import build_engine, outputs_from_engine, unsupported_options
from trtflow.errors import StageError


class TensorRTRTXBackend:
    """TensorRT-RTX: builds on the CPU, ahead of time, for any compute capabilities it can target."""

    name = "tensorrt-rtx"
    module = "tensorrt_rtx"
    extra = "rtx"

    def __init__(self) -> None:
        self._trt: Any = None

    def load(self) -> None:
        """Import tensorrt_rtx once; EnvironmentProblem with the install command if it is missing."""
        if self._trt is None:
            self._trt = import_or_explain(self.module, self.extra)

    def engine_from_onnx(self, request: BuildRequest) -> BuildResult:
        """Build for exactly the requested compute capabilities; no GPU is needed."""
        self.load()
        trt = self._trt
        capabilities = [self._capability(cc) for cc in request.compute_capabilities]

        def configure(config: Any, logger: Any) -> None:
            """Target exactly the requested compute capabilities (not the local GPU's)."""
            config.num_compute_capabilities = len(capabilities)
            for index, capability in enumerate(capabilities):
                config.set_compute_capability(capability, index)

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

    def _capability(self, cc: str) -> Any:
        value = getattr(self._trt.ComputeCapability, cc.replace("_", "").upper(), None)
        if value is None:
            raise StageError(f"tensorrt-rtx {self._trt.__version__} cannot target {cc}")
        return value


BACKEND = TensorRTRTXBackend()
