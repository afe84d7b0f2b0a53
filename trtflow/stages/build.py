"""Build: turn the cleaned ONNX into an engine for one (precision, target) with the target's backend."""

from __future__ import annotations

from pathlib import Path

from trtflow.backends.base import BuildRequest, get_backend
from trtflow.stages import StageOutput, Upstream


def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    backend = get_backend(params["backend"])
    workspace = params["workspace_mib"]
    request = BuildRequest(
        onnx_path=inputs["model"].files["model"],
        engine_path=workdir / "model.engine",
        compute_capabilities=params["compute_capabilities"],
        profiles=[{name: (s["min"], s["opt"], s["max"]) for name, s in profile.items()} for profile in params["profiles"]],
        workspace_bytes=workspace * (1 << 20) if workspace else None,
        optimization_level=params["optimization_level"],
        hardware_compatibility=params["hardware_compatibility"],
        version_compatible=params["version_compatible"],
    )
    result = backend.engine_from_onnx(request)
    return StageOutput(files={"engine": request.engine_path}, record=result.to_record())
