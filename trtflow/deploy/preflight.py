"""Preflight: before `current` flips, ask whether this device can load the engine, and refuse with the reason.

- TensorRT-RTX installed: the engine's release against the installed runtime's (engines load only on the same
  release), then `Runtime.get_engine_validity(bytes)`, which reads the engine's header. It needs a GPU to answer:
  without one it says INVALID with no diagnostic (or CUDA_ERROR / OLD_CUDA_DRIVER: "CUDA driver version is
  insufficient", measured here), which means "cannot check here", not "invalid"; MALFORMED_ENGINE and
  VERSION_MISMATCH are facts of the header and refuse everywhere; with a GPU, any other named reason refuses.
- Full TensorRT, or no runtime installed: the manifest's backend version against the installed runtime's, by the
  same rules `provision --runtime-version` applies. The manifest records no CUDA or driver requirement, so the
  driver (nvidia-smi) is recorded, not judged.
Every answer is recorded; "not checked: <reason>" is never turned into a pass.
"""

from __future__ import annotations

import importlib
import mmap
import shutil
import subprocess
from pathlib import Path

from trtflow.device import query_compute_capabilities
from trtflow.errors import PreflightRefused
from trtflow.manifest import Engine

RUNTIME_MODULES = {"tensorrt-rtx": "tensorrt_rtx", "tensorrt": "tensorrt"}
HEADER_FACTS = ("VERSION_MISMATCH", "MALFORMED_ENGINE")  # said by the header alone, GPU or not


def installed_runtime(backend: str) -> object | None:
    """The backend's Python runtime module if it is installed here, else None."""
    try:
        return importlib.import_module(RUNTIME_MODULES[backend])
    except (ImportError, KeyError, OSError):
        return None


def preflight(engine: Engine, path: Path, runtime_version: str | None = None) -> dict:
    """{"preflight": {...}} for the record; PreflightRefused when the engine cannot load here."""
    from trtflow.deploy.provision import _runtime_refusal

    module = installed_runtime(engine.backend)
    installed = runtime_version or (getattr(module, "__version__", None) if module is not None else None)
    result: dict = {
        "runtime": installed,
        "driver": driver_version(),
        "driver_check": "not checked: the manifest records no driver requirement",
    }
    if installed is None:
        result["version_check"] = (
            f"not checked: no {engine.backend} runtime installed here and no --runtime-version given"
        )
    else:
        refusal = _runtime_refusal(engine, installed)
        if refusal:
            raise PreflightRefused(
                f"{path}: preflight: {refusal} (installed runtime {installed}); `current` left as it was"
            )
        result["version_check"] = f"passed: {engine.backend} {engine.backend_version} loads on runtime {installed}"
    result["engine_validity"] = (
        _validity(module, path)
        if engine.backend == "tensorrt-rtx" and module is not None
        else "not checked: full TensorRT has no header check"
        if engine.backend == "tensorrt"
        else "not checked: no TensorRT-RTX runtime installed here"
    )
    return {"preflight": result}


def _validity(trt, path: Path) -> str:
    """TensorRT-RTX's header check of the engine, interpreted honestly where there is no GPU."""

    class Quiet(trt.ILogger):  # without a GPU the runtime logs a fatal-looking line we interpret below
        def log(self, severity, msg) -> None:  # noqa: ANN001
            pass

    runtime = trt.Runtime(Quiet())
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        validity, diagnostics = runtime.get_engine_validity(data)
    names = [name for name, flag in trt.EngineInvalidityDiagnostics.__members__.items() if int(diagnostics) & int(flag)]
    shown = f"{validity.name} ({', '.join(names) or 'no diagnostic'})"
    if validity.name in ("VALID", "SUBOPTIMAL"):
        return f"passed: get_engine_validity {shown}"
    reasons = [name for name in names if name != "CUDA_ERROR"]
    gpus = query_compute_capabilities()
    if any(name in HEADER_FACTS for name in names) or (gpus and reasons):
        raise PreflightRefused(
            f"{path}: preflight: TensorRT-RTX's get_engine_validity says {shown}; `current` left as it was"
        )
    if not gpus:
        return f"not checked: no GPU here, and get_engine_validity needs one (it answered {shown})"
    return f"not checked: the runtime could not query the GPU (it answered {shown})"


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, None when there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[0] if done.returncode == 0 and lines else None
